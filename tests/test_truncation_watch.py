"""Truncation caught early (grpolab/training/truncation.py): the threshold and window of the warning, the suggested
rollout.max_new_tokens from censored lengths, a resumed run's pooled share, and `grpolab train` on a tiny random
model whose completions are always cut saying so on the console with twice the limit."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from grpolab.gate.base import NA, PASS, WARN
from grpolab.gate.thresholds import Thresholds
from grpolab.gate.training import check_truncation_drift
from grpolab.training.truncation import (
    FILE,
    THRESHOLD,
    WINDOW_STEPS,
    TruncationWatch,
    lognormal_quantile,
    suggest_max_new_tokens,
)


def step_of(limit: int, finished: list[int], cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths, truncated) of a step with these finished lengths and `cut` completions at the limit."""
    lengths = torch.tensor(finished + [limit] * cut)
    return lengths, torch.tensor([False] * len(finished) + [True] * cut)


def test_more_than_half_cut_warns_half_does_not(tmp_path, caplog):
    half = TruncationWatch(tmp_path / "a", 10)
    (tmp_path / "a").mkdir()
    assert half.observe(1, *step_of(10, [4] * 8, 8)) is None  # exactly 50%: not "most"
    assert json.loads((tmp_path / "a" / FILE).read_text())["truncated_frac"] == 0.5 == THRESHOLD
    most = TruncationWatch(tmp_path / "b", 10)
    (tmp_path / "b").mkdir()
    with caplog.at_level("WARNING", logger="grpolab"):
        message = most.observe(1, *step_of(10, [4] * 7, 9))
    assert message and message.startswith("step 1: 9 of 16 completions (56%) hit rollout.max_new_tokens = 10")
    assert [r.getMessage() for r in caplog.records] == [message]
    assert most.observe(2, *step_of(10, [], 16)) is None  # once per run


def test_only_the_first_steps_are_watched(tmp_path):
    watch = TruncationWatch(tmp_path, 10)
    assert watch.observe(1, *step_of(10, [4] * 16, 0)) is None
    assert watch.observe(WINDOW_STEPS + 1, *step_of(10, [], 16)) is None  # past the window: not recorded
    data = json.loads((tmp_path / FILE).read_text())
    assert [s["step"] for s in data["steps"]] == [1] and data["truncated_frac"] == 0.0
    assert TruncationWatch(tmp_path / "x", 10, active=False).observe(1, *step_of(10, [], 4)) is None  # rank > 0
    assert not (tmp_path / "x" / FILE).exists()


def test_the_share_is_pooled_over_the_steps_seen_and_a_resume_reads_them_back(tmp_path):
    first = TruncationWatch(tmp_path, 10)
    assert first.observe(1, *step_of(10, [3] * 6, 4)) is None  # 40%
    resumed = TruncationWatch(tmp_path, 10)  # a new process resuming at step 2
    message = resumed.observe(2, *step_of(10, [5] * 3, 7))  # 70% alone; pooled 11 / 20 = 55%
    assert message and message.startswith("steps 1-2: 11 of 20 completions (55%)"), message
    data = json.loads((tmp_path / FILE).read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2] and data["warned"] is True
    assert data["steps"][0]["finished_lengths"] == [3] * 6
    # a different limit on resume is a new question: the old steps are not pooled with it
    assert TruncationWatch(tmp_path, 20).observe(3, *step_of(20, [5] * 6, 4)) is None


def test_nothing_finished_suggests_twice_the_limit():
    value, basis = suggest_max_new_tokens(48, [], 64)
    assert value == 96 and "twice the limit" in basis
    assert suggest_max_new_tokens(48, [30] * 20, 64)[0] == 96  # one length: no spread to fit


def lognormal_lengths(median: float, sigma: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(n)]


def test_the_fit_recovers_the_95th_percentile_past_the_limit():
    """Log-normal lengths (median 100, sigma 0.6: q95 = 100 e^(0.6 * 1.645) = 268) cut at 90, so 57% are cut: the
    censored fit lands near 268; fitting the finished lengths as if they were all of them would put it near the limit."""
    limit, true_q95 = 90, 100 * math.exp(0.6 * 1.6448536)
    lengths = lognormal_lengths(100, 0.6, 4000)
    finished = [round(x) for x in lengths if x < limit]
    assert 0.5 < 1 - len(finished) / len(lengths) < 0.65
    q = lognormal_quantile(finished, len(lengths))
    assert q == pytest.approx(true_q95, rel=0.05)
    assert lognormal_quantile(finished, len(finished)) < 0.5 * true_q95  # the bug the censoring guards against
    value, basis = suggest_max_new_tokens(limit, finished, len(lengths))
    assert value == math.ceil(q / 32) * 32 and 2 * limit < value <= 8 * limit and "log-normal" in basis


def test_the_suggestion_stays_within_two_and_eight_times_the_limit():
    narrow = [round(x) for x in lognormal_lengths(60, 0.05, 400) if x < 59]  # tiny spread: q95 barely past 60
    assert suggest_max_new_tokens(59, narrow, 400)[0] == 118
    wide = [round(x) for x in lognormal_lengths(400, 2.0, 400) if x < 50]  # enormous spread
    assert suggest_max_new_tokens(50, wide, 400)[0] == 400


def test_train_on_a_model_that_never_ends_says_so(tiny_model_dir, tmp_path, monkeypatch, capsys, one_thread):
    """A random 2-layer model over a 49k vocabulary never samples EOS in 3 tokens: every completion is cut."""
    from tests.test_bad_input import base, config_file
    from tests.test_cli_usage import cli_main

    cfg = base(tiny_model_dir, tmp_path)
    cfg["train"]["steps"] = 2
    code, output = cli_main(monkeypatch, capsys, "train", config_file(tmp_path, cfg))
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "hit rollout.max_new_tokens" in line]
    assert len(warnings) == 1, output
    assert warnings[0].startswith("warning: step 1: 8 of 8 completions (100%) hit rollout.max_new_tokens = 3 ")
    assert "Try rollout.max_new_tokens = 6 " in warnings[0], warnings[0]
    data = json.loads((tmp_path / "runs" / "bad" / FILE).read_text())
    assert data["truncated_frac"] == 1.0 and data["suggested_max_new_tokens"] == 6
    assert [s["step"] for s in data["steps"]] == [1, 2] and data["completions"] == 16
    rows = [json.loads(line) for line in (tmp_path / "runs" / "bad" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("completion/max_new_tokens_to_try") for r in rows] == [6.0, None], "logged once, at the warning"
    check = check_truncation_drift(rows, Thresholds())  # two steps: too few for the trend, not for this
    assert check.status == WARN and "try rollout.max_new_tokens = 6 (truncation.json)" in check.reason, check


def test_the_release_check_names_the_value_to_try_and_warns_without_it_only_by_trend():
    """The report's truncation check: the first steps' warning makes it WARN with the value to try even when the
    late share is low; without it, a steady low share over enough steps PASSes and two steps are too few."""
    steady = [{"step": s, "completion/truncated_frac": 0.05} for s in range(1, 11)]
    assert check_truncation_drift(steady, Thresholds()).status == PASS
    warned = [
        dict(steady[0], **{"completion/max_new_tokens_to_try": 96.0, "completion/first_steps_truncated_frac": 0.6})
    ]
    check = check_truncation_drift(warned + steady[1:], Thresholds())
    assert check.status == WARN and check.reason.startswith("the first steps cut 60% of the completions: try ")
    assert "rollout.max_new_tokens = 96 " in check.reason
    assert check_truncation_drift(steady[:2], Thresholds()).status == NA


def test_the_watch_sees_every_sampled_completion_not_only_the_kept(tiny_model_dir, tmp_path, monkeypatch, one_thread):
    """With dynamic sampling an all-cut group without signal is dropped from the trained batch; the watch reads the
    sampled batch (Batch.sampled_lengths / sampled_truncated: both rounds, every row)."""
    from tests.test_dynamic_sampling import Script, make_trainer

    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_extra_rounds=3)
    script = Script([[[1, 1], [0, 1]], [[0, 0], [1, 0]]], max_calls=2)
    monkeypatch.setattr("grpolab.training.batch.score_rollout", script)
    batch = t.collect()
    (r0, _), (r1, _) = script.calls
    assert len(batch.rollout) == 4 and len(batch.sampled_lengths) == 8
    assert torch.equal(batch.sampled_truncated, torch.cat([r0.truncated, r1.truncated]))
    assert torch.equal(batch.sampled_lengths, torch.cat([r0.completion_mask.sum(-1), r1.completion_mask.sum(-1)]))
