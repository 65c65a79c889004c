"""benchmarks/headlines.sh recomputes the README's math and code headlines with `make demo`'s and `make code-demo`'s own
held-out evaluation (task, options, decoding) and, for math, the demo report's capability options; a copy that drifts
would make the headline and the demo measure different things ("one make demo is one draw from this spread").
Both are read as commands: the script with a grpolab stand-in that prints its arguments (nothing trains), the
Makefile by `make -n`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def commands(text: str) -> list[list[str]]:
    """Shell command lines (backslash continuations joined), split into words."""
    return [shlex.split(line) for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def grpolab_args(lines: list[list[str]], sub: str) -> list[str]:
    """The words after `grpolab SUB` of the one such command (for eval: the one writing eval/base_vs_trained.json,
    the held-out comparison; code-demo also evaluates HumanEval)."""
    found = [c[2:] for c in lines if len(c) > 1 and c[0].endswith("grpolab") and c[1] == sub]
    if sub == "eval":
        found = [c for c in found if c[-1].endswith("eval/base_vs_trained.json")]
    assert len(found) == 1, (sub, lines)
    return found[0]


def options(words: list[str], drop: tuple[str, ...]) -> list[tuple[str, str]]:
    """(--option, value) pairs in order; positional words (model, run) and the DROP options left out."""
    pairs, i = [], 0
    while i < len(words):
        if words[i].startswith("--"):
            if words[i] not in drop:
                pairs.append((words[i], words[i + 1]))
            i += 2
        else:
            i += 1
    return pairs


def script_lines(what: str, tmp_path: Path) -> list[list[str]]:
    """headlines.sh WHAT "0" with a grpolab that prints `grpolab ARGS...` and does nothing else."""
    stand_in = tmp_path / "grpolab"
    stand_in.write_text(f"#!{sys.executable}\nimport shlex, sys\nprint(shlex.join(['grpolab', *sys.argv[1:]]))\n")
    stand_in.chmod(0o755)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "GRPOLAB": str(stand_in), "RUNS": str(runs)}
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "headlines.sh"), what, "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return commands(out.stdout)


def make_lines(target: str) -> list[list[str]]:
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return commands(out.stdout)


@pytest.mark.parametrize("what, target", [("math", "demo"), ("code", "code-demo")])
def test_headline_evaluates_as_its_demo(what, target, tmp_path):
    ours, demo = script_lines(what, tmp_path), make_lines(target)
    ours_eval, demo_eval = (
        options(grpolab_args(ours, "eval"), ("--out",)),
        options(grpolab_args(demo, "eval"), ("--out",)),
    )
    assert ours_eval == demo_eval and ("--split", "test") in ours_eval
    train = grpolab_args(ours, "train")
    assert train[0] == grpolab_args(demo, "train")[0] and ("--set", "train.seed=0") in options(train, ())


def test_math_headline_reports_as_make_demo(tmp_path):
    keep = (
        "--capability-task",
        "--capability-n",
        "--capability-option",
        "--capability-max-new-tokens",
        "--diversity-n",
    )
    ours = [p for p in options(grpolab_args(script_lines("math", tmp_path), "report"), ()) if p[0] in keep]
    demo = [p for p in options(grpolab_args(make_lines("demo"), "report"), ()) if p[0] in keep]
    assert ours == demo and ("--capability-task", "arithmetic") in ours
