"""The memory fit (grpolab/training/memory_fit.py): the line through the probe's peaks, the largest micro-batch that
fits, the refusal naming it, and on the tiny model the choice checked against the process's real peak: the chosen
size stays under the limit and a size above it goes over."""

from __future__ import annotations

import pytest

from grpolab.errors import GrpolabError
from grpolab.training.memory_fit import (
    HEADROOM,
    fit_line,
    largest_micro_batch,
    refuse_if_too_big,
)


def test_the_line_and_the_largest_size_by_hand():
    assert fit_line({1: 900.0, 2: 1200.0, 4: 1400.0}) == (1000.0, 100.0)  # through 2 and 4, not the warm-up
    assert largest_micro_batch(1000.0, 100.0, 2000.0) == 8  # (0.9 x 2000 - 1000) / 100
    assert largest_micro_batch(1000.0, 100.0, 1000.0) == 0  # the base alone is over the limit
    assert largest_micro_batch(1000.0, 0.0, 2000.0) > 10**8  # nothing measured per sequence: no bound


def fit_of(micro_batch: int, largest: int) -> dict:
    return {
        "micro_batch_size": micro_batch,
        "largest_micro_batch": largest,
        "fits": micro_batch <= largest,
        "predicted_peak_mib": 1000.0 + micro_batch * 100.0,
        "sequence_length": 90,
        "base_mib": 1000.0,
        "per_sequence_mib": 100.0,
        "capacity_mib": 2000.0,
    }


def test_a_micro_batch_that_would_not_fit_is_refused_naming_the_largest():
    refuse_if_too_big(fit_of(8, 8))
    with pytest.raises(GrpolabError, match=r"train.micro_batch_size = 9 would need about 1,900 MiB") as e:
        refuse_if_too_big(fit_of(9, 8))
    assert "the largest micro-batch that fits is 8: --set train.micro_batch_size=8" in str(e.value)
    with pytest.raises(GrpolabError, match="the largest micro-batch that fits is 0: a smaller model"):
        refuse_if_too_big(fit_of(1, 0))


CHILD = """
import json, sys, tempfile
import torch
torch.set_num_threads(1)
from grpolab.config import from_dict
from grpolab.training.trainer import Trainer
from grpolab.training.memory_fit import memory_fit, probe_peaks
raw, size = json.loads(sys.argv[1]), int(sys.argv[2])
with Trainer(from_dict(raw), tempfile.mkdtemp()) as trainer:
    if size:
        print(json.dumps(probe_peaks(trainer, (40, 128), sizes=(1, size))[size]))
    else:
        print(json.dumps(memory_fit(trainer, (40, 128))))
"""


def in_fresh_process(raw: dict, size: int) -> str:
    """CHILD's answer: the peak after a warm-up update and one at micro-batch `size` (0: the whole memory fit), in a
    fresh process, so the line and the peaks it predicts share one process's baseline (a long-lived test process
    holds more than a run does)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(raw), str(size)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def real_peak(raw: dict, size: int) -> float:
    """The RSS high-water mark of a fresh process after a warm-up update and one at micro-batch `size`: what a run
    at that size reaches (in the probing process earlier sizes' freed blocks would add to it)."""
    return float(in_fresh_process(raw, size))


def test_the_choice_holds_against_the_real_peak(tiny_model_dir, tmp_path, one_thread):
    """Long completions (128 tokens: the logits over a 49k vocabulary dominate) make each sequence cost tens of
    megabytes. The RSS high-water mark grows in the allocator's steps, so the line is within about a sequence of a
    fresh process's real peak either way (checked: within two); HEADROOM's 10% absorbs that. With the capacity set
    so that the line allows 6 (its 90% limit halfway to 7), the real peak at 6 fits the capacity, and the real peak
    above it (at 9) is over the limit the line plans against."""

    raw = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 8, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": 128, "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 1, "prompts_per_step": 2, "micro_batch_size": 2, "precision": "fp32", "device": "cpu"},
    }
    import json

    fit = json.loads(in_fresh_process(raw, 0))
    base, per = fit["base_mib"], fit["per_sequence_mib"]
    assert per > 10.0, fit  # tens of megabytes a sequence: the probe sees them
    capacity = (base + 6.5 * per) / HEADROOM
    assert largest_micro_batch(base, per, capacity) == 6
    fits, over = real_peak(raw, 6), real_peak(raw, 9)
    assert abs(fits - (base + 6 * per)) <= 2 * per, (fit, fits)
    assert fits <= capacity and over > HEADROOM * capacity, (fit, capacity, fits, over)


# ------------------------------------------------------------------- the pre-run check of `grpolab train` (runs.py)


def test_the_pre_run_check_leaves_the_run_as_it_would_have_been(tiny_model_dir, tmp_path, one_thread):
    """train.memory_fit = check probes three updates on the run's own trainer before step 1 and puts back what they
    changed: the same metrics, samples and bitwise weights as memory_fit = off (without the put-back the probe's
    three synthetic updates would stay in the weights and the optimizer's moments). The manifest records the fit."""
    import json

    from test_resume import assert_policy_gradient, assert_same_run, tiny

    from grpolab.config import from_dict
    from grpolab.runs import start_run

    runs = {}
    for mode in ("off", "check"):
        trainer, manifest = start_run(from_dict(tiny(tiny_model_dir, tmp_path, mode, steps=2, memory_fit=mode)))
        with trainer:
            trainer.fit()
        runs[mode] = tmp_path / mode
        recorded = json.loads((runs[mode] / "manifest.json").read_text())["memory_fit"]
        assert recorded["applies"] is (mode == "check"), recorded
    assert_policy_gradient(runs["off"])
    assert_same_run(runs["off"], runs["check"])
    fit = json.loads((runs["check"] / "manifest.json").read_text())["memory_fit"]
    assert fit["fits"] and set(fit["probe_peaks_mib"]) == {"1", "2", "4"} and fit["micro_batch_size"] == 8


def test_a_run_whose_micro_batch_would_not_fit_is_refused_before_anything_is_written(
    tiny_model_dir, tmp_path, one_thread, monkeypatch
):
    """A machine with room for the base and 1.5 sequences of the probe's line (a sequence made to cost 10,000 MiB):
    `start_run` refuses micro_batch_size 8 naming the largest that fits (1), and no run directory is created."""
    from test_resume import tiny

    from grpolab.config import from_dict
    from grpolab.runs import start_run
    from grpolab.training import memory_fit as mf

    real_fit = mf.memory_fit

    def on_a_small_machine(trainer, lengths):
        fit = real_fit(trainer, lengths)
        per = 10_000.0  # a sequence costs far more than the weights' snapshot the check takes off the base
        fit["per_sequence_mib"] = per
        fit["capacity_mib"] = (fit["base_mib"] + 1.5 * per) / HEADROOM  # before the snapshot is taken off the base
        return fit

    monkeypatch.setattr(mf, "memory_fit", on_a_small_machine)
    cfg = from_dict(tiny(tiny_model_dir, tmp_path, "too-big", steps=1))
    with pytest.raises(
        GrpolabError, match=r"train.micro_batch_size = 8 would need about .*the largest micro-batch"
    ) as e:
        start_run(cfg)
    assert "the largest micro-batch that fits is 1: --set train.micro_batch_size=1" in str(e.value)
    assert not (tmp_path / "too-big").exists()
