"""MBPP (Mostly Basic Python Problems, Austin et al. 2021): 974 problems with three assert tests each.

Rules:
- With `path`, rows are read from f"{path}/mbpp.jsonl" (fields task_id, text, code, test_setup_code,
  test_list, challenge_test_list); without it, from the hub dataset `hub_id` (config "full", splits train /
  test / validation / prompt), imported lazily.
- The standard split by task_id: 1-10 "prompt" (few-shot examples), 11-510 "test", 511-600 "validation",
  601-974 "train".
- The prompt shows the problem text and the first `show_tests` asserts (they name the function and its call
  form); the reward runs every assert of `test_list` (plus `challenge_test_list` with challenge=true), so
  the asserts past the first `show_tests` are hidden tests. `test_setup_code` runs in the test judge first.
- uid = f"mbpp/{task_id}"; answer = the reference solution; slice = "all". Where ids come from outside
  (`grpolab score`), MBPP's integer task_id (the data set, the bigcode evaluation harness) and evalplus's
  "Mbpp/{task_id}" are taken as well (``mbpp_uid``).
- A row without text, code or a non-empty list of string asserts raises DataError naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import Problem
from grpolab.tasks.code import code_problem
from grpolab.tasks.jsonl import check_split, load_hub_rows, read_jsonl

SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


def mbpp_uid(task_id: object) -> str | None:
    """The uid of an MBPP problem id as completion files carry it: the integer task_id, "Mbpp/n" (evalplus),
    "mbpp/n" (grpolab; any case) or "n"; None for anything else.

    >>> mbpp_uid(601), mbpp_uid("Mbpp/601"), mbpp_uid("mbpp/601"), mbpp_uid(True)
    ('mbpp/601', 'mbpp/601', 'mbpp/601', None)
    """
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        return f"mbpp/{task_id}"
    match = re.fullmatch(r"(?:mbpp/)?(\d+)", task_id.strip(), re.IGNORECASE) if isinstance(task_id, str) else None
    return f"mbpp/{int(match[1])}" if match else None


def _check_optional_str(field: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"task.options.{field}: expected a non-empty string or null, got {value!r}")


def _str_list(row: dict, field: str, where: str, allow_empty: bool = False) -> list[str]:
    value = row.get(field, [] if allow_empty else None)
    if (
        not isinstance(value, list)
        or (not value and not allow_empty)
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise DataError(
            f"{where}: field {field!r} must be a {'' if allow_empty else 'non-empty '}list of assert statements"
        )
    return [v.strip() for v in value]


def mbpp_problem(row: dict, where: str, show_tests: int = 1, challenge: bool = False) -> Problem:
    """The Problem of one MBPP row (rules in the module docstring)."""
    task_id = row.get("task_id")
    text, code = row.get("text"), row.get("code")
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise DataError(f"{where}: field 'task_id' must be an integer, got {task_id!r}")
    if not isinstance(text, str) or not text.strip() or not isinstance(code, str) or not code.strip():
        raise DataError(f"{where}: fields 'text' and 'code' must be non-empty strings")
    tests = _str_list(row, "test_list", where)
    if challenge:
        tests += _str_list(row, "challenge_test_list", where, allow_empty=True)
    setup = row.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise DataError(f"{where}: field 'test_setup_code' must be a string")
    shown = tests[:show_tests]
    noun = "this test" if len(shown) == 1 else "these tests"
    question = text.strip() + (f"\nYour code should pass {noun}:\n" + "\n".join(shown) if shown else "")
    return code_problem(
        f"mbpp/{task_id}", question, code.replace("\r\n", "\n"), tests, shown=shown, setup=setup.replace("\r\n", "\n")
    )


class MBPPTask:
    """MBPP from a local mbpp.jsonl or the hub; options: show_tests (asserts shown in the prompt, 0-3), challenge
    (also run the challenge tests, where a problem has them)."""

    name = "mbpp"
    id_forms = "601 (MBPP's task_id), 'Mbpp/601' (evalplus) or 'mbpp/601'"
    uid_of = staticmethod(mbpp_uid)

    def __init__(
        self,
        path: str | None = None,
        hub_id: str = "google-research-datasets/mbpp",
        show_tests: int = 1,
        challenge: bool = False,
    ) -> None:
        _check_optional_str("path", path)
        _check_optional_str("hub_id", hub_id)
        if isinstance(show_tests, bool) or not isinstance(show_tests, int) or not 0 <= show_tests <= 3:
            raise ConfigError(f"task.options.show_tests: expected an integer in 0..3, got {show_tests!r}")
        if not isinstance(challenge, bool):
            raise ConfigError(f"task.options.challenge: expected true or false, got {challenge!r}")
        self.path, self.hub_id, self.show_tests, self.challenge = path, hub_id, show_tests, challenge

    def problems(self, split: str) -> list[Problem]:
        """The problems of `split` (train, test, validation, prompt), in task_id order."""
        check_split(split, tuple(SPLITS))
        lo, hi = SPLITS[split]
        out = []
        for where, row in self._rows(split):
            problem = mbpp_problem(row, where, self.show_tests, self.challenge)
            if lo <= row["task_id"] <= hi:
                out.append(problem)
        if not out:
            raise DataError(f"{self.path or self.hub_id}: no MBPP problems with task_id {lo}-{hi} (split {split!r})")
        return sorted(out, key=lambda p: int(p.uid.split("/")[1]))

    def _rows(self, split: str) -> list[tuple[str, dict]]:
        if self.path is not None:
            file = Path(self.path) / "mbpp.jsonl"
            rows = read_jsonl(file, "MBPP's mbpp.jsonl (task.options.path is the directory holding it)")
            return [(f"{file}:{lineno}", row) for lineno, row in rows]
        return [(f"{self.hub_id} ({split}) row {n}", row) for n, row in load_hub_rows(self.hub_id, split, "full")]
