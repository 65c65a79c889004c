"""The fixed-shape decode step (rollout/static_decode.py) against today's loop (rollout/decode.py's decode_groups).

Everything runs a tiny randomly initialised Llama in float32: the same tokens, mask and truncation flags exactly,
and logprobs (sampled and untruncated) equal to float32 rounding (1e-5; a position, temperature or uniform slip
moves them by far more), greedy and seeded, with rows finishing at different steps and left-padded prompts of
different lengths.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.rollout.decode import TextStop, decode_groups
from grpolab.rollout.hf import left_pad
from grpolab.rollout.static_decode import CAPACITY_STEP, StaticDecoder

VOCAB = 300
PROMPTS = [[5, 17, 42, 9, 11, 3], [7, 8], [9, 10, 11]]  # three widths: left padding of 0, 4 and 3 positions


def tiny_llama(seed: int = 3) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="sdpa")  # untied: greedy does not just repeat
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


def generators(n: int = len(PROMPTS)) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(10 + g) for g in range(n)]


def both(model, prompts, stops, decoder=None, group_size=4, max_new_tokens=24, temperature=0.9, **kw):
    """(decode_groups, the static decoder) on the same prompts with the same per-group generators."""
    ids, mask = left_pad(prompts, 0)
    args = (model, ids, mask, group_size, max_new_tokens, temperature, stops, 0)
    ref = decode_groups(*args, generators=generators(len(prompts)), **kw)
    got = (decoder or StaticDecoder()).decode(*args, generators=generators(len(prompts)), **kw)
    return ref, got


def assert_same(ref, got) -> None:
    assert torch.equal(ref.tokens, got.tokens) and torch.equal(ref.mask, got.mask)
    assert torch.equal(ref.truncated, got.truncated)
    assert torch.allclose(ref.logprobs, got.logprobs, atol=1e-5, rtol=0)
    assert (got.logprobs[got.mask == 0] == 0).all() and (got.tokens[got.mask == 0] == 0).all()
    if ref.logprobs_untruncated is None:
        assert got.logprobs_untruncated is None
    else:
        assert torch.allclose(ref.logprobs_untruncated, got.logprobs_untruncated, atol=1e-5, rtol=0)


def assert_finish_apart(d, max_new_tokens: int = 24) -> None:
    lengths = d.mask.sum(-1)
    assert len(set(lengths.tolist())) > 2 and (lengths < max_new_tokens).any()  # rows did finish, at different steps


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 1.0), (0, 0.8), (30, 0.9)])
def test_seeded_samples_equal_decode_groups(model, top_k, top_p):
    stops = list(range(0, VOCAB, 7))  # about one token in seven stops a row
    ref, got = both(model, PROMPTS, stops, top_k=top_k, top_p=top_p)
    assert_same(ref, got)
    assert_finish_apart(got)
    assert (got.logprobs_untruncated is not None) == (top_k > 0 or top_p < 1.0)
    assert len({tuple(r) for r in got.tokens[:4].tolist()}) > 1  # a group's rows are different draws


@pytest.mark.parametrize("prepack", [True, False])
def test_greedy_equals_decode_groups_with_groups_finishing_apart(model, prepack):
    ids, mask = left_pad(PROMPTS, 0)
    free = decode_groups(model, ids, mask, 1, 24, 1.0, [], 0, greedy=True)
    # stop on a token each prompt emits for the first time at a different step (the rows then end there)
    stops = []
    for row, end in zip(free.tokens.tolist(), (4, 12, 6)):
        first = next((t for t in range(end, 24) if row[t] not in row[:t] and row[t] not in stops), None)
        stops += [] if first is None else [row[first]]
    assert len(stops) >= 2
    ref, got = both(model, PROMPTS, stops, group_size=2, temperature=1.0, greedy=True, prepack=prepack)
    assert_same(ref, got)
    assert len(set(got.mask.sum(-1).tolist())) > 1 and got.mask.sum(-1).min() < 24
    assert ref.truncated.sum() < len(ref.truncated)


def test_no_stop_runs_every_row_to_the_end(model):
    ref, got = both(model, PROMPTS, [], max_new_tokens=10)
    assert_same(ref, got)
    assert got.truncated.all() and got.mask.all() and got.tokens.shape == (12, 10)


def test_text_stop_rule_ends_rows_as_in_decode_groups(model):
    """A stop rule on the text (decode.py's TextStop) is asked the same questions of the same tokens."""
    trigger = list(range(3, VOCAB, 5))
    rule = TextStop(rule=lambda text: text.count("a") >= 2, triggers=torch.tensor(trigger),
                    decode=lambda ids: "".join("a" if i in trigger else "b" for i in ids))
    ref, got = both(model, PROMPTS, [VOCAB - 1], stop_check=rule)
    assert_same(ref, got)
    assert_finish_apart(got)


def test_cache_is_reused_and_nothing_of_an_earlier_call_is_read(model):
    """One decoder, calls of different prompt widths within one capacity bucket and then another: each call equals a
    fresh decode_groups; the bucket's cache object is the one reused."""
    decoder, stops = StaticDecoder(), list(range(0, VOCAB, 7))
    for prompts in (PROMPTS, [[1, 2, 3, 4, 5, 6, 7, 8], [9], [4, 4]], PROMPTS):
        ref, got = both(model, prompts, stops, decoder=decoder)
        assert_same(ref, got)
    assert len(decoder._caches) == 1
    (cache,) = decoder._caches.values()
    assert cache.layers[0].keys.shape[-2] == CAPACITY_STEP  # 8 + 24 positions rounded up to one step of 64
    longer = [list(range(1, 46)), [7, 8], [9]]  # 45 + 24 > 64 positions: another shape
    ref, got = both(model, longer, stops, decoder=decoder)
    assert_same(ref, got)
    assert sorted(k[2] for k in decoder._caches) == [CAPACITY_STEP, 2 * CAPACITY_STEP]


def test_a_failing_compiled_step_falls_back_with_one_warning(model, monkeypatch):
    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("no compiler here\nsecond line")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    decoder = StaticDecoder(compile=True)
    with pytest.warns(RuntimeWarning, match=r"RuntimeError: no compiler here\); decoding eagerly") as caught:
        ref, got = both(model, PROMPTS, list(range(0, VOCAB, 7)), decoder=decoder)
    assert len(caught) == 1 and not decoder.compile
    assert_same(ref, got)  # the failed step's cache write was put back and rerun eagerly


def test_engine_static_decoders_equal_grpolab(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.rollout.base import SamplingParams
    from grpolab.rollout.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in ("What is 2 + 3?", "Hi")]
    params = SamplingParams(group_size=3, max_new_tokens=8, top_p=0.9)
    a = HFEngine(lm, tok, torch.float32, decoder="grpolab").generate(prompts, params, seeds=[1, 2])
    b = HFEngine(lm, tok, torch.float32, decoder="static").generate(prompts, params, seeds=[1, 2])
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert a.texts == b.texts and torch.equal(a.truncated, b.truncated)
    assert torch.allclose(a.sampler_logprobs, b.sampler_logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(a.sampler_logprobs_untruncated, b.sampler_logprobs_untruncated, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rollout.decoder: expected one of .*'static'.*got 'fast'"):
        HFEngine(lm, tok, torch.float32, decoder="fast")


@pytest.mark.slow
def test_compiled_step_samples_what_decode_groups_samples(model):
    """torch.compile (inductor) of the step: the same tokens; logprobs to float32 rounding of another kernel order."""
    decoder = StaticDecoder(compile=True)
    for kw in ({"top_k": 30, "top_p": 0.9}, {"greedy": True}):
        ref, got = both(model, PROMPTS, list(range(0, VOCAB, 7)), decoder=decoder, **kw)
        assert decoder.compile  # it did not fall back
        assert torch.equal(ref.tokens, got.tokens) and torch.equal(ref.mask, got.mask)
        assert torch.allclose(ref.logprobs, got.logprobs, atol=1e-4, rtol=0)
