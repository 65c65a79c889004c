"""reasoning-gym generators as a task family (grpolab.tasks.reasoning_gym): seeds, disjoint splits, the library's
scorer as the training checker, an independent held-out checker, clear errors, and the eval and training paths."""

from __future__ import annotations

import json
import re
import sys

import earnable
import pytest
import reasoning_gym

from grpolab.config import from_dict
from grpolab.errors import ConfigError, DataError
from grpolab.evaluation.heldout import run_eval
from grpolab.evaluation.result import write_result
from grpolab.evaluation.scoring import is_correct
from grpolab.manifest import data_hash, normalise_problem_text, versions
from grpolab.report import ReportOptions, build_report
from grpolab.runs import build_manifest
from grpolab.tasks import answer_checker, make_task
from grpolab.tasks.reasoning_gym import (
    SEED_STRIDE,
    SPLIT_SPAN,
    exact_heldout_correct,
    heldout_check,
    score_answer,
)
from grpolab.training.trainer import Trainer

CHAIN = "reasoning_gym:chain_sum"
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}  # the learnable configs/reasoning_gym.yaml


def chain(**options):
    return make_task(CHAIN, **{**SMALL, "num_train": 40, "num_test": 20, **options})


def evaluate_chain(expression: str) -> int:
    """``a + b - c ...`` evaluated left to right, written here from the question text (not the library's code)."""
    tokens = expression.split()
    total = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        total = total + int(operand) if op == "+" else total - int(operand)
    return total


def expression_of(question: str) -> str:
    return re.search(r"problem: (.*) =$", question).group(1)


# ------------------------------------------------------------------------------------------------- the problems


def test_problems_are_reproducible_from_the_seed_and_change_with_it():
    a, b = chain().problems("test"), chain().problems("test")
    assert a == b and [p.uid for p in a] == [p.uid for p in b]
    other = chain(seed=1).problems("test")
    assert [p.question for p in other] != [p.question for p in a]


def test_items_come_from_the_documented_item_seeds():
    """Held-out item idx of task seed k is the library's item of dataset seed k * SEED_STRIDE; training's starts at
    k * SEED_STRIDE + SPLIT_SPAN (so the two ranges of item seeds never meet)."""
    task = chain(seed=3)
    test, train = task.problems("test"), task.problems("train")
    lib_test = reasoning_gym.create_dataset("chain_sum", **SMALL, seed=3 * SEED_STRIDE, size=100)
    lib_train = reasoning_gym.create_dataset("chain_sum", **SMALL, seed=3 * SEED_STRIDE + SPLIT_SPAN, size=1000)
    for p in test:
        assert p.question == lib_test[int(p.uid.rsplit("/", 1)[1])]["question"]
    for p in train:
        assert p.question == lib_train[int(p.uid.rsplit("/", 1)[1])]["question"]
    assert task.describe()["test_item_seeds"] == [3 * SEED_STRIDE, 3 * SEED_STRIDE + SPLIT_SPAN - 1]
    assert task.describe()["train_item_seeds"][0] == 3 * SEED_STRIDE + SPLIT_SPAN


def test_train_and_held_out_are_disjoint_by_question_text_even_in_a_small_problem_space():
    """2 terms of 1 digit: 200 distinct questions, so the training draw meets held-out questions and leaves them out."""
    task = make_task(CHAIN, min_terms=2, max_terms=2, min_digits=1, max_digits=1, num_train=100, num_test=60)
    test, train = task.problems("test"), task.problems("train")
    test_text = {normalise_problem_text(p.question) for p in test}
    train_text = [normalise_problem_text(p.question) for p in train]
    assert len(test_text) == len(test) == 60 and len(set(train_text)) == len(train) == 100
    assert not test_text & set(train_text)
    assert task.removed_overlap > 0  # the overlap was met and removed, not avoided by luck
    assert not {p.uid for p in test} & {p.uid for p in train}


def test_the_held_out_set_does_not_depend_on_num_train():
    assert chain(num_train=5).problems("test") == chain(num_train=300).problems("test")


def test_options_reach_the_generator():
    three = make_task(CHAIN, min_terms=3, max_terms=3, min_digits=1, max_digits=1, num_test=30).problems("test")
    for p in three:
        operands = expression_of(p.question).split()[::2]
        assert len(operands) == 3 and all(0 <= int(x) <= 9 for x in operands), p.question
    wide = make_task(CHAIN, min_terms=2, max_terms=2, min_digits=3, max_digits=3, num_test=30).problems("test")
    assert all(all(100 <= int(x) <= 999 for x in expression_of(p.question).split()[::2]) for p in wide)


def test_gold_answers_match_an_answer_computed_here():
    for p in chain().problems("test") + chain().problems("train"):
        assert p.answer == str(evaluate_chain(expression_of(p.question))), p.question


# ------------------------------------------------------------------------------------------------------ checkers


def test_a_right_answer_scores_one_by_both_checkers_and_a_wrong_one_zero():
    for p in chain().problems("test"):
        right, wrong = (
            str(evaluate_chain(expression_of(p.question))),
            str(evaluate_chain(expression_of(p.question)) + 1),
        )
        assert answer_checker(p) is score_answer
        assert score_answer(right, p) == 1.0 and score_answer(wrong, p) == 0.0  # training: the library's scorer
        assert p.data["heldout_check"] == "math-verify"
        assert is_correct(f"So it is \\boxed{{{right}}}.", p.answer)  # held-out: math-verify, no shared code
        assert not is_correct(f"So it is \\boxed{{{wrong}}}.", p.answer)
        assert score_answer(None, p) == 0.0


def test_heldout_check_by_answer_type():
    assert heldout_check("-128") == heldout_check("0.99074803") == heldout_check("$244/607$") == "math-verify"
    day = make_task("reasoning_gym:calendar_arithmetic", num_train=2, num_test=5).problems("test")
    assert {p.data["heldout_check"] for p in day} == {"exact"}
    for p in day:
        assert score_answer(p.answer, p) == 1.0 and exact_heldout_correct(f" {p.answer} ", p.answer)
        assert not exact_heldout_correct("Someday", p.answer) and score_answer("Someday", p) == 0.0


def test_a_problem_of_another_task_has_no_checker():
    assert answer_checker(make_task("arithmetic", num_test=1).problems("test")[0]) is None


# -------------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("reasoning_gym:chainsum", {}, "unknown reasoning-gym generator 'chainsum'; close names: chain_sum"),
        ("reasoning_gym:", {}, "names no member of the task family"),
        ("reasoning_gym", {}, "unknown task 'reasoning_gym'; expected one of"),
        (
            CHAIN,
            {"max_termz": 3},
            "task.options.max_termz: unknown option of reasoning-gym generator 'chain_sum'; accepted:",
        ),
        (CHAIN, {"min_terms": 5, "max_terms": 2}, "rejected its options (min_terms=5, max_terms=2): max_terms must"),
        (
            CHAIN,
            {"size": 10},
            "task.options.size: not an option here; set task.options.num_train and task.options.num_test",
        ),
        (CHAIN, {"seed": -1}, "task.options.seed: expected an integer from 0 to 4095"),
        (CHAIN, {"num_test": 0}, "task.options.num_test: expected an integer from 1"),
    ],
)
def test_bad_generator_or_option_is_a_clear_config_error(name, options, message):
    with pytest.raises(ConfigError) as e:
        make_task(name, **options)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "generator, message",
    [
        ("boxnet", "'boxnet' gives no gold answer (its scorer judges each answer itself)"),
        ("arc_agi", "(its items do not survive JSON, the form a run records them in); 'arc_agi' cannot be"),
    ],
)
def test_a_generator_the_task_cannot_score_is_a_data_error(generator, message):
    with pytest.raises(DataError) as e:
        make_task(f"reasoning_gym:{generator}", num_test=2, num_train=2).problems("test")
    assert message in str(e.value)


def test_a_missing_library_is_one_line_naming_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ConfigError, match=r"^task.name: reasoning_gym tasks need the reasoning-gym package: pip "):
        make_task(CHAIN)


# ------------------------------------------------------------------------------------------------------ manifest


def test_data_hash_covers_generator_and_options_and_the_version_is_recorded():
    base = data_hash(chain().problems("test"))
    assert base == data_hash(chain().problems("test"))
    assert base != data_hash(chain(max_digits=3).problems("test"))
    assert versions()["reasoning-gym"] == "0.1.25"
    assert chain().describe()["version"] == "0.1.25"


# ---------------------------------------------------------------------------------------------- eval and training


def test_grpolab_eval_runs_the_task_unchanged(tiny_model_dir, one_thread):
    out = run_eval([tiny_model_dir], CHAIN, SMALL, "test", 4, 4, 4, "float32")
    assert out["task"] == CHAIN and out["n"] == 4 and out["data_hash"] == data_hash(chain().problems("test")[:4])
    assert out["versions"]["reasoning-gym"] == "0.1.25"
    row = out["models"][0]
    assert len(row["items"]) == 4 and 0.0 <= row["accuracy"] <= 1.0
    assert {it["uid"] for it in row["items"]} <= {p.uid for p in chain().problems("test")}


def test_two_training_steps_then_eval_and_report_on_the_task(tiny_model_dir, tmp_path, one_thread):
    cfg = from_dict(
        {
            "model": {"name": tiny_model_dir},
            "task": {"name": CHAIN, "options": {**SMALL, "num_train": 20, "num_test": 8}},
            "reward": {**earnable.reward_config(), "weights": {"correct": 1.0, "earn": 1.0}},
            "rollout": earnable.rollout_config(group_size=4),
            "algorithm": {"preset": "grpo", "entropy_coef": 0.0},
            "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 4, "lr": 1e-2, "seed": 0},
            "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 4},
            "run": {"output_dir": str(tmp_path), "name": "rg"},
        }
    )
    run_dir = tmp_path / "rg"
    run_dir.mkdir()
    trainer = Trainer(cfg, run_dir)
    manifest = build_manifest(cfg, trainer.model_path, trainer.tokenizer, trainer.train_problems, trainer.eval_problems)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    trainer.fit()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "eval/accuracy" in rows[-1]
    assert all(r["loss/signal_token_frac"] > 0 for r in rows)
    assert all(p.uid.startswith("reasoning_gym/chain_sum/train/") for p in trainer.train_problems)
    assert manifest["config"]["task"] == {"name": CHAIN, "options": {**SMALL, "num_train": 20, "num_test": 8}}
    assert manifest["versions"]["reasoning-gym"] == "0.1.25"
    assert manifest["hashes"]["train_data"] == data_hash(trainer.train_problems)

    # grpolab eval (base vs the run: the held-out overlap check reads the run's manifest) and grpolab report on it
    options = {**SMALL, "num_train": 20, "num_test": 8}
    result = run_eval([tiny_model_dir, str(run_dir)], CHAIN, options, "test", 4, 4, 4, "float32")
    assert result["models"][1]["held_out"]["checked"] and result["models"][1]["held_out"]["overlap"] == 0
    write_result(run_dir / "eval" / "base_vs_trained.json", result)
    report = build_report(run_dir, ReportOptions(skip_safety=True, skip_diversity=True))
    heldout = report["heldout"]  # the report judges the run on this task's held-out eval
    assert heldout["source"] == "eval/base_vs_trained.json" and heldout["task"] == CHAIN and heldout["n"] == 4
    assert heldout["data_hash"] == result["data_hash"] and (run_dir / "report.html").is_file()


def test_the_correct_reward_asks_the_library_scorer():
    """The `correct` reward of a reasoning-gym problem is the library's score_answer on the extracted answer: right
    1, wrong 0, and the partial credit only the library gives (gcd: len(gold) / len(answer) for an answer that
    contains the gold)."""
    from grpolab.rewards import RewardSet

    p = make_task("reasoning_gym:gcd", min_numbers=2, max_numbers=2, min_value=2, max_value=30, num_test=5).problems(
        "test"
    )[0]
    rs = RewardSet({"correct": 1.0})
    assert rs.score(f"\\boxed{{{p.answer}}}", p).total == 1.0 and rs.score("\\boxed{9999}", p).total == 0.0
    assert rs.score(f"\\boxed{{1{p.answer}}}", p).total == len(p.answer) / (len(p.answer) + 1)


def test_the_held_out_check_of_an_exact_answer_is_string_equality():
    """A problem whose answers math-verify cannot compare (heldout_check: exact) is scored by whitespace-normalised
    string equality in the held-out eval; a numeric one keeps math-verify's equivalence."""
    from grpolab.evaluation.scoring import held_out_correct
    from grpolab.tasks.base import Problem

    word = Problem(uid="w", question="Which day?", answer="Tuesday", data={"heldout_check": "exact"})
    assert held_out_correct(r"\boxed{Tuesday}", word) and held_out_correct(r"\boxed{ Tuesday }", word)
    assert not held_out_correct(r"\boxed{tuesday}", word) and not held_out_correct("no answer", word)
    number = Problem(uid="n", question="Half?", answer="0.5", data={"heldout_check": "math-verify"})
    assert held_out_correct(r"\boxed{\frac{1}{2}}", number)
