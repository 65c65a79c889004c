"""Release and serving: the release bundle of a run (bundle.py), the serving and rollback checks that load it in a
separate process with plain transformers (check.py over serve_hf.py, a standalone script that imports no grpolab
code), the second serving stack -- the bundle converted to a GGUF file (gguf.py) and served by llama.cpp
(serve_gguf.py, standalone too) -- the measures comparing two stacks (compare.py) and the rollback target's check (rollback.py).

May import: evaluation, rollout, models, manifest, tasks. Imported by: the CLI. The report reads the JSON the
checks write (RUN/release/*.json) and does not import this package.
"""
