"""Problems from any data set the `datasets` library reads: a hub id, a local directory or a data file.

    task: {name: hf, options: {path: openai/gsm8k, config_name: main, prompt_field: question, answer_field: answer,
                               answer_marker: "####"}}

Rules:
- Loading: a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` is read with
  ``datasets.load_from_disk``; a local .json / .jsonl / .csv / .parquet file with the matching packaged builder; any
  other local directory or a hub id with ``datasets.load_dataset(path, config_name)`` (``config_name``: the data
  set's configuration, e.g. "main"; not ``name``, which is the task's own). A hub id needs network access (or a
  copy in the local datasets cache); without it the error is one line naming the data set and saying so. A single
  ``Dataset`` (no splits) counts as the train split.
- Splits: ``train_split`` (default "train") must exist. ``test_split`` None (the default) means the split "test"
  when it exists, else a held-out fraction of the train split; a ``test_split`` that is named must exist. The
  held-out fraction: the distinct normalised questions of the train split (grpolab.tasks.base.normalise_problem_text)
  ordered by sha256(f"{split_seed}:{question}"), the first ceil(test_fraction * count) of them held out -- every
  row with such a question is a test row, every other row a train row, so the two never share a question.
- Held-out integrity: test rows whose normalised question also occurs anywhere in the train split (a real test
  split may repeat training questions) are dropped and counted in ``source["held_out_overlap_removed"]``.
- Fields: ``prompt_field`` (default "question") and ``answer_field`` (default "answer"), or ``messages_field``: a
  chat-format list of {role, content}, whose last "user" message is the question and whose gold answer is
  ``answer_field`` when that is given, else the content of the last "assistant" message after that user message
  (earlier turns and system messages are not part of the problem: a Problem is one question). ``answer_marker``
  (e.g. "####"): the gold is the text after its last occurrence (thousands commas removed). ``slice_field``: the
  slice label (default "all"). A field that does not exist is a ConfigError naming it and listing the fields
  there, raised when the task is built (before any model is loaded).
- Rows whose question or gold is missing or empty are skipped and counted (``last_skipped``); a split with more than
  ``max_bad_fraction`` of them, or with none usable, is a DataError naming the data set and the first bad rows.
- ``num_train`` / ``num_test`` (0 = all) keep the first rows of each split, in source order.
- uid = f"hf/{label}/{source split}/{row index}" (label: the data set's last path component); ``instruction``
  replaces the answer-format instruction appended to every question (None = the default, "" = none).
- ``source`` (recorded in the run manifest): path, config name, the split each side came from, the
  ``Dataset._fingerprint`` of every split used and their combined ``fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import PROMPT_INSTRUCTION, Problem, normalise_problem_text
from grpolab.tasks.jsonl import check_split

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _identity(question: str) -> str:
    """The normalised question (grpolab.tasks.base.normalise_problem_text)."""
    return normalise_problem_text(question)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def _check_str(field: str, value: Any, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"task.options.{field}: expected a non-empty string{' or null' if optional else ''}, got {value!r}"
        )


def _hub_unreachable() -> str | None:
    """Why the hub cannot be asked right now (no route to its host within 3 s), else None (also in offline mode,
    where ``datasets`` answers from its local cache, and behind a proxy, where the check is left to ``datasets``).

    Checked before asking ``datasets`` for a hub id, so a machine without network gets one line at once instead of
    minutes of retries."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as exc:
        return f"{host} is unreachable: {exc}; with a copy in the local cache set HF_DATASETS_OFFLINE=1"
    return None


def load_any(path: str, name: str | None = None) -> Any:
    """A ``Dataset`` or ``DatasetDict`` from a save_to_disk directory, a data file, a local directory or a hub id;
    any failure is one line naming `path`."""
    try:
        import datasets
    except ImportError as exc:  # a declared dependency; only a broken install gets here
        raise DataError(f"task.options.path {path}: reading data sets needs the 'datasets' package ({exc})") from None
    local = Path(path).expanduser()
    try:
        if local.is_dir() and ((local / "dataset_dict.json").is_file() or (local / "state.json").is_file()):
            return datasets.load_from_disk(str(local))
        if local.is_file():
            builder = FILE_BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise DataError(f"task.options.path {path}: expected a {', '.join(FILE_BUILDERS)} file or a directory")
            return datasets.load_dataset(builder, data_files=str(local))
        if local.exists() or path.startswith((".", "/", "~")) or path.count("/") > 1:
            if not local.exists():
                raise DataError(f"task.options.path {path}: no such file or directory")
            return datasets.load_dataset(str(local), name)
    except DataError:
        raise
    except Exception as exc:  # the library's own errors: unreadable files, bad configs
        raise DataError(f"task.options.path {path}: could not read the data set ({_first_line(exc)})") from None
    return _load_hub(datasets, path, name)


def _load_hub(datasets: Any, path: str, name: str | None) -> Any:
    need = (
        f"task.options.path {path}: not a local path, so it is read from the Hugging Face hub, which needs network access; "
        "give a local path instead (a directory written by save_to_disk, or a data file)"
    )
    why = _hub_unreachable()
    if why:
        raise DataError(f"{need} ({why})")
    try:
        return datasets.load_dataset(path, name)
    except Exception as exc:  # offline without a cached copy, unknown id, missing config
        raise DataError(f"{need} ({_first_line(exc)})") from None


def _gold_after(text: str, marker: str | None) -> str | None:
    """The gold answer in `text`: all of it, or with a marker the text after its last occurrence.

    >>> _gold_after("so 1,018 eggs\\n#### 1,018", "####"), _gold_after("42", None), _gold_after("x", "####")
    ('1018', '42', None)
    """
    if marker is None:
        return text.strip() or None
    if marker not in text:
        return None
    return text.rsplit(marker, 1)[1].strip().replace(",", "") or None


def _text(value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return value.strip() if isinstance(value, str) and value.strip() else None


def chat_question_answer(messages: Any) -> tuple[str | None, str | None]:
    """(content of the last user message, content of the last assistant message after it) of a chat-format list.

    >>> chat_question_answer([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
    ...                       {"role": "assistant", "content": "4"}])
    ('2+2?', '4')
    """
    if not isinstance(messages, list):
        return None, None
    question, answer = None, None
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "user":
            question, answer = _text(message.get("content")), None
        elif message.get("role") == "assistant" and question is not None:
            answer = _text(message.get("content"))
    return question, answer


class HFTask:
    """Problems from a `datasets` data set (see the module docstring for every rule).

    ``dataset``: an in-memory ``Dataset`` / ``DatasetDict`` instead of ``path`` (grpolab.train(problems=...)).
    """

    name = "hf"

    def __init__(
        self,
        path: str | None = None,
        config_name: str | None = None,
        prompt_field: str = "question",
        answer_field: str | None = None,
        messages_field: str | None = None,
        slice_field: str | None = None,
        answer_marker: str | None = None,
        train_split: str = "train",
        test_split: str | None = None,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        num_train: int = 0,
        num_test: int = 0,
        max_bad_fraction: float = 0.05,
        instruction: str | None = None,
        dataset: Any = None,
    ) -> None:
        if dataset is None:
            _check_str("path", path, optional=False)
        for field, value in (
            ("config_name", config_name),
            ("prompt_field", prompt_field),
            ("answer_field", answer_field),
            ("messages_field", messages_field),
            ("slice_field", slice_field),
            ("answer_marker", answer_marker),
            ("train_split", train_split),
            ("test_split", test_split),
        ):
            _check_str(field, value, optional=field not in ("prompt_field", "train_split"))
        self._check_numbers(test_fraction, split_seed, num_train, num_test, max_bad_fraction)
        if instruction is not None and not isinstance(instruction, str):
            raise ConfigError(f"task.options.instruction: expected a string or null, got {instruction!r}")
        self.path, self.config_name = path, config_name
        self.label = Path(str(path)).name if path else "dataset"
        self.fields = {
            "prompt_field": prompt_field,
            "answer_field": answer_field,
            "messages_field": messages_field,
            "slice_field": slice_field,
        }
        self.answer_marker, self.instruction = answer_marker, PROMPT_INSTRUCTION if instruction is None else instruction
        self.test_fraction, self.split_seed = float(test_fraction), split_seed
        self.limits = {"train": num_train, "test": num_test}
        self.max_bad_fraction = float(max_bad_fraction)
        self.last_skipped = 0
        loaded = dataset if dataset is not None else load_any(path, config_name)
        self.splits = self._pick_splits(loaded, train_split, test_split)
        self._check_fields()
        self._rows: dict[str, list[tuple[str, int, dict]]] = {}
        self.overlap_removed = 0

    @staticmethod
    def _check_numbers(test_fraction: Any, split_seed: Any, num_train: Any, num_test: Any, max_bad: Any) -> None:
        def number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not number(test_fraction) or not 0 < test_fraction < 1:
            raise ConfigError(f"task.options.test_fraction: expected a number in (0, 1), got {test_fraction!r}")
        if not number(max_bad) or not 0 <= max_bad <= 1:
            raise ConfigError(f"task.options.max_bad_fraction: expected a number in [0, 1], got {max_bad!r}")
        for field, value in (("split_seed", split_seed), ("num_train", num_train), ("num_test", num_test)):
            if not isinstance(value, int) or isinstance(value, bool) or (value < 0 and field != "split_seed"):
                raise ConfigError(
                    f"task.options.{field}: expected an integer{' >= 0' if field != 'split_seed' else ''}, got {value!r}"
                )

    # ------------------------------------------------------------------------------------------ splits and fields

    def _pick_splits(self, loaded: Any, train_split: str, test_split: str | None) -> dict[str, tuple[str, Any]]:
        """{"train": (split name, Dataset), "test": (split name, Dataset) or (name, None) for a held-out fraction}."""
        if not hasattr(loaded, "keys"):  # a single Dataset: the train split
            loaded, train_split = {"train": loaded}, "train"
        names = list(loaded.keys())
        if train_split not in loaded:
            raise ConfigError(
                f"task.options.train_split: no split {train_split!r} in {self._where()}; splits: {', '.join(names)}"
            )
        if test_split is not None and test_split not in loaded:
            raise ConfigError(
                f"task.options.test_split: no split {test_split!r} in {self._where()}; splits: {', '.join(names)}"
            )
        test = test_split or ("test" if "test" in loaded and train_split != "test" else None)
        return {
            "train": (train_split, loaded[train_split]),
            "test": (test, loaded[test]) if test else (f"{train_split}[held-out {self.test_fraction:g}]", None),
        }

    def _where(self) -> str:
        return f"{self.path}" + (f" ({self.config_name})" if self.config_name else "") if self.path else "the data set"

    def _check_fields(self) -> None:
        """ConfigError naming the first option whose field a used split lacks, and the fields it has."""
        f = self.fields
        wanted = (
            [("messages_field", f["messages_field"])] if f["messages_field"] else [("prompt_field", f["prompt_field"])]
        )
        if f["answer_field"] or not f["messages_field"]:
            wanted.append(("answer_field", f["answer_field"] or "answer"))
        if f["slice_field"]:
            wanted.append(("slice_field", f["slice_field"]))
        for split, data in self.splits.values():
            if data is None:
                continue
            columns = list(data.column_names)
            for option, column in wanted:
                if column not in columns:
                    raise ConfigError(
                        f"task.options.{option}: no field {column!r} in split {split!r} of {self._where()}; "
                        f"fields: {', '.join(columns)}"
                    )

    # ------------------------------------------------------------------------------------------ problems

    def problems(self, split: str) -> list[Problem]:
        """The usable problems of `split` ("train" or "test"), in source order, at most num_train / num_test."""
        check_split(split)
        problems: list[Problem] = []
        bad: list[int] = []
        limit = self.limits[split]
        rows = self._split_rows(split)
        for source_split, index, row in rows:
            problem = self._problem(source_split, index, row)
            if problem is None:
                bad.append(index)
            elif not limit or len(problems) < limit:
                problems.append(problem)
        self._check_bad(split, len(rows), bad)
        self.last_skipped = len(bad)
        return problems

    def _split_rows(self, split: str) -> list[tuple[str, int, dict]]:
        """[(source split, row index, row)] of a side, held-out fraction and overlap removal applied (cached)."""
        if not self._rows:
            train_name, train = self.splits["train"]
            test_name, test = self.splits["test"]
            train_rows = [(train_name, i, row) for i, row in enumerate(train)]
            if test is None:
                held = self._held_out_keys(train_rows)
                self._rows["train"] = [r for r in train_rows if self._key(r[2]) not in held]
                self._rows["test"] = [r for r in train_rows if self._key(r[2]) in held]
            else:
                keys = {self._key(r[2]) for r in train_rows} - {None}
                test_rows = [(test_name, i, row) for i, row in enumerate(test)]
                self._rows["train"] = train_rows
                self._rows["test"] = [r for r in test_rows if self._key(r[2]) not in keys]
                self.overlap_removed = len(test_rows) - len(self._rows["test"])
        return self._rows[split]

    def _held_out_keys(self, rows: Iterable[tuple[str, int, dict]]) -> set[str]:
        """The normalised questions held out: ceil(test_fraction * distinct) of them, by seeded hash order."""
        keys = sorted(
            {k for k in (self._key(r[2]) for r in rows) if k is not None},
            key=lambda k: _sha256(f"{self.split_seed}:{k}"),
        )
        return set(keys[: math.ceil(self.test_fraction * len(keys))])

    def _question_answer(self, row: dict) -> tuple[str | None, str | None]:
        f = self.fields
        if f["messages_field"]:
            question, answer = chat_question_answer(row.get(f["messages_field"]))
            if f["answer_field"]:
                answer = _text(row.get(f["answer_field"]))
        else:
            question, answer = _text(row.get(f["prompt_field"])), _text(row.get(f["answer_field"] or "answer"))
        return question, _gold_after(answer, self.answer_marker) if answer else None

    def _key(self, row: dict) -> str | None:
        question = self._question_answer(row)[0]
        return _identity(question) if question else None

    def _problem(self, source_split: str, index: int, row: dict) -> Problem | None:
        question, answer = self._question_answer(row)
        if question is None or answer is None:
            return None
        label = _text(row.get(self.fields["slice_field"])) if self.fields["slice_field"] else "all"
        return Problem(
            uid=f"hf/{self.label}/{source_split}/{index}",
            question=question,
            answer=answer,
            slice=label or "all",
            instruction=self.instruction,
        )

    def _check_bad(self, split: str, total: int, bad: list[int]) -> None:
        where = f"{self._where()}, split {self.splits[split][0]!r}"
        if total and len(bad) < total and len(bad) / total <= self.max_bad_fraction:
            return
        if not total:
            raise DataError(f"{where}: no rows")
        first = ", ".join(str(i) for i in bad[:5])
        raise DataError(
            f"{where}: {len(bad)} of {total} rows have no usable question or gold answer (more than "
            f"task.options.max_bad_fraction={self.max_bad_fraction}); first bad rows (0-based): {first}"
        )

    # ------------------------------------------------------------------------------------------ identity

    @property
    def source(self) -> dict[str, Any]:
        """What the manifest records: where the data came from and the fingerprint of every split used."""
        fingerprints = {
            name: getattr(data, "_fingerprint", None) for name, data in self.splits.values() if data is not None
        }
        combined = _sha256(json.dumps(sorted(fingerprints.items())))[:16]
        self._split_rows("train")  # the overlap count is known once the splits are cut
        return {
            "kind": "hf",
            "path": self.path if self.path else "in-memory",
            "config_name": self.config_name,
            "train_split": self.splits["train"][0],
            "test_split": self.splits["test"][0],
            "fingerprints": fingerprints,
            "fingerprint": combined,
            "held_out_overlap_removed": self.overlap_removed,
        }
