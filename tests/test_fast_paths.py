"""Every speed lever computes the same thing as the plain path it replaces.

- packed group completions and the shared-prompt cache vs one plain padded forward: logprobs, entropy and
  gradients of every weight, in float64 (HF's RMSNorm rounds through float32, so it is swapped for the same
  formula in float64 here: what is left is float64 rounding);
- first-fit-decreasing packing and the block-causal mask on hand-worked cases;
- grpolab's decode loop: inverse-CDF sampling on hand-worked uniforms and distributions, top-k/top-p identical to
  Hugging Face's logits warpers, sampled frequencies, greedy tokens identical to `generate`, recorded logprobs
  identical to a teacher-forced forward, and finished rows leaving the batch changing nothing; the KV cache
  grown in place and the prepacked weights sampling the same tokens as the plain path;
- fused AdamW vs foreach AdamW.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from grpolab.rollout.base import Rollout, SamplingParams
from grpolab.rollout.decode import decode_groups, inverse_cdf, sample_tokens, truncate_logits
from grpolab.rollout.grpolab_engine import GrpolabEngine, eos_ids
from grpolab.training.forward import completion_logprobs
from grpolab.training.packing import block_causal_mask, first_fit_decreasing, pack_completions

# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def float64_rmsnorm(monkeypatch):
    """HF's RMSNorm computes in float32 whatever the model dtype; this is its formula in the input's dtype."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(LlamaRMSNorm, "forward", forward)


def tiny_llama(vocab: int = 50, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
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


def make_rollout(
    prompt_lens: list[int], completion_lens: list[int], group_size: int, vocab: int = 50, seed: int = 1
) -> Rollout:
    """Left-padded prompts (one per group, repeated G times) and right-padded completions of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    n, lp, lc = len(completion_lens), max(prompt_lens), max(completion_lens)
    prompt_ids, prompt_mask = torch.zeros(n, lp, dtype=torch.long), torch.zeros(n, lp, dtype=torch.long)
    for j, length in enumerate(prompt_lens):
        toks = torch.randint(1, vocab, (length,), generator=g)
        for i in range(j * group_size, (j + 1) * group_size):
            prompt_ids[i, lp - length :], prompt_mask[i, lp - length :] = toks, 1
    completion_mask = (torch.arange(lc).unsqueeze(0) < torch.tensor(completion_lens).unsqueeze(1)).long()
    completion_ids = torch.randint(1, vocab, (n, lc), generator=g) * completion_mask
    groups = torch.arange(len(prompt_lens)).repeat_interleave(group_size)
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


def logp_entropy_grads(model, rollout, rows, **kwargs):
    model.zero_grad(set_to_none=True)
    fo = completion_logprobs(model, rollout, rows, 0.7, "fp32", with_entropy=True, entropy_grad=True, **kwargs)
    mask = fo.mask.to(fo.logp.dtype)
    ((fo.logp * mask).sum() + 0.3 * (fo.entropy * mask).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return fo.logp.detach() * mask, fo.entropy.detach() * mask, grads


# ------------------------------------------------------------------------------------ training-pass levers


CASES = [  # (prompt lengths, completion lengths, G, rows in the micro-batch)
    ([5, 3], [4, 1, 6, 2, 6, 3], 3, None),  # several completions share a packed row; a 1-token completion
    ([4, 4, 2], [7, 7, 1, 2, 5, 3], 2, None),  # three micro-batch groups, equal and unequal prompts
    ([6, 2], [3, 5, 2, 2, 1, 4, 4, 1], 4, [4, 5, 6, 7]),  # the second group alone
    ([6, 2], [3, 5, 2, 2, 1, 4, 4, 1], 4, [2, 3, 4, 5, 6]),  # the end of one group and most of the next
]


@pytest.mark.parametrize("prompt_lens, completion_lens, group_size, rows", CASES)
@pytest.mark.parametrize("pack", [True, False])
def test_shared_prompt_paths_equal_the_plain_forward(
    float64_rmsnorm, prompt_lens, completion_lens, group_size, rows, pack
):
    model = tiny_llama()
    rollout = make_rollout(prompt_lens, completion_lens, group_size)
    rows = torch.arange(len(rollout)) if rows is None else torch.tensor(rows)
    lp_ref, h_ref, g_ref = logp_entropy_grads(model, rollout, rows)
    lp, h, grads = logp_entropy_grads(model, rollout, rows, share_prompt=True, pack=pack)
    assert lp.shape == lp_ref.shape
    assert torch.allclose(lp, lp_ref, atol=1e-12, rtol=0)
    assert torch.allclose(h, h_ref, atol=1e-12, rtol=0)
    for name, g in g_ref.items():
        assert torch.allclose(grads[name], g, atol=1e-11, rtol=0), name
    assert float(g_ref["model.embed_tokens.weight"].abs().max()) > 0.1  # the comparison is not of zeros


@pytest.mark.parametrize("micro_batch_size", [6, 4])  # whole groups; and micro-batches that split a group
def test_policy_update_is_the_same_with_every_lever(float64_rmsnorm, micro_batch_size):
    """One whole PolicyUpdater.update (KL reference, clipping, aggregation, SGD step) with the plain forward and
    with the shared prompt, padded and packed: the same loss, KL, entropy and the same new weights."""
    import copy

    from grpolab.config import from_dict
    from grpolab.training.update import PolicyUpdater

    rollout = make_rollout([5, 3], [4, 1, 6, 2, 6, 3], 3)
    advantages = torch.tensor([1.0, -0.5, -0.2, 0.7, -1.2, 0.9], dtype=torch.float64)
    base, reference = tiny_llama(seed=0), tiny_llama(seed=1)
    results = []
    for share, pack in ((False, False), (True, False), (True, True)):
        cfg = from_dict(
            {
                "rollout": {"group_size": 3, "max_new_tokens": 8, "dtype": "float32"},
                "algorithm": {"beta": 0.04, "kl_estimator": "k3"},
                "train": {
                    "micro_batch_size": micro_batch_size,
                    "grad_clip": 0.0,
                },
                "speed": {"share_prompt": share, "pack_completions": pack},
            }
        )
        policy = copy.deepcopy(base)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
        updater = PolicyUpdater(cfg, policy, reference, optimizer, scheduler)
        rollout.sampler_logprobs = updater.logprobs_no_grad(policy, rollout, "fp32")  # on-policy: no mismatch
        metrics = updater.update(rollout, advantages, torch.ones(6, dtype=torch.bool))
        results.append((metrics, dict(policy.named_parameters())))
    (m_ref, w_ref), others = results[0], results[1:]
    assert abs(m_ref["loss/kl"]) > 1e-6 and abs(m_ref["loss/policy"]) > 1e-6  # the comparison is not of zeros
    moved = max(float((w_ref[k] - p).detach().abs().max()) for k, p in base.named_parameters())
    assert moved > 1e-3
    for metrics, weights in others:
        for key in ("loss/total", "loss/policy", "loss/kl", "policy/kl", "policy/entropy", "optim/grad_norm"):
            assert metrics[key] == pytest.approx(m_ref[key], abs=1e-12, rel=0), key
        for name, w in w_ref.items():
            assert torch.allclose(weights[name], w, atol=1e-12, rtol=0), name


def test_first_fit_decreasing_by_hand():
    # sorted: 7 (i1), 5 (i3), 3 (i0), 2 (i2), 1 (i5); 0 (i4) is left out
    assert first_fit_decreasing([3, 7, 2, 5, 0, 1], 7) == [[1], [3, 2], [0, 5]]
    assert first_fit_decreasing([4, 4, 4], 8) == [[0, 1], [2]]
    assert first_fit_decreasing([0, 0], 1) == []


def test_pack_completions_layout_by_hand():
    comp = torch.tensor([[11, 12, 13], [21, 0, 0], [31, 32, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    p = pack_completions(comp, mask, torch.tensor([9]), prompt_of_row=torch.tensor([0, 0, 0]))
    # capacity 3: [row 0] alone, then [row 2 (len 2), row 1 (len 1)]
    assert p.ids.tolist() == [[9, 11, 12], [9, 31, 9]]
    assert p.targets.tolist() == [[11, 12, 13], [31, 32, 21]]
    assert p.seg.tolist() == [[0, 0, 0], [2, 2, 1]]
    assert p.pos.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert p.group.tolist() == [0, 0]
    filled = torch.zeros(3, 3, dtype=torch.long).index_put((p.row, p.col), p.targets[p.slot])
    assert torch.equal(filled, comp * mask)


def test_block_causal_mask_by_hand():
    seg = torch.tensor([[2, 2, 1, -1]])
    pos = torch.tensor([[0, 1, 0, -1]])
    m = block_causal_mask(torch.tensor([[0, 1]]), seg, pos)[0, 0].int().tolist()
    assert m == [
        [0, 1, 1, 0, 0, 0],  # seg 2, t 0: prompt + itself
        [0, 1, 1, 1, 0, 0],  # seg 2, t 1: prompt + t 0, 1
        [0, 1, 0, 0, 1, 0],  # seg 1, t 0: prompt + itself, not seg 2
        [0, 1, 0, 0, 0, 1],  # pad slot: prompt + itself (never an empty row)
    ]


# ------------------------------------------------------------------------------------------ decode loop


def test_inverse_cdf_sampling_by_hand():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).expand(7, 4)
    u = torch.tensor([0.0, 0.05, 0.1, 0.29, 0.31, 0.6, 0.999])
    tok, lp, _ = sample_tokens(logits, 1.0, u)
    assert tok.tolist() == [0, 0, 1, 1, 2, 3, 3]  # F = 0.1, 0.3, 0.6, 1.0; first v with F(v) > u
    assert torch.allclose(lp, torch.log(torch.tensor([0.1, 0.1, 0.2, 0.2, 0.3, 0.4, 0.4])), atol=1e-6)
    # temperature 0.5 squares and renormalises: p = (1, 4, 9, 16) / 30
    tok, lp, _ = sample_tokens(logits[:4], 0.5, torch.tensor([0.0, 0.04, 0.17, 0.47]))
    assert tok.tolist() == [0, 1, 2, 3]
    assert torch.allclose(lp, torch.log(torch.tensor([1, 4, 9, 16]) / 30.0), atol=1e-6)
    # top-k 2 keeps (0.3, 0.4): u * 0.7 = 0.28 -> token 2, 0.35 -> token 3; the recorded logprob is that of the
    # distribution sampled, (0.3, 0.4) / 0.7, and the untruncated one stays log (0.3, 0.4)
    tok, lp, lp_full = sample_tokens(logits[:2], 1.0, torch.tensor([0.4, 0.5]), top_k=2)
    assert tok.tolist() == [2, 3] and torch.allclose(lp, torch.log(torch.tensor([3 / 7, 4 / 7])), atol=1e-6)
    assert torch.allclose(lp_full, torch.log(torch.tensor([0.3, 0.4])), atol=1e-6)
    assert sample_tokens(logits[:1], 1.0, None)[0].tolist() == [3]  # greedy


@pytest.mark.parametrize("vocab", [7, 1024, 2500])
def test_two_level_inverse_cdf_equals_one_cumulative_sum(vocab):
    """inverse_cdf's block sums + one block's cumulative sum pick the token one float64 cumulative sum over the
    whole vocabulary picks: random u, u at block edges, truncated (zero) entries, a vocabulary that does not fill
    its last block."""
    g = torch.Generator().manual_seed(vocab)
    p = torch.rand(6, vocab, generator=g)
    p[:, torch.randperm(vocab, generator=g)[: vocab // 3]] = 0.0  # truncated entries
    p[5, :-1] = 0.0  # one row whose only mass is the last entry
    cdf = p.double().cumsum(-1)
    mass = cdf[:, -1]
    edges = [e for e in (1023, 2047) if e < vocab - 1]
    us = [torch.rand(6, generator=g, dtype=torch.float64) for _ in range(50)]  # float64, as the decode loop draws
    us += [(cdf[:, e] / mass).float().double() for e in edges]  # within float32 rounding of a block's end
    us += [cdf[:, e] / mass for e in edges]  # at a block's end to float64 rounding
    for u in us:
        u = u.clamp(max=1 - 2**-53)  # uniforms in [0, 1)
        tok, got_mass = inverse_cdf(p, u)
        want = torch.searchsorted(cdf, (u * mass).unsqueeze(-1), right=True).squeeze(-1).clamp(max=vocab - 1)
        assert torch.equal(tok, want), (u, tok, want)
        assert torch.allclose(got_mass, mass, rtol=1e-12, atol=0)
        assert (p[torch.arange(6), tok] > 0).all()  # never a truncated entry
    assert (inverse_cdf(p, torch.full((6,), 0.5))[0][5] == vocab - 1).item()


@pytest.mark.parametrize("top_k, top_p", [(0, 0.5), (0, 0.9), (5, 1.0), (3, 0.8), (1, 1.0)])
def test_truncation_equals_hf_warpers(top_k, top_p):
    z = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 2
    ours = truncate_logits(z, top_k, top_p)
    ref = z.clone()
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.equal(ours[~torch.isinf(ours)], z[~torch.isinf(ours)])


def test_sampled_frequencies_match_the_distribution():
    torch.manual_seed(0)
    p = torch.tensor([0.05, 0.15, 0.3, 0.5])
    n = 40_000
    tok = sample_tokens(torch.log(p).expand(n, 4), 1.0, torch.rand(n))[0]
    freq = torch.bincount(tok, minlength=4).double() / n
    sigma = (p.double() * (1 - p.double()) / n).sqrt()
    assert ((freq - p.double()).abs() < 4 * sigma).all(), freq


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    return model, tok


def prompts_of(tok, questions):
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]


def test_greedy_decode_equals_hf_generate(tiny_lm, float64_rmsnorm):
    model, tok = tiny_lm
    prompts = prompts_of(tok, ["What is 2 + 3?", "Hi", "Add 17 and 25, please."])
    params = SamplingParams(group_size=1, max_new_tokens=12, greedy=True)
    ours = GrpolabEngine(model, tok, torch.float64, decoder="grpolab").generate(prompts, params)
    ref = GrpolabEngine(model, tok, torch.float64, decoder="hf").generate(prompts, params)
    assert torch.equal(ours.completion_ids * ours.completion_mask, ref.completion_ids * ref.completion_mask)
    assert torch.equal(ours.completion_mask, ref.completion_mask)
    assert torch.equal(ours.truncated, ref.truncated) and ours.texts == ref.texts


def decode(model, tok, prompts, stop_ids, compact, seed=0, temperature=1.0, group_size=4, max_new_tokens=10):
    from grpolab.rollout.grpolab_engine import left_pad

    ids, mask = left_pad(prompts, tok.pad_token_id)
    torch.manual_seed(seed)
    return decode_groups(
        model, ids, mask, group_size, max_new_tokens, temperature, stop_ids, tok.pad_token_id, compact=compact
    )


def test_finished_rows_leaving_the_batch_changes_nothing(tiny_lm, float64_rmsnorm):
    model, tok = tiny_lm
    prompts = prompts_of(tok, ["What is 2 + 3?", "Hi"])
    stops = list(range(0, len(tok), 6))  # one token in six stops a row: rows finish at different steps
    a = decode(model, tok, prompts, stops, compact=True)
    b = decode(model, tok, prompts, stops, compact=False)
    lengths = a.mask.sum(-1)
    assert len(set(lengths.tolist())) > 2 and (lengths < 10).any()  # rows did finish early, at different steps
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask) and torch.equal(a.truncated, b.truncated)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-12, rtol=0)
    assert torch.equal(a.truncated, ~torch.isin(a.tokens, torch.tensor(stops)).any(-1))


def test_recorded_logprobs_equal_a_teacher_forced_forward(tiny_lm, float64_rmsnorm):
    model, tok = tiny_lm
    prompts = prompts_of(tok, ["What is 2 + 3?", "Hi there"])
    d = decode(model, tok, prompts, list(range(0, len(tok), 9)), compact=True, temperature=0.8)
    from grpolab.rollout.grpolab_engine import left_pad

    ids, mask = left_pad(prompts, tok.pad_token_id)
    rollout = Rollout(
        ids.repeat_interleave(4, 0),
        mask.repeat_interleave(4, 0),
        d.tokens,
        d.mask,
        d.logprobs,
        d.truncated,
        torch.arange(2).repeat_interleave(4),
        [""] * 8,
    )
    with torch.no_grad():
        fo = completion_logprobs(model, rollout, torch.arange(8), 0.8, "fp32")
    # the rollout stores float32: equal up to that rounding (a position or temperature slip is > 1e-2)
    assert d.logprobs.dtype == torch.float32
    assert torch.allclose(fo.logp.float() * d.mask, d.logprobs * d.mask, atol=1e-5, rtol=0)
    assert (d.logprobs[d.mask == 0] == 0).all()


def test_prepacked_weights_sample_the_same_tokens():
    """prepack multiplies a decode step's rows by weights packed once (oneDNN): the same sums in another order, so
    the same tokens (greedy and sampled with the same stream) and logprobs equal to float32 rounding."""
    from grpolab.rollout.grpolab_engine import left_pad
    from grpolab.rollout.prepack import prepack_available

    model = tiny_llama(vocab=300, seed=3).float().eval()
    if not prepack_available(model):
        pytest.skip("this torch build has no oneDNN")
    ids, mask = left_pad([[5, 17, 42, 9], [7, 8]], 0)
    for greedy in (True, False):
        runs = [
            decode_groups(
                model,
                ids,
                mask,
                4,
                16,
                0.9,
                [],
                0,
                greedy=greedy,
                prepack=packed,
                generators=[torch.Generator().manual_seed(g) for g in (1, 2)],
            )
            for packed in (True, False)
        ]
        assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].mask, runs[1].mask)
        assert torch.allclose(runs[0].logprobs, runs[1].logprobs, atol=1e-5, rtol=0)
        assert len(set(runs[0].tokens[:, -1].tolist())) > 1 or greedy  # sampled rows differ: a real draw


def test_prepacked_linears_compute_x_wt_plus_b_and_restore_the_model():
    from grpolab.rollout.prepack import prepack_available, prepacked_linears

    model = tiny_llama().float()
    if not prepack_available(model):
        pytest.skip("this torch build has no oneDNN")
    model.lm_head = torch.nn.Linear(32, 50, bias=True)  # a bias is added after the packed product
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    x = torch.randn(3, 2, 32, generator=torch.Generator().manual_seed(0))
    want = model.lm_head(x).double()
    ref = torch.nn.functional.linear(x.double(), model.lm_head.weight.double(), model.lm_head.bias.double())
    with pytest.raises(RuntimeError, match="boom"):
        with prepacked_linears(model, rows=6) as count:
            assert count == len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, and the head
            got = model.lm_head(x).double()
            assert "forward" in model.lm_head.__dict__  # the packed product is what ran
            assert torch.allclose(got, ref, atol=1e-5, rtol=0)
            raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in linears)  # restored even though the block raised
    assert torch.equal(model.lm_head(x).double(), want)
    with prepacked_linears(tiny_llama(), rows=6) as count:  # float64: not where it was measured
        assert count == 0
    with prepacked_linears(model, rows=6, enabled=False) as count:
        assert count == 0


def test_kv_cache_grown_in_place_samples_the_same_tokens(monkeypatch):
    """preallocate_cache writes each step's keys/values into buffers made once instead of concatenating: the
    attention reads the same numbers, so the same tokens and logprobs, with rows finishing at different steps (the
    kept rows of the buffers are selected, as the concatenated cache's are)."""
    import grpolab.rollout.decode as decode
    from grpolab.rollout.cache import preallocate
    from grpolab.rollout.grpolab_engine import left_pad

    swapped = []
    monkeypatch.setattr(decode, "preallocate", lambda cache, capacity: swapped.append(preallocate(cache, capacity)))
    model = tiny_llama(vocab=300, seed=3).eval()
    ids, mask = left_pad([[5, 17, 42, 9], [7, 8]], 0)
    stops = list(range(0, 300, 7))  # about one token in seven stops a row: rows leave the batch at different steps
    for greedy in (True, False):
        runs = [
            decode_groups(
                model,
                ids,
                mask,
                4,
                24,
                1.0,
                stops,
                0,
                greedy=greedy,
                preallocate_cache=inplace,
                generators=[torch.Generator().manual_seed(g) for g in (1, 2)],
            )
            for inplace in (True, False)
        ]
        assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].mask, runs[1].mask)
        assert torch.allclose(runs[0].logprobs, runs[1].logprobs, atol=1e-12, rtol=0)
    lengths = runs[0].mask.sum(-1)
    assert len(set(lengths.tolist())) > 2 and int(lengths.max()) > 8  # rows did finish apart, some ran long
    assert swapped == [model.config.num_hidden_layers] * 2  # the in-place runs did swap every layer's cache


def test_preallocated_layer_holds_what_concatenation_holds():
    """The in-place cache against a DynamicCache fed the same entries: after the swap, after steps past its
    capacity (the buffers grow), after selecting rows, repeating them and cropping."""
    from transformers.cache_utils import DynamicCache

    from grpolab.rollout.cache import PreallocatedLayer, preallocate

    gen = torch.Generator().manual_seed(0)

    def entries(n: int, b: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 2, n, 4, generator=gen), torch.randn(b, 2, n, 4, generator=gen)

    ours, ref = DynamicCache(), DynamicCache()
    for layer in range(2):
        k, v = entries(5)
        ours.update(k, v, layer), ref.update(k, v, layer)
    assert preallocate(ours, capacity=7) == 2 and all(type(x) is PreallocatedLayer for x in ours.layers)
    buffer = ours.layers[0]._keys
    for step in range(4):  # the third step needs 8 > 7 positions: the buffers double to 16
        for layer in range(2):
            k, v = entries(1)
            got, want = ours.update(k, v, layer), ref.update(k, v, layer)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        if step < 2:
            assert ours.layers[0]._keys is buffer  # written in place, no new buffer
    assert ours.layers[0]._keys.shape[-2] == 16 and ours.get_seq_length() == ref.get_seq_length() == 9
    keep = torch.tensor([2, 0])
    ours.batch_select_indices(keep), ref.batch_select_indices(keep)
    ours.batch_repeat_interleave(2), ref.batch_repeat_interleave(2)
    ours.crop(-3), ref.crop(-3)
    k, v = entries(1, b=4)
    for layer in range(2):
        got, want = ours.update(k, v, layer), ref.update(k, v, layer)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[0].shape[-2] == 7
    assert ours.layers[0]._keys.shape[-2] == 16  # selected / repeated rows keep the capacity: no regrowth


def test_group_samples_differ_and_the_engine_is_seeded(tiny_lm):
    model, tok = tiny_lm
    engine = GrpolabEngine(model, tok, torch.float64)
    prompts = prompts_of(tok, ["What is 2 + 3?"])
    params = SamplingParams(group_size=4, max_new_tokens=6)
    torch.manual_seed(5)
    a = engine.generate(prompts, params)
    torch.manual_seed(5)
    b = engine.generate(prompts, params)
    assert torch.equal(a.completion_ids, b.completion_ids)  # the global RNG drives it (checkpointed with the run)
    assert len({tuple(r) for r in a.completion_ids.tolist()}) > 1  # G independent samples, not G copies
    assert a.group.tolist() == [0, 0, 0, 0] and eos_ids(model, tok)


# ---------------------------------------------------------------------------------------------- optimizer


def test_fused_adamw_equals_foreach():
    torch.manual_seed(0)
    params = [torch.randn(300, 7), torch.randn(50)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    out = []
    for kw in ({"fused": True}, {"foreach": True}):
        ps = [p.clone().requires_grad_() for p in params]
        opt = torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, **kw)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        out.append(ps)
    for a, b in zip(*out):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
        assert not torch.allclose(a, params[0] if a.shape == params[0].shape else params[1], atol=1e-4)


def test_bf16_weights_are_packed_only_on_a_cpu_with_bf16_units(monkeypatch):
    """bfloat16 weights are packed where the CPU multiplies bf16 natively (measured faster there), never elsewhere;
    a packed bf16 product is x W^T to one bf16 rounding."""
    from grpolab.rollout import prepack

    model = tiny_llama(vocab=300).bfloat16()
    monkeypatch.setattr(prepack, "cpu_has_bf16_units", lambda: False)
    assert not prepack.prepack_available(model)
    with prepack.prepacked_linears(model, rows=6) as count:
        assert count == 0
    monkeypatch.setattr(prepack, "cpu_has_bf16_units", lambda: True)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    assert prepack.prepack_available(model)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.double() @ model.lm_head.weight.double().T
    try:
        prepack.reorder_for_rows(model.lm_head.weight.detach(), 6)
        packs_bf16 = True
    except RuntimeError:  # oneDNN refuses bf16 on this CPU (AVX2 without AVX-512 BW/VL/DQ)
        packs_bf16 = False
    with prepack.prepacked_linears(model, rows=6) as count:
        assert count == (15 if packs_bf16 else 0)
        assert ("forward" in model.lm_head.__dict__) == packs_bf16  # the packed product is what runs, where packed
        got = model.lm_head(x)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.double(), ref, rtol=2**-7, atol=1e-3)  # one bf16 rounding of a float32 sum


def test_packing_is_all_or_nothing(monkeypatch):
    """One weight oneDNN refuses, or one linear layer of another dtype than the model's first parameter: no layer is
    packed and every module is left as it was."""
    from grpolab.rollout import prepack

    model = tiny_llama().float()
    if not prepack.prepack_available(model):
        pytest.skip("this torch build has no oneDNN")
    real, calls = prepack.reorder_for_rows, []

    def refuse_the_fifth(weight, rows):
        calls.append(rows)
        if len(calls) == 5:
            raise RuntimeError("oneDNN: unsupported")
        return real(weight, rows)

    monkeypatch.setattr(prepack, "reorder_for_rows", refuse_the_fifth)
    with prepack.prepacked_linears(model, rows=6) as count:
        assert count == 0 and len(calls) == 5  # four packed, the fifth refused: none used
        assert all("forward" not in m.__dict__ for m in model.modules())
    monkeypatch.setattr(prepack, "reorder_for_rows", real)
    model.model.layers[1].mlp.down_proj.to(torch.float64)  # the first parameter (the embedding) stays float32
    with prepack.prepacked_linears(model, rows=6) as count:
        assert count == 0 and all("forward" not in m.__dict__ for m in model.modules())


def test_bf16_packed_greedy_decode_follows_the_unpacked_models_argmax():
    """On a CPU that packs bf16 weights: each greedy token of the packed decode is the unpacked model's argmax at that
    position (teacher-forced), or within bf16 rounding of it -- a wrong product or a position slip is neither. The
    embedding (tied to the head) is scaled so the top logits stand well apart, above bf16 noise."""
    from grpolab.rollout.grpolab_engine import left_pad
    from grpolab.rollout.prepack import prepack_available, prepacked_linears

    model = tiny_llama(vocab=300, seed=3).bfloat16().eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(16)
    if not prepack_available(model):
        pytest.skip("bf16 weights are packed only on a CPU with bf16 units and oneDNN")
    with prepacked_linears(model, rows=4) as count:
        if count == 0:
            pytest.skip("oneDNN refuses to pack bf16 weights on this CPU")
    ids, mask = left_pad([[5, 17, 42, 9], [7, 8, 11, 3]], 0)
    d = decode_groups(model, ids, mask, 2, 12, 1.0, [], 0, greedy=True, prepack=True)
    assert d.mask.all()  # no stop ids: every row ran all 12 steps
    full = torch.cat([ids.repeat_interleave(2, 0), d.tokens], dim=1)
    with torch.no_grad():
        logits = model(input_ids=full).logits[:, ids.shape[1] - 1 : -1].float()
    top2 = logits.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).median() > 0.2  # the scaling did separate the top logits
    chosen = logits.gather(-1, d.tokens.unsqueeze(-1)).squeeze(-1)
    gap = logits.max(-1).values - chosen
    ulp = 2**-7 * logits.abs().amax(-1)  # one bf16 rounding step at the largest logit of the row
    assert (gap <= 2 * ulp).all(), (gap / ulp).max()
    assert (gap == 0).float().mean() >= 0.9
