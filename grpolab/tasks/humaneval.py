"""HumanEval (Chen et al. 2021): 164 hand-written Python functions, each scored by its own ``check(candidate)``.

Rules:
- With `path`, rows are read from f"{path}/HumanEval.jsonl" (fields task_id, prompt, canonical_solution, test,
  entry_point); without it, from the hub dataset `hub_id` (split "test"), imported lazily. There is only a test
  split: HumanEval is for held-out evaluation.
- The prompt shows the function's signature and docstring in a code block and asks for the complete function.
- The program is the dataset's prompt (its imports and helper functions) followed by the completion's code, so a
  completion that rewrites only the function still has what the prompt defined. The test judge runs the
  prompt and the dataset's ``test`` itself (trusted: the helpers a test calls are the dataset's, not the
  program's), binds the entry point's name to the program's function (some tests call it by name) and calls
  ``check`` on it: one test case, all or nothing.
- uid = f"humaneval/{n}" for task_id "HumanEval/n"; answer = prompt + canonical_solution; slice = "all". Where
  ids come from outside (`grpolab score`), the data set's own "HumanEval/n" -- what evalplus and the bigcode
  evaluation harness write -- is taken as well (``humaneval_uid``).
- A row missing a field raises DataError naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import Problem
from grpolab.tasks.code import code_problem
from grpolab.tasks.jsonl import load_hub_rows, read_jsonl

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def humaneval_uid(task_id: object) -> str | None:
    """The uid of a HumanEval problem id as completion files carry it: the data set's "HumanEval/n" or grpolab's
    "humaneval/n" (any case); None for anything else.

    >>> humaneval_uid("HumanEval/7"), humaneval_uid("humaneval/7"), humaneval_uid(7)
    ('humaneval/7', 'humaneval/7', None)
    """
    match = re.fullmatch(r"humaneval/(\d+)", task_id.strip(), re.IGNORECASE) if isinstance(task_id, str) else None
    return f"humaneval/{match[1]}" if match else None


def humaneval_problem(row: dict, where: str) -> Problem:
    """The Problem of one HumanEval row (rules in the module docstring)."""
    missing = [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
    if missing:
        raise DataError(f"{where}: missing or empty field {missing[0]!r}")
    entry, prompt = row["entry_point"].strip(), row["prompt"]
    if not entry.isidentifier():
        raise DataError(f"{where}: field 'entry_point' is not a Python name: {entry!r}")
    number = row["task_id"].rsplit("/", 1)[-1]
    question = f"Complete this Python function:\n```python\n{prompt.rstrip()}\n```"
    return code_problem(
        f"humaneval/{number}",
        question,
        prompt + row["canonical_solution"],
        [f"check(__solution__({entry!r}))"],
        setup=f"{prompt}\n\n{entry} = __solution__({entry!r})\n\n{row['test']}",
        prefix=prompt,
        entry_point=entry,
    )


class HumanEvalTask:
    """HumanEval from a local HumanEval.jsonl or the hub (test split only)."""

    name = "humaneval"
    id_forms = "'HumanEval/0' (the data set's task_id) or 'humaneval/0'"
    uid_of = staticmethod(humaneval_uid)

    def __init__(self, path: str | None = None, hub_id: str = "openai/openai_humaneval") -> None:
        for field, value in (("path", path), ("hub_id", hub_id)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"task.options.{field}: expected a non-empty string or null, got {value!r}")
        self.path, self.hub_id = path, hub_id

    def problems(self, split: str) -> list[Problem]:
        if split != "test":
            raise ConfigError(
                f"split: HumanEval has only a 'test' split (it is for held-out evaluation), got {split!r}"
            )
        if self.path is not None:
            file = Path(self.path) / "HumanEval.jsonl"
            rows = [
                (f"{file}:{n}", row)
                for n, row in read_jsonl(file, "HumanEval.jsonl (task.options.path is the directory holding it)")
            ]
        else:
            rows = [(f"{self.hub_id} row {n}", row) for n, row in load_hub_rows(self.hub_id, "test")]
        if not rows:
            raise DataError(f"{self.path or self.hub_id}: no HumanEval rows")
        return [humaneval_problem(row, where) for where, row in rows]
