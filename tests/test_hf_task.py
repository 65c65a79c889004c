"""Task `hf` (grpolab.tasks.hf): local data sets saved with `datasets`, splits, the held-out fraction, overlap with
training, chat-format rows, field errors, the fingerprint in the manifest, and a hub id without network."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from grpolab.errors import ConfigError, DataError  # noqa: E402
from grpolab.manifest import normalise_problem_text  # noqa: E402
from grpolab.tasks import make_task  # noqa: E402


def rows(n: int, start: int = 0) -> dict[str, list]:
    return {
        "q": [f"What is {i} + 1?" for i in range(start, start + n)],
        "sol": [f"{i} plus 1 is {i + 1}\n#### {i + 1:,}" for i in range(start, start + n)],
        "level": [f"L{i % 3}" for i in range(start, start + n)],
    }


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory) -> str:
    """A DatasetDict with train (40 rows) and test (10 rows, 2 of them questions from train), saved to disk."""
    test = rows(8, start=100)
    for key in test:
        test[key] += rows(2, start=5)[key]  # "What is 5 + 1?" and "What is 6 + 1?" are also training questions
    path = tmp_path_factory.mktemp("hf") / "sums"
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(rows(40)), test=datasets.Dataset.from_dict(test)
    ).save_to_disk(path)
    return str(path)


@pytest.fixture(scope="module")
def single_dir(tmp_path_factory) -> str:
    """One Dataset (no splits) of 60 rows with a question asked twice, saved to disk."""
    data = rows(60)
    data["q"][59] = data["q"][3].upper()  # the same question, other case: one identity
    path = tmp_path_factory.mktemp("hf") / "one"
    datasets.Dataset.from_dict(data).save_to_disk(path)
    return str(path)


def options(path: str, **more) -> dict:
    return {"path": path, "prompt_field": "q", "answer_field": "sol", "answer_marker": "####", **more}


def test_saved_dataset_dict_loads_both_splits_and_drops_test_rows_seen_in_training(dict_dir):
    task = make_task("hf", **options(dict_dir, slice_field="level"))
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 40 and len(test) == 8
    assert train[7].question == "What is 7 + 1?" and train[7].answer == "8" and train[7].slice == "L1"
    assert train[7].uid == "hf/sums/train/7" and test[0].uid == "hf/sums/test/0"
    assert not {p.question for p in train} & {p.question for p in test}
    assert task.source["held_out_overlap_removed"] == 2
    assert set(task.source["fingerprints"]) == {"train", "test"} and task.source["test_split"] == "test"


def test_without_a_test_split_a_seeded_fraction_is_held_out_by_question(single_dir):
    task = make_task("hf", **options(single_dir, test_fraction=0.25, split_seed=1))
    train, test = task.problems("train"), task.problems("test")
    assert len(train) + len(test) == 60 and len(test) >= 15
    key = lambda p: normalise_problem_text(p.question)  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in test}  # the repeated question sits on one side only
    again = make_task("hf", **options(single_dir, test_fraction=0.25, split_seed=1)).problems("test")
    other = make_task("hf", **options(single_dir, test_fraction=0.25, split_seed=2)).problems("test")
    assert [p.uid for p in again] == [p.uid for p in test] and [p.uid for p in other] != [p.uid for p in test]
    limited = make_task("hf", **options(single_dir, num_train=5, num_test=3))
    assert len(limited.problems("train")) == 5 and len(limited.problems("test")) == 3
    assert "held-out" in limited.source["test_split"]


def test_chat_messages_give_the_last_user_question_and_assistant_answer(tmp_path):
    chats = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"What is {i} * 2?"},
            {"role": "assistant", "content": str(2 * i)},
        ]
        for i in range(20)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": m, "gold": str(2 * i)}) + "\n" for i, m in enumerate(chats)))
    task = make_task("hf", path=str(path), messages_field="messages", test_fraction=0.2, instruction="")
    p = task.problems("train")[0]
    assert (p.question, p.answer, p.instruction) == ("What is 0 * 2?", "0", "")
    assert (
        make_task("hf", path=str(path), messages_field="messages", answer_field="gold").problems("train")[1].answer
        == "2"
    )


@pytest.mark.parametrize(
    "option, field, listed",
    [
        ("prompt_field", "question", "q, sol, level"),
        ("answer_field", "answer", "q, sol, level"),
        ("slice_field", "difficulty", "q, sol, level"),
    ],
)
def test_a_missing_field_is_one_line_naming_it_and_the_fields_there(dict_dir, option, field, listed):
    opts = {"path": dict_dir, "prompt_field": "q", "answer_field": "sol", option: field}
    with pytest.raises(ConfigError) as info:
        make_task("hf", **opts)
    message = str(info.value)
    assert message.startswith(
        f"task.options.{option}: no field {field!r} in split 'train' of {dict_dir}; fields: {listed}"
    )
    assert "\n" not in message


def test_bad_splits_and_paths_are_named(dict_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"task.options.test_split: no split 'validation' in .*; splits: train, test"):
        make_task("hf", **options(dict_dir, test_split="validation"))
    with pytest.raises(DataError, match=r"task.options.path ./nowhere/at/all: no such file or directory"):
        make_task("hf", path="./nowhere/at/all")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(DataError, match=r"expected a .json, .jsonl, .csv, .parquet file"):
        make_task("hf", path=str(tmp_path / "data.txt"))


def test_a_hub_id_without_network_is_one_line(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as HF_DATASETS_OFFLINE=1 does
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        make_task("hf", path="someone/no-such-dataset-here", config_name="main")
    message = str(info.value)
    assert message.startswith(
        "task.options.path someone/no-such-dataset-here: not a local path, so it is read from the "
        "Hugging Face hub, which needs network access; give a local path instead"
    )
    assert "\n" not in message


def test_fingerprint_reaches_the_manifest(dict_dir, tmp_path):
    from grpolab.config import from_dict
    from grpolab.runs import build_manifest
    from grpolab.training.builders import load_problems

    cfg = from_dict({"task": {"name": "hf", "options": options(dict_dir)}, "eval": {"every_steps": 1}})
    train, held_out, summary = load_problems(cfg)
    tokenizer = type("Tok", (), {"chat_template": ""})()
    manifest = build_manifest(cfg, str(tmp_path), tokenizer, train, held_out, summary)
    source = manifest["data"]["source"]
    assert manifest["hashes"]["dataset_fingerprint"] == source["fingerprint"]
    assert source["fingerprints"]["train"] == datasets.load_from_disk(dict_dir)["train"]._fingerprint
    assert manifest["data"]["held_out_problems"] == 8 and manifest["data"]["train_problems"] == 40
