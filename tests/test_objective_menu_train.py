"""Three real steps of the tiny model with each option of the objective menu (tests/test_train_e2e.py's setup, the
reward the tiny model can earn: tests/earnable.py): the run trains (finite loss, weights move) and logs the option's
metrics."""

from __future__ import annotations

import math

import earnable
import pytest
from test_train_e2e import rows, run, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

OPTIONS = {
    "cispo": {"preset": "cispo"},
    "gmpo": {"preset": "gmpo"},
    "sapo": {"preset": "sapo"},
    "clip_cov": {"surrogate": "clip_cov", "beta": 0.0, "cov_ratio": 0.05, "clip_cov_lb": 0.0},
    "kl_cov": {"surrogate": "kl_cov", "beta": 0.0, "cov_ratio": 0.05},
    "scalerl": {"preset": "scalerl"},
    "icepop": {"preset": "icepop", "beta": 0.0},
    "geometric_tis": {"is_mode": "sequence_truncate", "is_reject": "geometric", "beta": 0.0},
    "offpolicy_mask": {"offpolicy_mask_delta": 1e-3, "beta": 0.0},
    "maxrl": {"estimator": "maxrl", "beta": 0.0},
    "gdpo": {"estimator": "gdpo", "beta": 0.0},
    "dppo_tv": {"preset": "dppo_tv"},
    "dppo_kl": {"preset": "dppo_kl"},
    "luspo": {"preset": "luspo"},
    "unbiased_kl": {"beta": 0.04, "kl_bias_correction": True},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_trains_three_steps(tiny_model_dir, tmp_path, name):
    cfg = tiny_config(tiny_model_dir, str(tmp_path), **OPTIONS[name])
    cfg["reward"] = earnable.reward_config()
    cfg["train"].update(steps=3, lr=5e-3)
    if name == "geometric_tis":
        cfg["rollout"]["dtype"] = "bfloat16"
    cfg["eval"] = {"every_steps": 0}
    run(cfg, tmp_path / name)
    metrics = rows(tmp_path / name)
    assert [r["step"] for r in metrics] == [1, 2, 3]
    for r in metrics:
        for key in ("loss/total", "optim/grad_norm", "sampler/kl_k3", "sampler/chi2", "sampler/seq_rejected_frac"):
            assert math.isfinite(r[key]), (key, r[key])
        assert r["optim/skipped_steps"] == 0
    assert any(r["optim/grad_norm"] > 0 for r in metrics)
    if name == "icepop":  # top_k = 2 truncates the sampler, but q is its untruncated softmax: on-policy w = 1
        assert all(r.get("sampler/token_masked_frac", 0.0) == 0 for r in metrics)
    elif name == "geometric_tis":  # a bf16 sampler: the geometric mean leaves [0.999, 1.001], sequences are rejected
        assert any(r["sampler/seq_rejected_frac"] > 0 for r in metrics)
    if name in ("clip_cov", "kl_cov"):
        assert any(r["policy/cov_selected_frac"] > 0 for r in metrics)
    else:  # a metric that is 0 by construction is not logged
        assert all("policy/cov_selected_frac" not in r for r in metrics)
    assert all(
        ("sampler/offpolicy_masked_seq_frac" in r) == bool(OPTIONS[name].get("offpolicy_mask_delta")) for r in metrics
    )
