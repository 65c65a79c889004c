"""DPO / IPO losses and gradients against hand values; pair construction never crosses problems nor uses held-out
problems; DPO on pairs built for the earnable newline reward (tests/earnable.py) raises that reward on the tiny
model, and the baseline manifest states its budget."""

from __future__ import annotations

import json
import math

import earnable
import pytest
import torch

import grpolab.baselines.dpo as dpo_module
from grpolab.algo.dpo import PairLogps, PreferenceLoss, preference_loss, sequence_logps
from grpolab.baselines.dpo import DPOSettings, build_pairs, held_out_guard, run_dpo, train_dpo
from grpolab.config import from_dict
from grpolab.errors import GrpolabError
from grpolab.tasks import make_task

pytestmark = pytest.mark.usefixtures("one_thread")


def pair(pc, pr, rc, rr):
    leaves = [torch.tensor([v], dtype=torch.float64, requires_grad=True) for v in (pc, pr)]
    return leaves, PairLogps(
        leaves[0], leaves[1], torch.tensor([rc], dtype=torch.float64), torch.tensor([rr], dtype=torch.float64)
    )


def test_sigmoid_loss_and_gradient_equal_hand_values():
    (pc, pr), p = pair(-1.0, -2.0, -1.5, -1.5)  # h = (-1 + 1.5) - (-2 + 1.5) = 1
    loss = preference_loss("sigmoid", p, 0.5)
    loss.sum().backward()
    s = 1 / (1 + math.exp(-0.5))  # sigma(beta h)
    assert loss.item() == pytest.approx(-math.log(s), abs=1e-12)  # 0.474077
    assert pc.grad.item() == pytest.approx(-0.5 * (1 - s), abs=1e-12)  # -0.188770
    assert pr.grad.item() == pytest.approx(0.5 * (1 - s), abs=1e-12)


def test_label_smoothing_and_ipo_equal_hand_values():
    _, p = pair(-1.0, -2.0, -1.5, -1.5)
    s = 1 / (1 + math.exp(-0.5))
    smoothed = preference_loss("sigmoid", p, 0.5, label_smoothing=0.1).item()
    assert smoothed == pytest.approx(-0.9 * math.log(s) - 0.1 * math.log(1 - s), abs=1e-12)
    (pc, pr), p = pair(-1.0, -2.0, -1.5, -1.5)
    loss = preference_loss("ipo", p, 0.25)  # (h - 1 / (2 beta))^2 = (1 - 2)^2
    loss.sum().backward()
    assert (
        loss.item() == pytest.approx(1.0)
        and pc.grad.item() == pytest.approx(-2.0)
        and pr.grad.item() == pytest.approx(2.0)
    )


def test_sequence_logps_sum_for_dpo_and_mean_for_ipo():
    lp, m = torch.tensor([[-1.0, -2.0, -4.0], [-3.0, -9.0, -9.0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert sequence_logps(lp, m, PreferenceLoss.SIGMOID).tolist() == [-7.0, -3.0]
    assert sequence_logps(lp, m, PreferenceLoss.IPO).tolist() == pytest.approx([-7.0 / 3, -3.0])


def test_pairs_stay_inside_one_problem_and_prefer_the_higher_reward():
    g = torch.Generator().manual_seed(0)
    G, P = 6, 40
    rewards = torch.randint(0, 3, (P * G,), generator=g).double() / 2
    rewards[:G] = 1.0  # an all-equal group: no pair
    invalid = torch.rand(P * G, generator=g) < 0.1
    texts = [f"t{int(torch.randint(0, 4, (1,), generator=g))}-{i // G}" for i in range(P * G)]  # duplicates in a group
    pairs = build_pairs(rewards, invalid, texts, G)
    assert pairs and not any(p.problem == 0 for p in pairs)
    for p in pairs:
        assert p.chosen // G == p.rejected // G == p.problem  # never across problems
        assert rewards[p.chosen] > rewards[p.rejected] and not invalid[p.chosen] and not invalid[p.rejected]
        assert texts[p.chosen] != texts[p.rejected]
    used = [r for p in pairs for r in (p.chosen, p.rejected)]
    assert len(used) == len(set(used))  # each completion in at most one pair
    capped = build_pairs(rewards, invalid, texts, G, pairs_per_problem=1)
    assert len(capped) == len({p.problem for p in pairs}) < len(pairs)  # one pair for each problem that had any


@pytest.mark.parametrize("pairs, batch", [(13, 8), (5, 5), (7, 3), (3, 8)])
def test_dpo_batches_walk_seeded_permutations_and_never_repeat_a_pair(monkeypatch, pairs, batch):
    """Each epoch is a permutation of the pairs (every pair once, epochs used up in turn), and a batch that
    straddles two epochs holds no pair twice (13 pairs, batch 8: the boundary batches used to repeat a pair)."""
    seen: list[list[int]] = []
    weight = torch.nn.Parameter(torch.zeros(1))

    def loss(model, rollout, ids, ref, s, precision):
        seen.append(list(ids))
        return (weight * 0).sum(), torch.zeros(len(ids))

    monkeypatch.setattr(dpo_module, "reference_logps", lambda *a, **k: torch.zeros(pairs, 2))
    monkeypatch.setattr(dpo_module, "dpo_loss", loss)
    model = torch.nn.Linear(1, 1)
    model.weight = weight
    train_dpo(model, [None] * (2 * pairs), DPOSettings(steps=30, batch_size=batch, seed=1), "fp32")
    size = min(batch, pairs)
    assert len(seen) == 30 and all(len(ids) == size == len(set(ids)) for ids in seen)
    used = torch.zeros(pairs, dtype=torch.long)
    for ids in seen:  # epochs are used up in turn: after every batch each pair was drawn e or e + 1 times
        used[ids] += 1
        assert used.max() - used.min() <= 1, (seen, used)


def test_a_held_out_problem_is_refused():
    task = make_task("arithmetic", num_train=30, num_test=10)
    train, test = task.problems("train"), task.problems("test")
    held_out_guard(train, test)  # disjoint: fine
    with pytest.raises(GrpolabError, match="held-out split"):
        held_out_guard(train[:3] + test[:1], test)


def newline_reward_of(model_dir, cfg, n=16) -> float:
    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.base import SamplingParams
    from grpolab.rollout.grpolab_engine import GrpolabEngine
    from grpolab.tasks.prompting import prompt_ids

    tok, lm = load_tokenizer(model_dir), load_causal_lm(model_dir)
    r = cfg.rollout
    params = SamplingParams(group_size=n, temperature=r.temperature, top_k=r.top_k, max_new_tokens=r.max_new_tokens)
    problems = make_task(cfg.task.name, **cfg.task.options).problems("train")[:4]
    torch.manual_seed(1234)
    texts = GrpolabEngine(lm, tok, torch.float32).generate([prompt_ids(tok, p) for p in problems], params).texts
    return sum(earnable.newline_share(t, None) for t in texts) / len(texts)


def test_dpo_on_pairs_for_the_earnable_reward_raises_it(tiny_model_dir, tmp_path):
    cfg = from_dict(
        {
            "model": {"name": tiny_model_dir},
            "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
            "reward": earnable.reward_config(),
            "rollout": earnable.rollout_config(group_size=8),
            "train": {"steps": 4, "prompts_per_step": 4, "seed": 0, "precision": "fp32"},
        }
    )
    s = DPOSettings(beta=0.1, steps=8, batch_size=8, lr=5e-3, completions=128, seed=0)
    m = run_dpo(cfg, s, tmp_path / "dpo")
    assert m["budget"] == {"completions_sampled": 128, "optimizer_steps": 8, "pairs_per_step": 8}
    assert m["pairs"]["pairs"] > 8 and m["steps"][-1]["loss"] < m["steps"][0]["loss"]
    hashes = set(json.loads((tmp_path / "dpo" / "baseline_manifest.json").read_text())["train_problem_hashes"])
    from grpolab.manifest import problem_hashes

    assert hashes <= set(problem_hashes(make_task("arithmetic", num_train=50, num_test=20).problems("train")))
    before, after = newline_reward_of(tiny_model_dir, cfg), newline_reward_of(str(tmp_path / "dpo"), cfg)
    assert after > before + 0.15, (before, after)
