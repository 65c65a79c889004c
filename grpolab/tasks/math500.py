"""MATH-500: 500 competition problems (a held-out subset of MATH), test split only.

Rules:
- With `path`, rows are read from f"{path}/test.jsonl" (or from `path` itself when it ends in
  ".jsonl"); without it, from datasets.load_dataset(hub_id, split="test") (imported lazily).
- Each row needs "problem", "answer", "level" and "unique_id" ("subject" is optional); a row
  without them raises DataError naming the file and line (the set is curated: no skipping).
- uid = "math500/" + unique_id; slice = f"level={level}"; answer is the LaTeX answer string.
- Asking for split "train" raises ConfigError: MATH-500 is evaluation data only.
"""

from __future__ import annotations

from pathlib import Path

from grpolab.errors import ConfigError
from grpolab.tasks.base import Problem
from grpolab.tasks.jsonl import check_split, load_hub_rows, read_jsonl, require_field


class Math500Task:
    """MATH-500 from a local test.jsonl or from the Hugging Face hub."""

    name = "math500"

    def __init__(self, path: str | None = None, hub_id: str = "HuggingFaceH4/MATH-500") -> None:
        for field, value in (("path", path), ("hub_id", hub_id)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"task.options.{field}: expected a non-empty string or null, got {value!r}")
        self.path = path
        self.hub_id = hub_id

    def problems(self, split: str) -> list[Problem]:
        """All 500 problems, in source order; only split "test" exists."""
        if split == "train":
            raise ConfigError("split: math500 has only a 'test' split (it is evaluation data); train on another task")
        check_split(split, ("test",))
        source, rows = self._rows()
        return [self._problem(f"{source}:{lineno}", row) for lineno, row in rows]

    def _rows(self) -> tuple[str, list[tuple[int, dict]]]:
        if self.path is None:
            return f"{self.hub_id} test row", load_hub_rows(self.hub_id, "test")
        file = Path(self.path)
        if file.suffix != ".jsonl":
            file = file / "test.jsonl"
        expected = "a MATH-500 JSONL file with 'problem', 'answer', 'level' and 'unique_id' fields (task.options.path)"
        return str(file), read_jsonl(file, expected)

    @staticmethod
    def _problem(where: str, row: dict) -> Problem:
        return Problem(
            uid="math500/" + require_field(row, "unique_id", where),
            question=require_field(row, "problem", where),
            answer=require_field(row, "answer", where),
            slice=f"level={require_field(row, 'level', where)}",
        )
