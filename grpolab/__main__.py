"""`python -m grpolab ...` is the `grpolab` command (what `torchrun -m grpolab` and subprocesses use)."""

from .cli import main

main()
