"""Baselines: best-of-n selection by the training reward, rejection sampling, SFT on a tiny model."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import pytest
import torch
from test_evaluate import StubEngine, StubTokenizer

from grpolab.baselines import sft_bon as baselines
from grpolab.baselines.sft_bon import (
    BASELINE_MANIFEST,
    SFTSettings,
    best_of_n_eval,
    gold_solutions,
    gold_target,
    rft_examples,
    run_sft,
    select_best,
)
from grpolab.errors import GrpolabError
from grpolab.evaluation.heldout import run_eval
from grpolab.rewards import REWARD_FUNCTIONS, RewardSet, RewardSpec
from grpolab.tasks.base import Problem

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
W = {"correct": 1.0, "format": 0.1}


def test_docstrings():
    assert doctest.testmod(baselines).failed == 0


def test_select_best_ranks_by_training_reward():
    assert select_best(["5", r"\boxed{3}", "4", r"\boxed{4}"], "4", W) == (3, [0.0, 0.1, 1.0, 1.1])
    assert select_best(["4", "x 4", r"\boxed{9}"], "4", W)[0] == 0  # tie (1.0, 1.0): the earliest wins
    assert select_best(["a", "b"], "4", W)[0] == 0


def test_select_best_invalid_never_wins(monkeypatch):
    def fragile(completion, gold):
        if "boom" in completion:
            raise RuntimeError("boom")
        return 0.0

    monkeypatch.setitem(REWARD_FUNCTIONS, "fragile", RewardSpec(fragile, "raises on boom"))
    best, rewards = select_best([r"boom \boxed{4}", "nothing"], "4", {"correct": 1.0, "fragile": 1.0})
    assert best == 1 and math.isnan(rewards[0]) and rewards[1] == 0.0


def test_select_best_ranks_by_a_runs_own_reward_set():
    """--reward-from RUN ranks by the run's whole reward (cli/score.run_reward): a user function the built-in
    weights know nothing about decides here, and it sees the problem (not only the gold answer)."""

    def shortest_with_question_word(completion, problem):
        return (problem.question.split()[0] in completion) - len(completion) / 100

    rewards = RewardSet({"mine": 1.0}, callables={"mine": shortest_with_question_word})
    problem = Problem("t/0", "seven plus one", "8")
    texts = [r"\boxed{8}", "seven is 8", "seven", "eight"]
    best, totals = select_best(texts, problem, rewards)
    assert best == 2 and totals == pytest.approx([-0.09, 0.9, 0.95, -0.05], abs=1e-12)
    assert select_best(texts, problem, W)[0] == 0  # the built-in weights would keep the boxed answer


def test_best_of_n_picks_highest_reward_sample():
    texts = {  # problem index -> 4 samples; gold of problem i is str(i + 1)
        0: ["2", r"\boxed{1}", "so 1", r"\boxed{7}"],  # reward: 0, 1.1, 1.0, 0.1 -> sample 1 (correct)
        1: [r"\boxed{5}", "5", "2", "TRUNC 2"],  # 0.1, 0, 1.0, 1.0 -> sample 2 (correct)
        2: [r"\boxed{9}", "1", "2", "no"],  # 0.1, 0, 0, 0 -> sample 0 (wrong); oracle: none right
        3: [r"\boxed{0.5}", r"\boxed{\frac{8}{2}}", "x", "y"],  # gold 4: reward regex misses 8/2, held-out too
    }
    eng = StubEngine(lambda i, j: texts[i][j])
    probs = [Problem(f"t/{i}", f"q{i}", str(i + 1)) for i in range(4)]
    res = best_of_n_eval(eng, StubTokenizer(), probs, 4, W, batch_size=8)
    assert [it["chosen"] for it in res.items] == [1, 2, 0, 0]
    assert [it["completion"] for it in res.items] == [r"\boxed{1}", "2", r"\boxed{9}", r"\boxed{0.5}"]
    assert [it["correct"] for it in res.items] == [True, True, False, False]
    assert res.items[3]["samples_correct"] == [False, True, False, False]  # math-verify: 8/2 = 4
    assert res.accuracy == 0.5 and res.metrics["oracle@4"]["mean"] == 0.75
    assert eng.calls == [2, 2]  # batch_size 8 sequences = 2 prompts x 4 samples per call


def test_rft_keeps_distinct_correct_untruncated_samples():
    texts = {0: [r"\boxed{1}", r"\boxed{1}", "so 1", "1 TRUNC"], 1: ["0", "3", "x", "y"]}
    eng = StubEngine(lambda i, j: texts[i][j])
    probs = [Problem(f"t/{i}", f"q{i}", str(i + 1)) for i in range(2)]
    got = rft_examples(eng, StubTokenizer(), probs, SFTSettings(mode="rft", rft_samples=4))
    assert [(p.uid, t) for p, t in got] == [("t/0", r"\boxed{1}"), ("t/0", "so 1")]


def test_gold_targets():
    sol = gold_solutions("gsm8k", {"path": str(DATA / "gsm8k")}, "train") if (DATA / "gsm8k").is_dir() else {}
    if sol:
        t = gold_target(Problem("gsm8k/train/0", "q", "72"), sol["gsm8k/train/0"])
        assert "<<" not in t and "####" not in t and t.endswith(r"\boxed{72}.")
    assert gold_target(Problem("x/1", "q", r"\frac{1}{2}")) == r"The answer is \boxed{\frac{1}{2}}."


def _weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_sft_changes_weights_lowers_loss_and_is_held_out(tiny_model_dir, tmp_path):
    opts = {"num_train": 8, "num_test": 3}
    out = tmp_path / "sft"
    s = SFTSettings(mode="gold", steps=12, batch_size=4, lr=3e-3, precision="fp32")
    m = run_sft(tiny_model_dir, "arithmetic", opts, s, out)
    assert len(m["losses"]) == 12 and m["num_examples"] == 8
    assert m["loss_after"] < m["loss_before"] - 0.5  # the training loss on its own data went down
    before, after = _weights(tiny_model_dir), _weights(out)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    saved = json.loads((out / BASELINE_MANIFEST).read_text())
    assert saved["method"] == "sft-gold" and len(saved["train_problem_hashes"]) == 8
    assert saved["config"]["train"]["steps"] == 12
    with pytest.raises(GrpolabError, match="8 of 8 evaluation problems overlap"):
        run_eval([str(out)], "arithmetic", opts, "train", 0, 4, 8, "float32")
    res = run_eval([str(out)], "arithmetic", opts, "test", 0, 4, 8, "float32")  # loads as an HF checkpoint
    assert res["n"] == 3 and res["models"][0]["held_out"]["checked"]
    with pytest.raises(GrpolabError, match="not empty"):
        run_sft(tiny_model_dir, "arithmetic", opts, s, out)


def test_rft_without_correct_samples_is_a_clear_error(tiny_model_dir, tmp_path):
    s = SFTSettings(mode="rft", steps=2, rft_samples=2, max_new_tokens=3)
    with pytest.raises(GrpolabError, match="no training examples"):
        run_sft(tiny_model_dir, "arithmetic", {"num_train": 2}, s, tmp_path / "rft")


def test_sft_cli_matches_run_budget(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from grpolab.cli import app

    run = tmp_path / "run"
    run.mkdir()
    cfg = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 4}},
        "train": {"steps": 2, "mu": 2, "minibatches": 1},
    }
    (run / "manifest.json").write_text(json.dumps({"config": cfg}))
    out = tmp_path / "sft"
    r = CliRunner().invoke(
        app,
        ["baseline", "sft", "--match-run", str(run), "--out", str(out), "--precision", "fp32"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    m = json.loads((out / BASELINE_MANIFEST).read_text())
    assert len(m["losses"]) == 4 and m["num_problems"] == 4 and m["base_model"] == tiny_model_dir  # 2 steps x mu 2
