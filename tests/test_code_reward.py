"""The code reward through RewardSet (the trainer's path): extraction, pass_fraction / all_pass, reasons and their
metrics, answer rewards refused on code problems, the canonical solutions of HumanEval and MBPP (local data;
the full sets are slow), held-out code scoring and `grpolab score`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpolab.cli import app
from grpolab.evaluation.heldout import Completion, score_code_item
from grpolab.evaluation.scoring import code_passes, held_out_job, program_text
from grpolab.rewards import RewardSet, result_metrics, reward_card
from grpolab.rewards.code import EXTRACTION_RULE, build_program, extract_code
from grpolab.tasks import make_task
from grpolab.tasks.code import code_problem

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SANDBOX = {"wall_s": 3, "cpu_s": 3, "workers": 2, "uid": 61200}
SQUARE = code_problem(
    "t/square",
    "Write square(n).",
    "def square(n):\n    return n * n",
    ["assert square(2) == 4", "assert square(-3) == 9", "assert square(0) == 0"],
    shown=["assert square(5) == 25"],
    entry_point="square",
)


def _py(code: str) -> str:
    return f"Sure!\n```python\n{code}\n```\nThis squares n."


def test_extraction_rule_variants():
    assert extract_code("```py\nx = 1\n```") == "x = 1"
    assert extract_code("```Python\nx = 2\n```") == "x = 2"
    assert extract_code("```text\nnot code\n```\nthen\n```python\nx = 3\n```") == "x = 3"
    assert extract_code("no fence at all") == "no fence at all"
    assert extract_code("```python\nx = 4\n```\n```python\nx = 5\n```") == "x = 4"  # the first block
    for text in ("```py\nx = 1\n```", "```text\nno\n```\n```\nx = 3\n```", "plain", "```python\nopen"):
        assert program_text(text).rstrip("\n") == extract_code(text).rstrip("\n")  # two implementations, one rule
    assert "first fenced code block" in EXTRACTION_RULE
    assert build_program("x", {"prefix": "", "entry_point": "f"}) == "x"


def test_pass_fraction_and_all_pass_reasons():
    rewards = RewardSet({"pass_fraction": 1.0, "all_pass": 0.5}, sandbox=SANDBOX)
    completions = [
        _py("def square(n):\n    return n * n"),
        _py("def square(n):\n    return n * abs(n)"),
        _py("def square(n) return n"),
        "I don't know.",
        _py("def square(n):\n    return [][0]"),
    ]
    results = rewards.score_many(completions, [SQUARE] * len(completions))
    assert [r.components["pass_fraction"] for r in results] == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 0.0])
    assert [r.components["all_pass"] for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert results[0].total == pytest.approx(1.5)
    assert [r.reason for r in results] == [None, "wrong_answer", "syntax", "syntax", "error"]
    assert not any(r.invalid for r in results)
    assert results[1].extras["code/shown_pass"] == 1.0 and results[1].extras["code/hidden_pass"] == pytest.approx(2 / 3)
    metrics = result_metrics(results)
    assert metrics["reward/code/syntax_frac"] == pytest.approx(0.4)
    assert metrics["reward/code/pass_frac"] == pytest.approx(0.2)
    assert metrics["reward/code/hidden_pass"] == pytest.approx((1 + 2 / 3) / 5)
    assert metrics["reward/code/shown_pass"] == pytest.approx(2 / 5)
    assert rewards.score(completions[0], SQUARE).total == pytest.approx(1.5)


def test_code_rewards_and_answer_rewards_do_not_mix():
    math_problem = make_task("arithmetic").problems("test")[0]
    bad = RewardSet({"pass_fraction": 1.0}, sandbox=SANDBOX).score("\\boxed{3}", math_problem)
    assert bad.invalid and "has no tests" in bad.error
    wrong = RewardSet({"correct": 1.0}).score(_py("def square(n):\n    return n * n"), SQUARE)
    assert wrong.invalid and "code problem" in wrong.error
    assert result_metrics([RewardSet({"correct": 1.0}).score("\\boxed{2}", math_problem)]) == {}
    assert reward_card({"pass_fraction": 1.0})["code_extraction"] == EXTRACTION_RULE
    assert "code_extraction" not in reward_card({"correct": 1.0})


def test_held_out_scoring_is_its_own_path():
    problem = make_task("pyfunc").problems("test")[0]
    name = problem.data["entry_point"]
    job = held_out_job("```python\ndef %s(*a):\n    return None\n```" % name, problem)
    assert set(job.cases) == set(problem.data["tests"]) | set(problem.data["shown"])
    [[(ok, reason)]] = code_passes([[job]])
    assert not ok and reason == "wrong_answer"
    item = score_code_item(
        problem,
        Completion("x", 3, False),
        [Completion("a", 1, False)] * 4,
        [(False, "syntax"), (True, None), (False, "error"), (True, None), (False, "timeout")],
    )
    assert item["scores"]["accuracy"] == 0.0 and item["scores"]["pass@1"] == pytest.approx(0.5)
    assert item["scores"]["pass@4"] == 1.0 and item["reason"] == "syntax"


@pytest.mark.skipif(not (DATA / "humaneval").is_dir() or not (DATA / "mbpp").is_dir(), reason="no shared data")
def test_canonical_solutions_sample():
    """A sample of reference solutions through the reward: HumanEval's pass; MBPP 341 / 596 / 642 fail (set
    order, platform sizes), others pass."""
    humaneval = make_task("humaneval", path=str(DATA / "humaneval")).problems("test")
    mbpp = {
        p.uid: p
        for s in ("train", "test", "validation")
        for p in make_task("mbpp", path=str(DATA / "mbpp")).problems(s)
    }
    chosen = (
        humaneval[::16]
        + [humaneval[33]]
        + [mbpp[f"mbpp/{i}"] for i in (341, 596, 642, 367, 601, 653, 902, 533, 11, 700)]
    )
    results = RewardSet({"all_pass": 1.0}).score_many([_py(p.answer) for p in chosen], chosen)
    failing = {p.uid for p, r in zip(chosen, results) if r.total != 1.0}
    assert failing == {"mbpp/341", "mbpp/596", "mbpp/642"}, [(p.uid, r.reason) for p, r in zip(chosen, results)]


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "humaneval").is_dir() or not (DATA / "mbpp").is_dir(), reason="no shared data")
def test_canonical_solutions_all():
    """All 164 HumanEval canonical solutions pass; 971 of 974 MBPP references pass (not 341, 596, 642)."""
    humaneval = make_task("humaneval", path=str(DATA / "humaneval")).problems("test")
    mbpp = [
        p
        for s in ("prompt", "test", "validation", "train")
        for p in make_task("mbpp", path=str(DATA / "mbpp")).problems(s)
    ]
    rewards = RewardSet({"all_pass": 1.0}, sandbox={"wall_s": 60, "cpu_s": 30})
    assert all(r.total == 1.0 for r in rewards.score_many([_py(p.answer) for p in humaneval], humaneval))
    results = rewards.score_many([_py(p.answer) for p in mbpp], mbpp)
    assert {p.uid for p, r in zip(mbpp, results) if r.total != 1.0} == {"mbpp/341", "mbpp/596", "mbpp/642"}


def test_score_cli_rows_in_order(tmp_path):
    problems = make_task("pyfunc").problems("test")[:3]
    rows = [
        {"id": problems[0].uid, "completion": "I do not know."},
        {"id": problems[1].uid, "completion": _py(f"def {problems[1].data['entry_point']}(*a):\n    return 1 / 0")},
        {"id": problems[0].uid, "completion": "```python\ndef (\n```"},
    ]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.json"
    res = CliRunner().invoke(
        app,
        [
            "score",
            str(src),
            "--task",
            "pyfunc",
            "--json-out",
            str(out),
            "--sandbox-option",
            "uid=61300",
            "--sandbox-option",
            "workers=2",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["rows"]] == [r["id"] for r in rows]
    assert [r["reason"] for r in data["rows"]] == ["syntax", "error", "syntax"]
    assert all(r["reward"] == 0.0 and r["components"] == {"pass_fraction": 0.0} for r in data["rows"])
    assert data["totals"]["n"] == 3 and "total: 3 rows" in res.output


def test_score_cli_math_and_errors(tmp_path):
    problem = make_task("arithmetic").problems("test")[0]
    src = tmp_path / "m.jsonl"
    src.write_text(json.dumps({"id": problem.uid, "completion": f"\\boxed{{{problem.answer}}}"}) + "\n")
    out = tmp_path / "m.json"
    res = CliRunner().invoke(app, ["score", str(src), "--task", "arithmetic", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["reward"] == pytest.approx(1.1) and row["components"] == {"correct": 1.0, "format": 1.0}
    src.write_text(json.dumps({"id": "arithmetic/nope", "completion": "x"}) + "\n")
    res = CliRunner().invoke(app, ["score", str(src), "--task", "arithmetic"], catch_exceptions=True)
    assert res.exit_code != 0 and "m.jsonl:1: unknown problem id" in str(res.exception)


def test_eval_of_a_code_task_end_to_end(tiny_model_dir, one_thread):
    """grpolab.evaluation.heldout on pyfunc with the tiny random model: greedy and sampled completions are judged in the
    sandbox, pass@k and mean@k come with intervals, each record keeps the failure reason."""
    import torch

    from grpolab.evaluation.heldout import EvalSettings, evaluate_model
    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir, "float32")
    problems = make_task("pyfunc").problems("test")[:3]
    result = evaluate_model(
        GrpolabEngine(model, tok, torch.float32),
        tok,
        problems,
        EvalSettings(max_new_tokens=6, batch_size=8, samples=2, temperature=1.0, task="pyfunc"),
    )
    assert result.accuracy == 0.0 and {"accuracy", "pass@1", "pass@2", "mean@2"} <= set(result.metrics)
    assert all(item["reason"] in ("syntax", "error", "wrong_answer") for item in result.items)
    assert all(len(item["samples"]) == 2 and "maj@2" not in item["scores"] for item in result.items)


def test_held_out_scoring_binds_a_solution_named_like_a_builtin():
    """MBPP 126's function is named `sum` and MBPP names no entry point: held-out scoring binds the program's `sum`
    for the tests (the reference solution passes, a wrong one fails), as the training reward does."""
    from grpolab.tasks.code import code_problem

    reference = "def sum(a, b):\n    return sum_of(a) + b\ndef sum_of(a):\n    return a * 2"
    problem = code_problem("mbpp/126-like", "q", reference, ["assert sum(1, 2) == 4", "assert sum(3, 0) == 6"])
    wrong = "```python\ndef sum(a, b):\n    return a + b\n```"
    [[(ok_ref, _)], [(ok_wrong, reason)]] = code_passes(
        [[held_out_job(_py(reference), problem)], [held_out_job(wrong, problem)]]
    )
    assert ok_ref and not ok_wrong and reason == "wrong_answer"
