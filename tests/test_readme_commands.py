"""The README's quick-tour eval evaluates the quickstart's own held-out set (the task options, split and length of
`make demo`), and its Python API snippet writes the evaluation where the release report reads it (out= under
RUN/eval), so the snippet's verdict is established."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def eval_args(text: str, variables: dict[str, str]) -> list[str]:
    """The arguments after `grpolab eval` of the first `grpolab eval bundled:...` command in text (continuation
    lines joined, a trailing comment dropped, $(NAME) make variables replaced by `variables`)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    line = next(x for x in joined.splitlines() if "grpolab eval bundled:" in x).split("  #")[0]
    line = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], line[line.index("grpolab eval") :])
    return shlex.split(line)[2:]


def options(args: list[str]) -> dict[str, str]:
    """{--task-option KEY: VALUE, --other: VALUE} of an argument list (the models left out)."""
    out, i = {}, 0
    while i < len(args):
        if args[i] == "--task-option":
            key, value = args[i + 1].split("=", 1)
            out[key] = value
            i += 2
        elif args[i].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            i += 1
    return out


def test_quick_tour_eval_matches_the_demo():
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= (.*)$", makefile, re.M)) | {"VENV": ".venv", "DEMO_RUN": "runs/demo"}
    demo_eval = options(eval_args(makefile[makefile.index("\ndemo:") :], variables))
    readme = (ROOT / "README.md").read_text()
    tour_eval = options(eval_args(readme[readme.index("## A quick tour") :], {}))
    for key in (
        "max_operand",
        "operators",
        "terms",
        "test_fraction",
        "num_test",
        "--task",
        "--split",
        "--max-new-tokens",
    ):
        assert tour_eval.get(key) == demo_eval.get(key), (key, tour_eval, demo_eval)


def test_python_api_snippet_writes_the_evaluation_the_report_reads():
    readme = (ROOT / "README.md").read_text()
    snippet = readme[readme.index("## Python API") :]
    snippet = snippet[snippet.index("```python") : snippet.index("```", snippet.index("```python") + 3)]
    call = snippet[snippet.index("grpolab.evaluate_models(") : snippet.index("grpolab.release_report(")]
    assert re.search(r"out=run\.run_dir / \"eval\" / \"\w+\.json\"", call), call
    assert "max_new_tokens=cfg.rollout.max_new_tokens" in call, call
