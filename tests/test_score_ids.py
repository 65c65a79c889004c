"""`grpolab score` takes the problem ids completion files carry: HumanEval's own "HumanEval/0" (evalplus, the
bigcode evaluation harness) as well as grpolab's "humaneval/0"; MBPP's integer task_id, evalplus's "Mbpp/11" and
grpolab's "mbpp/11" -- in an `id`, `uid` or `task_id` field. An unknown id is still one error naming the file, the
line and what the task's ids look like."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from grpolab.cli import app
from grpolab.tasks.humaneval import humaneval_uid
from grpolab.tasks.mbpp import mbpp_uid

SANDBOX = ["--sandbox-option", "uid=61320", "--sandbox-option", "workers=2"]
HUMANEVAL = [
    {
        "task_id": f"HumanEval/{n}",
        "prompt": f'def f{n}(x):\n    """x + {n}"""\n',
        "canonical_solution": f"    return x + {n}\n",
        "entry_point": f"f{n}",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + n}\n",
    }
    for n in range(2)
]
MBPP = {
    "task_id": 11,
    "text": "Write a function add(a, b) that adds two numbers.",
    "code": "def add(a, b):\n    return a + b",
    "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def score(tmp_path, task: str, rows: list[dict]):
    """`grpolab score` of `rows` on the task's local file in tmp_path (the one MBPP row is of the test split)."""
    src = tmp_path / "completions.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scored.json"
    res = CliRunner().invoke(
        app,
        [
            "score",
            str(src),
            "--task",
            task,
            "--task-option",
            f"path={tmp_path}",
            "--split",
            "test",
            "--json-out",
            str(out),
            *SANDBOX,
        ],
        catch_exceptions=True,
    )
    return res, (json.loads(out.read_text()) if res.exit_code == 0 else None)


def test_the_id_forms_map_to_the_uids():
    assert [humaneval_uid(i) for i in ("HumanEval/0", "humaneval/163", " HumanEval/7 ")] == [
        "humaneval/0",
        "humaneval/163",
        "humaneval/7",
    ]
    assert [humaneval_uid(i) for i in ("HumanEval/", "Mbpp/3", 0, None)] == [None] * 4
    assert [mbpp_uid(i) for i in (11, "Mbpp/11", "mbpp/11", "11")] == ["mbpp/11"] * 4
    assert [mbpp_uid(i) for i in (True, 11.0, "HumanEval/11", "mbpp/x")] == [None] * 4


def test_humaneval_takes_the_data_sets_ids_and_grpolabs(tmp_path):
    (tmp_path / "HumanEval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    rows = [
        {"task_id": "HumanEval/0", "completion": "```python\ndef f0(x):\n    return x + 0\n```"},
        {"id": "humaneval/1", "completion": "```python\ndef f1(x):\n    return x + 1\n```"},
        {"id": "HumanEval/1", "completion": "```python\ndef f1(x):\n    return x\n```"},
    ]
    res, data = score(tmp_path, "humaneval", rows)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert [r["id"] for r in data["rows"]] == ["HumanEval/0", "humaneval/1", "HumanEval/1"]  # as the file gave them
    assert [r["reward"] for r in data["rows"]] == [1.0, 1.0, 0.0]


def test_mbpp_takes_integer_task_ids_and_evalplus_ids(tmp_path):
    (tmp_path / "mbpp.jsonl").write_text(json.dumps(MBPP) + "\n")
    good, bad = "```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return 3\n```"
    rows = [
        {"task_id": 11, "completion": good},
        {"id": "Mbpp/11", "completion": bad},
        {"id": "mbpp/11", "completion": good},
    ]
    res, data = score(tmp_path, "mbpp", rows)
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert [r["id"] for r in data["rows"]] == [11, "Mbpp/11", "mbpp/11"]
    assert [r["reward"] for r in data["rows"]] == [1.0, 0.5, 1.0]  # pass_fraction: 'return 3' fails add(2, 2) == 4


@pytest.mark.parametrize(
    "task, row, said",
    [
        (
            "humaneval",
            {"id": "HumanEval/99", "completion": "x"},
            "unknown problem id 'HumanEval/99' for task 'humaneval' "
            "(ids look like 'HumanEval/0' (the data set's task_id)",
        ),
        (
            "mbpp",
            {"task_id": 999, "completion": "x"},
            "unknown problem id 999 for task 'mbpp' (ids look like 601 (MBPP's "
            "task_id), 'Mbpp/601' (evalplus) or 'mbpp/601')",
        ),
        (
            "mbpp",
            {"id": 11.5, "completion": "x"},
            "expected the problem id in a field 'id', 'uid' or 'task_id' (a string or "
            "an integer; ids look like 601 (MBPP's task_id)",
        ),
    ],
)
def test_a_bad_id_names_the_row_and_the_id_forms(tmp_path, task, row, said):
    (tmp_path / "HumanEval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    (tmp_path / "mbpp.jsonl").write_text(json.dumps(MBPP) + "\n")
    res, _ = score(tmp_path, task, [{"id": "humaneval/0" if task == "humaneval" else 11, "completion": "x"}, row])
    assert res.exit_code != 0
    assert f"completions.jsonl:2: {said}" in str(res.exception), str(res.exception)
