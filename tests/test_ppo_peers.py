"""The PPO card (grpolab/baselines/ppo_card.py) checked by the peers' own code, as tests/test_card_peers.py does for GRPO
(run under the peers' venv: `.venv-peers/bin/python -m pytest tests/test_ppo_peers.py`; skips where a peer is
missing): verl composes the card's overrides and its GAE gives grpolab's returns, and grpolab's advantages once
whitened with verl's sample variance; OpenRLHF's parser takes the card's flags and its GAE gives grpolab's
numbers on right-padded completions."""

from __future__ import annotations

import pytest
import torch
from test_card_peers import card_of, openrlhf, openrlhf_args, verl_compose  # noqa: F401  (openrlhf: a fixture)

from grpolab.algo.gae import gae, token_rewards, whiten
from grpolab.card import peer_settings
from grpolab.config import from_dict

CASES = {
    "default": {"algorithm": {"estimator": "gae", "beta": 0.0}},
    "kl_in_reward": {
        "algorithm": {
            "estimator": "gae",
            "beta": 0.05,
            "kl_placement": "reward",
            "kl_estimator": "k1",
            "gamma": 0.99,
            "lam": 0.9,
        },
        "critic": {"value_clip": 0.3, "lr": 2e-5},
    },
}


def batch():
    """Right-padded completions of lengths 6, 3, 1, 5; values, KL and rewards of one fixed draw."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).long()
    values = torch.randn(4, 6, generator=g, dtype=torch.float64) * mask
    kl = torch.rand(4, 6, generator=g, dtype=torch.float64) * mask
    return mask, values, kl, torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)


@pytest.mark.parametrize("name", CASES)
def test_verl_takes_the_card_settings_and_its_gae_gives_ours(name):
    cfg = from_dict(CASES[name])
    settings = peer_settings(card_of(cfg)["verl"])
    conf = verl_compose(settings)
    from omegaconf import OmegaConf

    for key, value in settings.items():
        assert OmegaConf.select(conf, key) == value, key
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    a = cfg.algorithm
    mask, values, kl, rewards = batch()
    r = token_rewards(rewards, kl, mask, a.beta)
    ours = gae(r, values, mask, a.gamma, a.lam)
    adv, ret = core_algos.compute_gae_advantage_return(
        r, values, mask.double(), torch.tensor(a.gamma), torch.tensor(a.lam)
    )
    assert torch.allclose(ret * mask, ours.returns, atol=1e-12)
    n = mask.sum()
    m = mask.bool()  # the card's "nearest": verl whitens with the sample variance (n - 1)
    sample_var_whiten = torch.zeros_like(ours.advantages)
    mean = ours.advantages[m].mean()
    var = ours.advantages[m].var(unbiased=True)
    sample_var_whiten[m] = (ours.advantages[m] - mean) / torch.sqrt(var + 1e-8)
    assert torch.allclose(adv[m], sample_var_whiten[m], atol=1e-10)
    assert not torch.allclose(adv[m], whiten(ours.advantages, mask)[m], atol=1e-4) and n > 1  # so the row is nearest


@pytest.mark.parametrize("name", CASES)
def test_openrlhf_takes_the_card_flags_and_its_gae_gives_ours(openrlhf, name):  # noqa: F811
    cfg = from_dict(CASES[name])
    eq = card_of(cfg)["openrlhf"]
    args = openrlhf_args(openrlhf, peer_settings(eq))
    a = cfg.algorithm
    assert args.algo.advantage.estimator == "gae" and args.algo.advantage.gamma == a.gamma
    assert args.algo.advantage.lambd == a.lam and args.critic.value_clip == cfg.critic.value_clip
    ns, _ = openrlhf
    mask, values, kl, rewards = batch()
    r = token_rewards(rewards, kl, mask, a.beta)
    adv, ret = ns["get_advantages_and_returns"](None, values, r, mask, a.gamma, a.lam)
    ours = gae(r, values, mask, a.gamma, a.lam)
    assert torch.allclose(adv * mask, ours.advantages, atol=1e-12)
    assert torch.allclose(ret * mask, ours.returns, atol=1e-12)
