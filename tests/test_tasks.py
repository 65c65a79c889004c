"""Tests for the task sources: arithmetic generation, GSM8K / MATH-500 / JSONL loading, the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.errors import ConfigError, DataError
from grpolab.tasks import PROMPT_INSTRUCTION, TASKS, make_task, render_prompt
from grpolab.tasks.arithmetic import ArithmeticTask, evaluate, split_of
from grpolab.tasks.base import Problem
from grpolab.tasks.gsm8k import GSM8KTask, gold_answer
from grpolab.tasks.jsonl import JsonlTask, read_jsonl
from grpolab.tasks.math500 import Math500Task

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_gsm8k = pytest.mark.skipif(
    not (DATA / "gsm8k" / "test.jsonl").is_file(), reason=f"GSM8K data not found at {DATA / 'gsm8k'}"
)
needs_math500 = pytest.mark.skipif(
    not (DATA / "math500" / "test.jsonl").is_file(), reason=f"MATH-500 data not found at {DATA / 'math500'}"
)


# --- arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, value",
    [
        ("2 + 3 * 4", 14),
        ("10 - 2 - 3", 5),
        ("7 - 3 + 5", 9),
        ("2 * 3 * 4", 24),
        ("1 - 2 * 3 + 4", -1),
        ("9 * 0 - 5", -5),
    ],
)
def test_evaluate_precedence(expr, value):
    assert evaluate(expr.split()) == value


def test_same_seed_same_problems_different_seed_differs():
    a = ArithmeticTask(digits=2, seed=3, num_train=50, num_test=20)
    b = ArithmeticTask(digits=2, seed=3, num_train=50, num_test=20)
    c = ArithmeticTask(digits=2, seed=4, num_train=50, num_test=20)
    assert a.problems("train") == b.problems("train")
    assert a.problems("test") == b.problems("test")
    assert a.problems("train") != c.problems("train")


def test_problem_fields_are_consistent():
    for p in ArithmeticTask(digits=3, operators="+-*", terms=3, num_train=200).problems("train"):
        expr = p.uid.removeprefix("arithmetic/")
        assert p.question == f"What is {expr}?"
        assert int(p.answer) == evaluate(expr.split())
        assert p.slice == f"digits={max(len(t) for t in expr.split()[::2])}"
        assert len(expr.split()) == 5


def test_small_digit_counts_appear():
    slices = {p.slice for p in ArithmeticTask(digits=3, num_train=300).problems("train")}
    assert slices == {"digits=1", "digits=2", "digits=3"}


@pytest.mark.parametrize(
    "knobs",
    [dict(), dict(digits=2, operators="+-*"), dict(digits=3, terms=3, test_fraction=0.5), dict(operators="*", seed=7)],
)
def test_train_test_disjoint(knobs):
    task = ArithmeticTask(num_train=500, num_test=100, **knobs)
    train = {p.uid for p in task.problems("train")}
    test = {p.uid for p in task.problems("test")}
    assert train and test and not train & test
    fraction = task.test_fraction
    assert all(split_of(uid.removeprefix("arithmetic/"), fraction) == "test" for uid in test)


def test_no_duplicates_and_counts_reached():
    task = ArithmeticTask(digits=2, num_train=300, num_test=50)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 300 and len(test) == 50
    assert len({p.uid for p in train}) == 300


def test_test_split_invariant_to_num_train():
    small = ArithmeticTask(digits=2, num_train=10, num_test=40).problems("test")
    large = ArithmeticTask(digits=2, num_train=1000, num_test=40).problems("test")
    assert small == large


def test_small_space_returns_what_exists():
    # 1 digit, 2 terms, "+" only: 100 expressions in all, about 20% in test.
    test = ArithmeticTask(operators="+", num_test=200).problems("test")
    assert 0 < len(test) < 100
    assert len({p.uid for p in test}) == len(test)


def test_empty_split_is_config_error():
    with pytest.raises(ConfigError, match=r"task\.options\.test_fraction: no test problems"):
        ArithmeticTask(operators="+", test_fraction=0.001).problems("test")


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(digits=0), "task.options.digits: expected an integer >= 1, got 0"),
        (dict(digits=True), "task.options.digits"),
        (dict(terms=1), "task.options.terms: expected an integer >= 2, got 1"),
        (dict(operators="+/"), "task.options.operators"),
        (dict(operators=""), "task.options.operators"),
        (dict(test_fraction=1.0), "task.options.test_fraction"),
        (dict(num_train=0), "task.options.num_train"),
        (dict(num_test=-1), "task.options.num_test"),
        (dict(seed="x"), "task.options.seed"),
    ],
)
def test_knob_validation(knobs, message):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        ArithmeticTask(**knobs)


def test_unknown_split():
    with pytest.raises(ConfigError, match="split"):
        ArithmeticTask().problems("dev")


# --- GSM8K ------------------------------------------------------------------------------------


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def gsm_row(question: str, answer: str) -> str:
    return json.dumps({"question": question, "answer": answer})


def test_gold_answer():
    assert gold_answer("a #### b\n#### 1,234 ") == "1234"
    assert gold_answer("#### ") is None
    assert gold_answer("42") is None


@needs_gsm8k
def test_gsm8k_real_test_split():
    task = GSM8KTask(path=str(DATA / "gsm8k"))
    problems = task.problems("test")
    assert len(problems) == 1319 and task.last_skipped == 0
    assert problems[0].answer == "18" and problems[0].uid == "gsm8k/test/0"
    assert problems[0].question.startswith("Janet")


@needs_gsm8k
def test_gsm8k_real_train_split_has_no_commas():
    problems = GSM8KTask(path=str(DATA / "gsm8k")).problems("train")
    assert len(problems) == 7473
    assert all("," not in p.answer for p in problems)


def test_gsm8k_malformed_json_names_line(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [gsm_row("q", "#### 1"), "{not json", gsm_row("q", "#### 2")])
    with pytest.raises(DataError, match=r"test\.jsonl:2: malformed JSON"):
        GSM8KTask(path=str(tmp_path)).problems("test")


def test_gsm8k_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"train\.jsonl: file not found; expected a GSM8K JSONL file"):
        GSM8KTask(path=str(tmp_path)).problems("train")


def test_gsm8k_bad_row_skipped_and_counted(tmp_path):
    lines = [gsm_row(f"q{i}", f"#### {i}") for i in range(30)]
    lines[4] = gsm_row("q4", "no marker here")
    write_jsonl(tmp_path / "test.jsonl", lines)
    task = GSM8KTask(path=str(tmp_path))
    problems = task.problems("test")
    assert len(problems) == 29 and task.last_skipped == 1
    assert problems[4].uid == "gsm8k/test/5" and problems[4].answer == "5"


def test_gsm8k_too_many_bad_rows(tmp_path):
    lines = [gsm_row(f"q{i}", f"#### {i}") for i in range(10)]
    lines[2] = gsm_row("q2", "no marker")
    lines[6] = json.dumps({"question": "q6"})
    write_jsonl(tmp_path / "test.jsonl", lines)
    with pytest.raises(DataError, match=r"2 of 10 rows .*first bad lines: 3, 7"):
        GSM8KTask(path=str(tmp_path)).problems("test")
    assert len(GSM8KTask(path=str(tmp_path), max_bad_fraction=0.2).problems("test")) == 8


def test_gsm8k_knob_validation():
    with pytest.raises(ConfigError, match="task.options.max_bad_fraction"):
        GSM8KTask(max_bad_fraction=2)


# --- MATH-500 ---------------------------------------------------------------------------------


@needs_math500
def test_math500_real():
    problems = Math500Task(path=str(DATA / "math500")).problems("test")
    assert len(problems) == 500
    assert problems[0].uid == "math500/test/precalculus/807.json"
    assert problems[0].slice == "level=2"
    assert {p.slice for p in problems} == {f"level={n}" for n in range(1, 6)}


def test_math500_train_is_config_error():
    with pytest.raises(ConfigError, match="only a 'test' split"):
        Math500Task(path="unused").problems("train")


def test_math500_missing_field_names_line(tmp_path):
    row = {"problem": "p", "answer": "1", "level": 3, "unique_id": "a"}
    write_jsonl(tmp_path / "test.jsonl", [json.dumps(row), json.dumps({**row, "answer": ""})])
    with pytest.raises(DataError, match=r"test\.jsonl:2: missing or empty field 'answer'"):
        Math500Task(path=str(tmp_path)).problems("test")


# --- JSONL ------------------------------------------------------------------------------------


def test_read_jsonl_skips_blank_lines_and_numbers_lines(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", ['{"a": 1}', "", '{"a": 2}'])
    assert read_jsonl(path) == [(1, {"a": 1}), (3, {"a": 2})]
    write_jsonl(path, ["[1, 2]"])
    with pytest.raises(DataError, match=r"x\.jsonl:1: expected a JSON object"):
        read_jsonl(path)


def test_jsonl_task_same_file_for_all_splits(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [json.dumps({"q": "one?", "a": 1, "kind": "easy"})])
    task = JsonlTask(str(path), question_field="q", answer_field="a", slice_field="kind")
    expected = [Problem(uid="jsonl/mine/0", question="one?", answer="1", slice="easy")]
    assert task.problems("train") == task.problems("test") == expected


def test_jsonl_task_split_placeholder(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [json.dumps({"question": "t", "answer": "1"})])
    write_jsonl(tmp_path / "test.jsonl", [json.dumps({"question": "e", "answer": "2"})])
    task = JsonlTask(str(tmp_path / "{split}.jsonl"))
    assert [p.question for p in task.problems("train")] == ["t"]
    assert [p.answer for p in task.problems("test")] == ["2"]


def test_jsonl_task_missing_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"question": "q"})])
    with pytest.raises(DataError, match=r"d\.jsonl:1: missing or empty field 'answer'"):
        JsonlTask(str(path)).problems("train")


# --- registry ---------------------------------------------------------------------------------


def test_registry_and_make_task():
    import grpolab.agents  # noqa: F401 -- registers the agent, openenv and verifiers tasks

    assert sorted(TASKS) == [
        *["agent", "arithmetic", "gsm8k", "hf", "humaneval", "jsonl", "math500", "mbpp", "openai_agent", "openenv"],
        *["pyfunc", "verifiers"],
    ]
    task = make_task("arithmetic", digits=2, num_train=5)
    assert task.name == "arithmetic" and len(task.problems("train")) == 5


def test_make_task_unknown_name():
    import grpolab.agents  # noqa: F401 -- registers the agent, openenv and verifiers tasks

    with pytest.raises(ConfigError) as info:
        make_task("foo")
    assert (
        str(info.value)
        == "task.name: unknown task 'foo'; expected one of agent, arithmetic, gsm8k, hf, humaneval, jsonl, math500, mbpp, "
        "openai_agent, openenv, pyfunc, verifiers"
    )


def test_make_task_unknown_and_missing_options():
    with pytest.raises(
        ConfigError, match=r"task\.options\.digit: unknown option for task 'arithmetic'; accepted: digits, operators"
    ):
        make_task("arithmetic", digit=2)
    with pytest.raises(ConfigError, match=r"task\.options\.path: required for task 'jsonl'"):
        make_task("jsonl")


def test_render_prompt():
    problem = Problem(uid="u", question="What is 1 + 1?", answer="2")
    assert render_prompt(problem) == "What is 1 + 1?\n" + PROMPT_INSTRUCTION
