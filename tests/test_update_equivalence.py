"""A whole PolicyUpdater.update -- several passes (mu = 2), several minibatches, importance weights, clipping, the
KL term, gradient-norm clipping and an SGD step per minibatch -- against a naive float64 reference written here from
the formulas, for every aggregation mode, IS mode and surrogate; and the update is the same with every training-pass
lever (shared prompt, packed completions, micro-batches that split a group) as with the plain padded pass.

The reference shares nothing with grpolab but the minibatch order, which it reads off the update (the rows of the
policy's graph-building forward passes between two optimizer steps). It runs one unpadded forward per completion
and writes every term out:

    r_it = exp(logp_it - old_it)     (GSPO: sg(sequence ratio) pi_theta(o_it) / sg(pi_theta(o_it)), GSPO-token)
    l_it = -min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i)       (dual clip: min(l_it, -c A_i) when A_i < 0)
    kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1          (k3)
    L = sum_it w_it m_it (v_it l_it + beta kl_it)                   (w: aggregation over the minibatch, v: IS weight)

HF's RMSNorm rounds through float32 whatever the model's dtype, so it is swapped for the same formula in float64:
the comparisons are left with float64 rounding and the float32 in which pi_old's and pi_ref's logprobs are stored.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import grpolab.training.update as update_module
from grpolab.config import from_dict
from grpolab.rollout.base import Rollout
from grpolab.training.update import PolicyUpdater

VOCAB, TEMPERATURE, MAX_NEW = 50, 0.7, 8
PROMPT_LENS, COMPLETION_LENS, G = [5, 3, 6, 2], [4, 1, 6, 2, 6, 3, 5, 5, 2, 7, 3, 1], 3
INVALID = 4  # this row's reward is invalid: it is masked out of the loss
ADVANTAGES = [1.0, -0.5, -0.2, 0.7, -1.2, 0.9, -1.1, 0.4, 0.6, 1.3, -0.8, -0.3]
LR, GRAD_CLIP = 2.0, 0.3
AGGREGATIONS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]
ALGORITHM = {
    "beta": 0.1,
    "kl_estimator": "k3",
    "eps_low": 0.2,
    "eps_high": 0.28,
    "is_c_min": 0.5,
    "is_c_max": 1.5,
    "dual_clip_c": 3.0,
}


@pytest.fixture(autouse=True)
def float64_rmsnorm(monkeypatch):
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(LlamaRMSNorm, "forward", forward)


def tiny_llama(seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).double()


def make_rollout() -> Rollout:
    """Left-padded prompts (one per group, repeated G times) and right-padded completions of the given lengths."""
    g = torch.Generator().manual_seed(1)
    n, lp, lc = len(COMPLETION_LENS), max(PROMPT_LENS), max(COMPLETION_LENS)
    prompt_ids, prompt_mask = torch.zeros(n, lp, dtype=torch.long), torch.zeros(n, lp, dtype=torch.long)
    for j, length in enumerate(PROMPT_LENS):
        toks = torch.randint(1, VOCAB, (length,), generator=g)
        prompt_ids[j * G : (j + 1) * G, lp - length :], prompt_mask[j * G : (j + 1) * G, lp - length :] = toks, 1
    completion_mask = (torch.arange(lc).unsqueeze(0) < torch.tensor(COMPLETION_LENS).unsqueeze(1)).long()
    completion_ids = torch.randint(1, VOCAB, (n, lc), generator=g) * completion_mask
    groups = torch.arange(len(PROMPT_LENS)).repeat_interleave(G)
    return Rollout(
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        torch.zeros(n, lc),
        torch.zeros(n, dtype=torch.bool),
        groups,
        [""] * n,
    )


# ------------------------------------------------------------------------------------------ the reference


def row_logprobs(model, rollout: Rollout, i: int) -> torch.Tensor:
    """[Lc] log softmax(logits / T) of row i's completion tokens, from one forward of its unpadded prompt and
    completion (zeros after the completion)."""
    prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()]
    n = int(rollout.completion_mask[i].sum())
    tokens = rollout.completion_ids[i, :n]
    logits = model(input_ids=torch.cat([prompt, tokens]).unsqueeze(0)).logits[0, len(prompt) - 1 : len(prompt) - 1 + n]
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(logp, (0, rollout.completion_ids.shape[1] - n))


def aggregation_weights(m: torch.Tensor, mode: str) -> torch.Tensor:
    """w_it of one minibatch, from the definitions: B rows, B_ne of them with a token in the loss."""
    b, b_ne, tokens = m.shape[0], int((m.sum(1) > 0).sum()), m.sum(1, keepdim=True)
    return {
        "seq_mean_token_mean": m / (b_ne * tokens.clamp(min=1)),
        "token_mean": m / m.sum(),
        "seq_mean_token_sum_norm": m / (b * MAX_NEW),
        "seq_mean_token_sum": m / b_ne,
    }[mode]


def importance_weights(old: torch.Tensor, sampler: torch.Tensor, m: torch.Tensor, mode: str) -> torch.Tensor:
    c_min, c_max = ALGORITHM["is_c_min"], ALGORITHM["is_c_max"]
    token = torch.exp((old - sampler) * m)
    seq = torch.exp(((old - sampler) * m).sum(1, keepdim=True)).expand_as(old)
    inside = lambda x: torch.where((x >= c_min) & (x <= c_max), x, torch.zeros_like(x))  # noqa: E731
    return {
        "none": torch.ones_like(old),
        "token_truncate": token.clamp(max=c_max),
        "token_mask": inside(token),
        "sequence_truncate": seq.clamp(max=c_max),
        "sequence_mask": torch.where(seq <= c_max, seq, torch.zeros_like(seq)),  # masked above C only
    }[mode] * m


def reference_update(policy, reference, rollout, minibatches, aggregation, is_mode, surrogate, advantages=None):
    """Train `policy` in place on the given minibatches (lists of rows, in the update's order); returns the mean
    over optimizer steps of the loss and the numbers of tokens clipped low and high. advantages: [N, Lc] per-token
    advantages A_it instead of the per-sequence ADVANTAGES."""
    n = len(rollout)
    valid = torch.ones(n)
    valid[INVALID] = 0
    mask = rollout.completion_mask.double() * valid.unsqueeze(1)
    adv = torch.tensor(ADVANTAGES, dtype=torch.float64).unsqueeze(1) if advantages is None else advantages
    with torch.no_grad():  # pi_old and pi_ref, stored in float32 as the update stores them
        old = torch.stack([row_logprobs(policy, rollout, i) for i in range(n)]).float().double()
        ref = torch.stack([row_logprobs(reference, rollout, i) for i in range(n)]).float().double()
    is_w = importance_weights(old, rollout.sampler_logprobs.double(), mask, is_mode)
    eps_low, eps_high, beta = ALGORITHM["eps_low"], ALGORITHM["eps_high"], ALGORITHM["beta"]
    losses, clipped_low, clipped_high = [], 0, 0
    for mb in minibatches:
        m, a = mask[mb], adv[mb]
        logp = torch.stack([row_logprobs(policy, rollout, i) for i in mb])
        log_ratio = (logp - old[mb]) * m
        if surrogate == "gspo":  # GSPO-token: the sequence ratio's value, each token's gradient through its own term
            seq = (log_ratio.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)).expand_as(logp)
            log_ratio = seq.detach() + logp - logp.detach()
        r = torch.exp(log_ratio)
        token_loss = -torch.minimum(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a)
        if surrogate == "dual_clip":
            token_loss = torch.where(a < 0, torch.minimum(token_loss, -ALGORITHM["dual_clip_c"] * a), token_loss)
        rho = ref[mb] - logp
        kl = torch.exp(rho) - rho - 1
        loss = (aggregation_weights(m, aggregation) * m * (is_w[mb] * token_loss + beta * kl)).sum()
        policy.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in policy.parameters()]
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
        scale = min(1.0, GRAD_CLIP / (norm + 1e-6))
        with torch.no_grad():
            for p in policy.parameters():
                p -= LR * scale * p.grad
        losses.append(loss.item())
        clipped_low += int((((a < 0) & (r < 1 - eps_low)) * m).sum())
        clipped_high += int((((a > 0) & (r > 1 + eps_high)) * m).sum())
    return sum(losses) / len(losses), clipped_low, clipped_high


# ------------------------------------------------------------------------------------------ grpolab's update


class RecordingSGD(torch.optim.SGD):
    def __init__(self, params, log: list):
        super().__init__(params, lr=LR)
        self.log = log

    def step(self, closure=None):
        self.log.append("step")
        return super().step(closure)


def grpolab_update(
    base,
    reference,
    rollout,
    aggregation,
    is_mode,
    surrogate,
    micro_batch_size=6,
    share_prompt=False,
    pack=False,
    given=None,
    mu=2,
    minibatches=2,
    advantages=None,
):
    """(trained copy of base, update metrics, minibatches as the update took them). given: (pi_old, pi_ref)
    logprobs to use instead of the update's own no-grad passes."""
    cfg = from_dict(
        {
            "rollout": {"group_size": G, "max_new_tokens": MAX_NEW, "temperature": TEMPERATURE, "dtype": "float32"},
            "algorithm": {**ALGORITHM, "aggregation": aggregation, "is_mode": is_mode, "surrogate": surrogate},
            "train": {
                "prompts_per_step": len(PROMPT_LENS),
                "mu": mu,
                "minibatches": minibatches,
                "micro_batch_size": micro_batch_size,
                "grad_clip": GRAD_CLIP,
                "seed": 0,
            },
            "speed": {"share_prompt": share_prompt, "pack_completions": pack},
        }
    )
    policy, log = copy.deepcopy(base), []
    optimizer = RecordingSGD(policy.parameters(), log)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    real = update_module.completion_logprobs

    def spy(model, rollout, rows, *args, **kwargs):
        if model is policy and torch.is_grad_enabled():
            log.append(rows.tolist())
        return real(model, rollout, rows, *args, **kwargs)

    valid = torch.ones(len(rollout), dtype=torch.bool)
    valid[INVALID] = False
    torch.manual_seed(0)
    old, ref = given or (None, None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(update_module, "completion_logprobs", spy)
        metrics = PolicyUpdater(cfg, policy, reference, optimizer, scheduler).update(
            rollout,
            torch.tensor(ADVANTAGES, dtype=torch.float64) if advantages is None else advantages,
            valid,
            ref_logp=ref,
            old_logp=old,
        )
    minibatches, rows = [], []
    for entry in log:
        if entry == "step":
            minibatches.append(rows)
            rows = []
        else:
            rows += entry
    return policy, metrics, minibatches


def make_case():
    """(initial policy, reference model, rollout whose sampler logprobs are pi_old's plus noise)."""
    base, reference = tiny_llama(0), tiny_llama(1)
    rollout = make_rollout()
    with torch.no_grad():
        old = torch.stack([row_logprobs(base, rollout, i) for i in range(len(rollout))])
    noise = 0.5 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rollout.sampler_logprobs = ((old + noise) * rollout.completion_mask).float()  # a sampler that differs from pi_old
    return base, reference, rollout


def assert_matches_reference(
    base, reference, rollout, aggregation, is_mode, surrogate, mu=2, minibatches=2, advantages=None
):
    policy, metrics, taken = grpolab_update(
        base, reference, rollout, aggregation, is_mode, surrogate, mu=mu, minibatches=minibatches, advantages=advantages
    )
    # mu passes x `minibatches` minibatches of whole groups; each pass covers every row once
    assert len(taken) == mu * minibatches, taken
    for mb in taken:
        assert sorted(mb) == [k for grp in sorted({i // G for i in mb}) for k in range(grp * G, grp * G + G)], mb
        assert len(mb) == len(rollout) // minibatches, mb
    for p in range(mu):
        assert sorted(sum(taken[p * minibatches : (p + 1) * minibatches], [])) == list(range(len(rollout)))
    expected = copy.deepcopy(base)
    loss, low, high = reference_update(expected, reference, rollout, taken, aggregation, is_mode, surrogate, advantages)

    tokens = mu * float(rollout.completion_mask.sum() - COMPLETION_LENS[INVALID])  # mu passes over the loss tokens
    assert metrics["loss/total"] == pytest.approx(loss, rel=1e-6, abs=1e-9)
    assert metrics["policy/clip_frac_low"] == pytest.approx(low / tokens, abs=1e-12)
    assert metrics["policy/clip_frac_high"] == pytest.approx(high / tokens, abs=1e-12)
    assert_same_weights(base, expected, policy, 1e-6, "reference")  # to float32's rounding of the stored logprobs
    return metrics


@torch.no_grad()
def assert_same_weights(base, expected, policy, tolerance: float, what: str) -> None:
    """Every weight's change equal to tolerance x the largest change (which must be large)."""
    moved = max(float((q - p).abs().max()) for q, p in zip(expected.parameters(), base.parameters()))
    assert moved > 1e-2, what  # the comparison is not of zeros
    for (name, p0), p, q in zip(base.named_parameters(), policy.parameters(), expected.parameters()):
        assert torch.allclose(p - p0, q - p0, atol=tolerance * moved, rtol=0), (what, name)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_update_equals_the_reference_for_every_aggregation(aggregation):
    base, reference, rollout = make_case()
    metrics = assert_matches_reference(base, reference, rollout, aggregation, "token_truncate", "ppo_clip")
    # every term is at work: clipping both ways, truncated importance weights, the KL
    assert metrics["policy/clip_frac_low"] > 0 and metrics["policy/clip_frac_high"] > 0
    assert metrics["sampler/is_weight_max"] == pytest.approx(ALGORITHM["is_c_max"])
    assert metrics["sampler/is_weight_min"] < 1
    assert metrics["loss/kl"] > 1e-3


@pytest.mark.parametrize("is_mode", ["none", "token_mask", "sequence_truncate", "sequence_mask"])
def test_update_equals_the_reference_for_every_importance_mode(is_mode):
    base, reference, rollout = make_case()
    assert_matches_reference(base, reference, rollout, "seq_mean_token_mean", is_mode, "ppo_clip")


@pytest.mark.parametrize("surrogate", ["dual_clip", "gspo"])
def test_update_equals_the_reference_for_the_other_surrogates(surrogate):
    base, reference, rollout = make_case()
    assert_matches_reference(base, reference, rollout, "token_mean", "token_truncate", surrogate)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_update_with_per_token_advantages_equals_the_reference(aggregation):
    """[N, Lc] advantages A_it (PPO's GAE, grpolab.baselines.ppo): each token its own advantage, of both signs within a row."""
    base, reference, rollout = make_case()
    g = torch.Generator().manual_seed(5)
    adv = torch.randn(rollout.completion_ids.shape, generator=g, dtype=torch.float64) * rollout.completion_mask
    metrics = assert_matches_reference(
        base, reference, rollout, aggregation, "token_truncate", "ppo_clip", advantages=adv
    )
    assert metrics["policy/clip_frac_low"] > 0 and metrics["policy/clip_frac_high"] > 0
    const = torch.tensor(ADVANTAGES, dtype=torch.float64).unsqueeze(1) * rollout.completion_mask
    seq, _, _ = grpolab_update(base, reference, rollout, aggregation, "token_truncate", "ppo_clip")
    tok, _, _ = grpolab_update(base, reference, rollout, aggregation, "token_truncate", "ppo_clip", advantages=const)
    for p, q in zip(seq.parameters(), tok.parameters()):  # A_i broadcast = A_it constant along the row
        assert torch.equal(p, q)


def test_one_pass_of_one_minibatch_equals_the_reference():
    """mu = 1 and one minibatch: pi_old is the policy's own detached logprobs (no separate pass); every ratio is 1."""
    base, reference, rollout = make_case()
    metrics = assert_matches_reference(
        base, reference, rollout, "seq_mean_token_mean", "token_truncate", "ppo_clip", mu=1, minibatches=1
    )
    assert metrics["policy/clip_frac_low"] == metrics["policy/clip_frac_high"] == 0


LEVERS = [  # (share_prompt, pack_completions, micro_batch_size); a minibatch is 6 rows, 2 groups of 3
    (False, False, 4),
    (False, False, 2),
    (True, False, 6),
    (True, True, 6),
    (True, True, 4),
    (True, False, 2),
]


LEVER_CASES = [(a, logprobs, 2, 2) for a in AGGREGATIONS for logprobs in ("computed", "given")]
LEVER_CASES.append(("seq_mean_token_mean", "computed", 1, 1))


@pytest.mark.parametrize("aggregation, logprobs, mu, minibatches", LEVER_CASES)
def test_update_is_the_same_with_every_lever(aggregation, logprobs, mu, minibatches):
    """The plain padded pass with micro-batches of whole groups vs the shared prompt (padded and packed) and
    micro-batches that split a group: the same minibatches, metrics and weights.

    computed: the update's own no-grad passes give pi_old and pi_ref, stored in float32, so a last-bit difference
    between passes could round one way or the other (~1e-8 relative). given: float64 pi_old and pi_ref are passed
    in, and what is left is float64 rounding."""
    base, reference, rollout = make_case()
    given = None
    if logprobs == "given":
        with torch.no_grad():
            given = tuple(
                torch.stack([row_logprobs(m, rollout, i) for i in range(len(rollout))]) for m in (base, reference)
            )
    tolerance = 1e-11 if given else 1e-6
    plain, m_ref, order = grpolab_update(
        base, reference, rollout, aggregation, "token_truncate", "ppo_clip", given=given, mu=mu, minibatches=minibatches
    )
    for share, pack, micro in LEVERS:
        policy, metrics, taken = grpolab_update(
            base,
            reference,
            rollout,
            aggregation,
            "token_truncate",
            "ppo_clip",
            micro,
            share,
            pack,
            given,
            mu,
            minibatches,
        )
        lever = f"share_prompt={share} pack={pack} micro_batch_size={micro}"
        assert [sorted(mb) for mb in taken] == [sorted(mb) for mb in order], lever
        for key in (
            "loss/total",
            "loss/policy",
            "loss/kl",
            "policy/kl",
            "policy/entropy",
            "policy/clip_frac_low",
            "policy/clip_frac_high",
            "optim/grad_norm",
            "sampler/is_weight_mean",
        ):
            assert metrics[key] == pytest.approx(m_ref[key], abs=tolerance, rel=tolerance), (lever, key)
        assert_same_weights(base, plain, policy, tolerance, lever)
