"""GSM8K grade-school math word problems.

Rules:
- With `path`, split S is read from f"{path}/{S}.jsonl" (rows with "question" and "answer");
  without it, from datasets.load_dataset(hub_id, "main", split=S) (imported lazily).
- Gold answer = the text after the last "####" in "answer", stripped, thousands commas removed.
- uid = f"gsm8k/{split}/{row_index}" (0-based row index in the source, bad rows included, so
  uids stay stable); slice = "all".
- A row with no usable gold (missing/empty "question" or "answer", no "####", nothing after it)
  is skipped and counted. If skipped/total > max_bad_fraction, DataError reports the count and
  the first bad line numbers; otherwise the count of the last problems() call is kept in
  `self.last_skipped`.
"""

from __future__ import annotations

from pathlib import Path

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import Problem
from grpolab.tasks.jsonl import check_split, load_hub_rows, read_jsonl

MARKER = "####"


def gold_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution, or None when it has none.

    >>> gold_answer("Janet sells 9 eggs.\\n#### 1,018")
    '1018'
    >>> gold_answer("no marker") is None
    True
    """
    if MARKER not in solution:
        return None
    gold = solution.rsplit(MARKER, 1)[1].strip().replace(",", "")
    return gold or None


def _check_optional_str(field: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"task.options.{field}: expected a non-empty string or null, got {value!r}")


class GSM8KTask:
    """GSM8K from a local directory of train.jsonl/test.jsonl or from the Hugging Face hub.

    Attribute `last_skipped`: how many rows the last problems() call skipped for lacking a
    usable gold answer (0 before any call).
    """

    name = "gsm8k"

    def __init__(self, path: str | None = None, hub_id: str = "openai/gsm8k", max_bad_fraction: float = 0.05) -> None:
        _check_optional_str("path", path)
        _check_optional_str("hub_id", hub_id)
        ok = isinstance(max_bad_fraction, (int, float)) and not isinstance(max_bad_fraction, bool)
        if not ok or not 0 <= max_bad_fraction <= 1:
            raise ConfigError(
                f"task.options.max_bad_fraction: expected a number between 0 and 1, got {max_bad_fraction!r}"
            )
        self.path = path
        self.hub_id = hub_id
        self.max_bad_fraction = float(max_bad_fraction)
        self.last_skipped = 0

    def problems(self, split: str) -> list[Problem]:
        """The usable problems of `split`, in source order."""
        check_split(split)
        source, rows = self._rows(split)
        problems: list[Problem] = []
        bad_lines: list[int] = []
        for index, (lineno, row) in enumerate(rows):
            problem = self._problem(split, index, row)
            if problem is None:
                bad_lines.append(lineno)
            else:
                problems.append(problem)
        self._check_bad_share(source, len(rows), bad_lines)
        self.last_skipped = len(bad_lines)
        return problems

    def _rows(self, split: str) -> tuple[str, list[tuple[int, dict]]]:
        """(source description, [(line number, row), ...]) for the split."""
        if self.path is not None:
            file = Path(self.path) / f"{split}.jsonl"
            expected = "a GSM8K JSONL file with 'question' and 'answer' fields (task.options.path is a directory holding train.jsonl and test.jsonl)"
            return str(file), read_jsonl(file, expected)
        return f"{self.hub_id} ({split})", load_hub_rows(self.hub_id, split, "main")

    @staticmethod
    def _problem(split: str, index: int, row: dict) -> Problem | None:
        question, solution = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not question.strip() or not isinstance(solution, str):
            return None
        gold = gold_answer(solution)
        if gold is None:
            return None
        return Problem(uid=f"gsm8k/{split}/{index}", question=question.strip(), answer=gold, slice="all")

    def _check_bad_share(self, source: str, total: int, bad_lines: list[int]) -> None:
        if total == 0:
            raise DataError(f"{source}: no rows; expected GSM8K rows with 'question' and 'answer'")
        if len(bad_lines) / total > self.max_bad_fraction:
            first = ", ".join(str(n) for n in bad_lines[:5])
            raise DataError(
                f"{source}: {len(bad_lines)} of {total} rows have no usable gold answer "
                f"(missing 'question'/'answer' or no text after '{MARKER}'), more than "
                f"task.options.max_bad_fraction={self.max_bad_fraction}; first bad lines: {first}"
            )
