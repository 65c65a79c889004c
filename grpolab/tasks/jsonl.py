"""Row sources shared by the data tasks (JSONL files, hub datasets), and a generic task for user JSONL files.

Rules for read_jsonl:
- One JSON object per line; blank lines are ignored; line numbers are 1-based.
- A missing file, a line that is not valid JSON, or a line that is not a JSON object raises
  DataError naming the file (and the line number).
"""

from __future__ import annotations

import json
from pathlib import Path

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import Problem

SPLITS = ("train", "test")


def check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> str:
    """Return `split` if it is one of `allowed`, else raise ConfigError."""
    if split not in allowed:
        expected = " or ".join(repr(s) for s in allowed)
        raise ConfigError(f"split: expected {expected}, got {split!r}")
    return split


def read_jsonl(path: str | Path, expected: str = "a JSONL file (one JSON object per line)") -> list[tuple[int, dict]]:
    """Read `path` into [(line_number, row), ...]; `expected` describes the file in the missing-file error."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected {expected}")
    rows: list[tuple[int, dict]] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append((lineno, row))
    return rows


def load_hub_rows(hub_id: str, split: str, config: str | None = None) -> list[tuple[int, dict]]:
    """Rows of a hub dataset as [(row number, row), ...] (1-based, like file line numbers)."""
    try:
        import datasets
    except ImportError as exc:
        raise DataError(
            f"{hub_id}: loading from the hub needs the 'datasets' package ({exc}); or set task.options.path"
        ) from None
    try:
        dataset = (
            datasets.load_dataset(hub_id, config, split=split) if config else datasets.load_dataset(hub_id, split=split)
        )
    except Exception as exc:  # network, missing dataset or split: report it as a data problem
        raise DataError(
            f"{hub_id}: could not load split {split!r} from the hub ({exc}); or set task.options.path to a local copy"
        ) from None
    return [(number, dict(row)) for number, row in enumerate(dataset, start=1)]


def require_field(row: dict, field: str, where: str) -> str:
    """row[field] as a stripped non-empty string (numbers are converted), else DataError naming `where`."""
    value = row.get(field)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: missing or empty field {field!r}")
    return value.strip()


class JsonlTask:
    """Problems from a user JSONL file.

    path: one .jsonl file, served for every split; if it contains "{split}" (e.g.
    "data/{split}.jsonl") it is formatted with the split name instead. Every row needs
    `question_field` and `answer_field` (and `slice_field` when given); a row without them
    raises DataError naming the file and line. uid = f"jsonl/{file stem}/{row index}",
    slice = str(row[slice_field]) or "all".
    """

    name = "jsonl"

    def __init__(
        self,
        path: str,
        question_field: str = "question",
        answer_field: str = "answer",
        slice_field: str | None = None,
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"task.options.path: expected a path to a .jsonl file, got {path!r}")
        for field, value in (("question_field", question_field), ("answer_field", answer_field)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"task.options.{field}: expected a non-empty string, got {value!r}")
        if slice_field is not None and (not isinstance(slice_field, str) or not slice_field):
            raise ConfigError(f"task.options.slice_field: expected a non-empty string or null, got {slice_field!r}")
        self.path = path
        self.question_field = question_field
        self.answer_field = answer_field
        self.slice_field = slice_field

    def problems(self, split: str) -> list[Problem]:
        """All rows of the split's file, in file order."""
        file = Path(self.path.replace("{split}", check_split(split)))
        expected = f"a JSONL file with {self.question_field!r} and {self.answer_field!r} fields (task.options.path)"
        return [
            self._problem(file, index, lineno, row) for index, (lineno, row) in enumerate(read_jsonl(file, expected))
        ]

    def _problem(self, file: Path, index: int, lineno: int, row: dict) -> Problem:
        where = f"{file}:{lineno}"
        label = require_field(row, self.slice_field, where) if self.slice_field else "all"
        return Problem(
            uid=f"jsonl/{file.stem}/{index}",
            question=require_field(row, self.question_field, where),
            answer=require_field(row, self.answer_field, where),
            slice=label,
        )
