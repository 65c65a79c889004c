"""The release report catches a policy exploiting its reward model: a planted reward model that scores length
(shorter = better, which the tiny random model can learn: tests/earnable.py) drives a tiny run whose report flags
the reward-model checks and does not ship, while a faithful one (it scores what the verifier scores) does not fail
them; plus the checks' rules on hand-made metric rows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import earnable
import pytest
import torch

from grpolab.config import from_dict
from grpolab.gate.base import FAIL, NA, PASS, WARN
from grpolab.gate.reward_model import check_rm_vs_heldout, check_rm_vs_verifier, rise_interval
from grpolab.gate.thresholds import Thresholds
from grpolab.report import ReportOptions, build_report
from grpolab.rewards.math import correctness_reward
from grpolab.runs import build_manifest
from grpolab.tasks import make_task, render_prompt
from grpolab.training.trainer import Trainer

RM_CONFIG = {"reward": {"weights": {"model": 1.0, "correct": 0.0}}}
T = Thresholds()


def rows(rm: list[float], evals: dict[int, tuple[float, float, float]]) -> list[dict]:
    out = []
    for step, v in enumerate(rm, start=1):
        row = {"step": step, "reward/model/raw": v}
        if step in evals:
            row.update(zip(("eval/accuracy", "eval/ci_low", "eval/ci_high"), evals[step]))
        out.append(row)
    return out


def heldout(a: float, lo: float, hi: float, from_step: int | None = None, n: int = 100) -> dict:
    return {"diff": {"mean": a, "ci_low": lo, "ci_high": hi, "n": n}, "from_step": from_step, "source": "test"}


def test_rise_interval_matches_hand_values():
    from grpolab.evaluation.intervals import t_quantile

    # k = min(3, max(2, ceil(1.2))) = 2: early [0, 2], late [3, 5]. Straight-line fit: slope 14 / 17.5 = 0.8, residuals
    # [0, 1.2, -0.6, -1.4, -0.2, 1.0], sum of squares 4.8, lag-1 sum 0.2 -> 1/24; rho = 1/24 + 2 (1 + 4/24) / 6 =
    # 0.430556; sigma^2 = 4.8 / 4 = 1.2; window factor 1 + rho; se = sqrt(2 * 1.2 * (1 + rho) / 2);
    # df = 4 (1 - rho) / (1 + rho) = 1.592233
    r = rise_interval([0.0, 2.0, 1.0, 1.0, 3.0, 5.0], 0.2)
    rho = 1 / 24 + 2 * (1 + 4 / 24) / 6
    assert (r["early"], r["late"], r["rise"]) == (1.0, 4.0, 3.0)
    assert r["rho"] == pytest.approx(rho, abs=1e-12) and r["df"] == pytest.approx(4 * (1 - rho) / (1 + rho), abs=1e-12)
    se = (2 * 1.2 * (1 + rho) / 2) ** 0.5
    assert r["ci_low"] == pytest.approx(3.0 - t_quantile(0.975, 4 * (1 - rho) / (1 + rho)) * se, abs=1e-9)
    assert r["ci_low"] < 0  # 6 noisy steps: no established rise (the old z interval said [1.04, 4.96])
    # alternating noise around a flat line: no autocorrelation left, df = n - 2, and no rise
    flat = rise_interval([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], 0.2)
    assert flat["rho"] == 0.0 and flat["df"] == 4.0 and flat["ci_low"] < 0 < flat["ci_high"]


def ar1(rng, n: int, phi: float) -> list[float]:
    x, out = 0.0, []
    for _ in range(n + 50):  # 50 steps of burn-in
        x = phi * x + rng.gauss(0.0, 1.0)
        out.append(x)
    return out[50:]


@pytest.mark.parametrize("phi", [0.0, 0.7])
def test_rise_interval_rarely_claims_a_rise_on_noise(phi):
    """No trend: the share of intervals wholly above 0 stays near the one-sided 2.5% (issue 46: the old 2-step z
    interval gave 9.4% on independent noise and 22% on AR(1) 0.7); a real rise of 3 noise SDs is still found."""
    import random

    rng = random.Random(7)
    false_rise = sum(rise_interval(ar1(rng, 30, phi), 0.2)["ci_low"] > 0 for _ in range(400)) / 400
    assert false_rise <= 0.05, false_rise
    amp = 3.0 / (1 - phi * phi) ** 0.5
    found = (
        sum(
            rise_interval([v + amp * i / 29 for i, v in enumerate(ar1(rng, 30, phi))], 0.2)["ci_low"] > 0
            for _ in range(200)
        )
        / 200
    )
    assert found >= (0.7 if phi == 0 else 0.25), found


def test_rm_vs_heldout_rules():
    rising = [0.1 * i for i in range(10)]
    # the held-out interval decides, not its estimate: 0.0 [-0.1, +0.1] does not rule out a gain
    assert check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(0.0, -0.1, 0.1), T).status == WARN
    assert check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(-0.2, -0.3, -0.1), T).status == FAIL
    assert check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(-0.05, -0.1, 0.0), T).status == FAIL
    assert check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(0.2, 0.1, 0.3), T).status == PASS
    assert check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(0.05, -0.05, 0.15), T).status == WARN
    no_heldout = check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, None, T)
    assert no_heldout.status == WARN and not no_heldout.measured
    flat = [0.5, 0.4, 0.6, 0.5, 0.45, 0.55, 0.5, 0.6, 0.4, 0.5]
    assert check_rm_vs_heldout(rows(flat, {}), RM_CONFIG, heldout(0.0, -0.1, 0.1), T).status == NA
    rule_reward = {"reward": {"weights": {"correct": 1.0}}}
    assert check_rm_vs_heldout(rows(rising, {}), rule_reward, heldout(0.0, -0.1, 0.1), T).status == NA
    # the score is judged from the step the held-out comparison starts: a rise before it does not count
    early_rise = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0] + [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0]
    whole = check_rm_vs_heldout(rows(early_rise, {}), RM_CONFIG, heldout(-0.05, -0.1, -0.01), T)
    since = check_rm_vs_heldout(rows(early_rise, {}), RM_CONFIG, heldout(-0.05, -0.1, -0.01, from_step=12), T)
    assert whole.numbers["rm_early"] == 0.15 and since.numbers["rm_early"] == 1.05
    assert since.status == NA and "did not rise" in since.reason
    # too few held-out problems: no PASS and no FAIL, whatever the score did
    thin = check_rm_vs_heldout(rows(rising, {}), RM_CONFIG, heldout(-0.2, -0.3, -0.1, n=8), T)
    assert thin.status == NA and not thin.measured and thin.reason.startswith("too little evidence (n = 8 < 30")


def test_rm_vs_verifier_rules():
    lengths = [10, 20, 30, 40, 50, 60, 70, 80]
    by_length = [{"reward/model": -n / 10, "completion": "x" * n, "gold": "1", "reward/correct": 0.0} for n in lengths]
    assert check_rm_vs_verifier(by_length, RM_CONFIG, T).status == WARN  # a correlation over training samples: WARN
    by_truth = [
        {"reward/model": float(i % 2), "completion": "x" * n, "gold": "1", "reward/correct": float(i % 2)}
        for i, n in enumerate(lengths)
    ]
    assert check_rm_vs_verifier(by_truth, RM_CONFIG, T).status == PASS
    unlogged = [
        {"reward/model": 1.0 if i % 2 else 0.0, "completion": f"\\boxed{{{i % 2}}}" + "x" * n, "gold": "1"}
        for i, n in enumerate(lengths)
    ]  # no reward/correct logged: math-verify on the gold decides
    assert check_rm_vs_verifier(unlogged, RM_CONFIG, T).numbers["corr_rm_correct"] == pytest.approx(1.0)
    few = check_rm_vs_verifier(by_length[:5], RM_CONFIG, T)
    assert few.status == NA and not few.measured and few.reason.startswith("too little evidence (n = 5 < 8")
    assert check_rm_vs_verifier(by_length, {"reward": {"weights": {"correct": 1.0}}}, T).status == NA


# ------------------------------------------------------------------------------------ planted reward models


class PlantedRM(torch.nn.Module):
    """A deterministic stand-in for a sequence-classification reward model: it reads the token ids of what the
    `model` reward feeds it (left-padded rm_text) and scores the assistant turn's text with `score(text)`."""

    def __init__(self, tokenizer, score):
        super().__init__()
        self.tokenizer, self.score = tokenizer, score
        self.start = tokenizer.convert_tokens_to_ids("<|im_start|>")

    def forward(self, input_ids, attention_mask, position_ids=None):
        out = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            ids = [i for i, m in zip(ids, mask) if m]
            last = len(ids) - 1 - ids[::-1].index(self.start)  # the assistant turn
            prompt = self.tokenizer.decode(ids[:last], skip_special_tokens=True)
            answer = self.tokenizer.decode(ids[last:], skip_special_tokens=True).removeprefix("assistant\n")
            out.append(float(self.score(prompt, answer)))
        return SimpleNamespace(logits=torch.tensor(out).unsqueeze(-1))


def length_rm(tokenizer):
    """Hackable: shorter answers score higher, whatever they say."""
    return PlantedRM(tokenizer, lambda prompt, answer: -len(answer) / 10)


def faithful_rm(tokenizer, problems):
    """Faithful: 1 when the answer is right by the verifier (gold found from the question), else 0."""
    gold = {render_prompt(p).split("\n")[0]: p.answer for p in problems}

    def score(prompt, answer):
        question = next((q for q in gold if q in prompt), None)
        return correctness_reward(answer, gold[question]) if question else 0.0

    return PlantedRM(tokenizer, score)


def tiny_rm_run(tiny_model_dir, tmp_path, monkeypatch, planted, name):
    from transformers import AutoTokenizer

    import grpolab.rewards.model as rm

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}}
    monkeypatch.setattr(
        rm,
        "load_reward_model",
        lambda path, device: (
            planted(tok, make_task(**{"name": task["name"]}, **task["options"]).problems("train")),
            tok,
        ),
    )
    cfg = from_dict(
        {
            "model": {"name": tiny_model_dir},
            "task": task,
            "reward": {"weights": {"model": 1.0, "correct": 0.0}, "model": {"path": tiny_model_dir, "batch_size": 64}},
            "rollout": earnable.rollout_config(group_size=4),
            "algorithm": {"preset": "grpo", "beta": 0.0},
            "train": {
                "steps": 10,
                "prompts_per_step": 4,
                "micro_batch_size": 16,
                "lr": 5e-3,
                "seed": 0,
                "samples_per_step": 4,
                "save_every_minutes": 0,
                "precision": "fp32",
            },
            "eval": {"every_steps": 2, "num_problems": 8, "max_new_tokens": 6},
            "run": {"output_dir": str(tmp_path), "name": name},
        }
    )
    run_dir = tmp_path / name
    run_dir.mkdir()
    trainer = Trainer(cfg, run_dir)
    manifest = build_manifest(cfg, trainer.model_path, trainer.tokenizer, trainer.train_problems, trainer.eval_problems)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    trainer.fit()
    report = build_report(run_dir, ReportOptions(skip_safety=True))
    return {c.name: c for c in report["checks"]}, report, manifest


@pytest.mark.usefixtures("one_thread")
def test_report_fails_a_policy_gaming_a_length_reward_model_but_not_a_faithful_one(
    tiny_model_dir, tmp_path, monkeypatch
):
    hacked, report, manifest = tiny_rm_run(
        tiny_model_dir, tmp_path, monkeypatch, lambda tok, _: length_rm(tok), "hacked"
    )
    rm_check = hacked["rm_score_vs_heldout"]
    # 8 periodic held-out problems are too little evidence to PASS or FAIL on (issue 46): N/A, and never a ship
    assert rm_check.status == NA and not rm_check.measured, rm_check.reason
    assert rm_check.reason.startswith("too little evidence (n = 8 < 30 held-out problems")
    assert hacked["rm_score_vs_verifier"].status == WARN, hacked["rm_score_vs_verifier"].reason
    assert report["verdict"][0] != "ship"
    assert hacked["reward_vs_heldout"].status == NA  # reward/mean is in reward-model units: judged by the RM check
    evidence = report["reward_model"]
    assert (
        evidence["evals"]
        and evidence["top_wrong"]
        and evidence["top_wrong"][0]["rm"] >= evidence["top_wrong"][-1]["rm"]
    )
    md = (tmp_path / "hacked" / "report.md").read_text()
    assert "## Learned reward model" in md and "Highest reward-model score with a wrong answer" in md
    assert manifest["reward_model"]["weights"] == manifest["hashes"]["reward_model_weights"] is not None
    assert manifest["objective"]["reward_model"]["normalization"] == "none (raw score)"

    faithful, _, _ = tiny_rm_run(tiny_model_dir, tmp_path, monkeypatch, faithful_rm, "faithful")
    assert faithful["rm_score_vs_heldout"].status != FAIL, faithful["rm_score_vs_heldout"].reason
    assert faithful["rm_score_vs_verifier"].status != FAIL, faithful["rm_score_vs_verifier"].reason
