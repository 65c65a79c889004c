"""The one sampling loop (rollout/decode.py's sample_loop) shared by generation and agent turns, and the decoders
that were removed (`rollout.decoder: static | static_compiled`): asking for one is an error that names the removal.

Everything runs a tiny randomly initialised Llama in float32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.rollout.decode import SamplingLoop, decode_groups, sample_loop
from grpolab.rollout.grpolab_engine import GrpolabEngine, left_pad

VOCAB = 300
PROMPTS = [[5, 17, 42, 9, 11, 3], [7, 8], [9, 10, 11]]  # three widths: left padding of 0, 4 and 3 positions
STOPS = list(range(0, VOCAB, 7))  # about one token in seven stops a row


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(config).float().eval()


def generators(n: int = len(PROMPTS)) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(10 + g) for g in range(n)]


@pytest.mark.parametrize("removed", ["static", "static_compiled"])
def test_a_config_asking_for_a_removed_decoder_names_the_removal(removed):
    with pytest.raises(
        ConfigError,
        match=rf"rollout.decoder: expected one of 'grpolab', 'hf', got '{removed}' "
        rf"\(the '{removed}' decoder was removed: .*docs/performance.md",
    ):
        from_dict({"rollout": {"decoder": removed}})


def test_an_unknown_decoder_is_not_called_removed():
    with pytest.raises(ConfigError) as caught:
        from_dict({"rollout": {"decoder": "fast"}})
    assert str(caught.value) == "rollout.decoder: expected one of 'grpolab', 'hf', got 'fast'"
    with pytest.raises(ConfigError, match=r"got \['static'\]$"):  # an unhashable value: the plain message
        from_dict({"rollout": {"decoder": ["static"]}})


def test_the_engine_refuses_a_removed_decoder_naming_the_removal(model):
    with pytest.raises(
        ValueError,
        match="expected one of 'grpolab', 'hf', got 'static_compiled' "
        r"\('static_compiled' was removed: .*docs/performance.md",
    ):
        GrpolabEngine(model, None, torch.float32, decoder="static_compiled")
    with pytest.raises(ValueError, match="got 'fast'$"):
        GrpolabEngine(model, None, torch.float32, decoder="fast")


def prefilled(model, group_size: int):
    """decode_groups' prefill of PROMPTS: (logits [N, V], cache, attention mask [N, W]) with N = 3 * group_size."""
    ids, mask = left_pad(PROMPTS, 0)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
    )
    out.past_key_values.batch_repeat_interleave(group_size)
    return (
        out.logits[:, -1].repeat_interleave(group_size, dim=0),
        out.past_key_values,
        mask.repeat_interleave(group_size, dim=0),
    )


@pytest.mark.parametrize("compact", [True, False])
def test_on_stop_sees_each_stopping_row_once_while_its_keys_are_still_in_the_cache(model, compact):
    """The hook agent turns use to keep an episode's cache: called every step with exactly the rows that stopped at
    that step (output row r at step length_r - 1, never a truncated row), while the cache still holds every batch
    row (its batch size is the hook's row count) and the row's attention mask covers what the cache holds."""
    group_size, width = 4, 24
    logits, cache, attn = prefilled(model, group_size)
    seen: list[tuple[int, int]] = []  # (output row, step)
    step = {"t": -1}

    def hook(cache, stopped, rows, attn):
        step["t"] += 1
        assert stopped.shape == rows.shape and attn.shape[0] == rows.shape[0]
        assert cache.layers[0].keys.shape[0] == rows.shape[0]
        assert attn.shape[1] == len(PROMPTS[0]) + step["t"]  # prompt width + tokens fed so far
        seen.extend((int(rows[b]), step["t"]) for b in stopped.nonzero().flatten().tolist())

    loop = SamplingLoop(width, 0.9, STOPS, 0, group_size=group_size, generators=generators(), compact=compact)
    with torch.no_grad():
        d = sample_loop(model, logits, cache, attn, loop, on_stop=hook)
    lengths = d.mask.sum(-1)
    assert sorted(seen) == sorted((r, int(lengths[r]) - 1) for r in range(len(lengths)) if not d.truncated[r])
    assert len({s for _, s in seen}) > 2  # rows did stop, at different steps
    ref = decode_groups(model, *left_pad(PROMPTS, 0), group_size, width, 0.9, STOPS, 0, generators=generators())
    assert torch.equal(d.tokens, ref.tokens) and torch.equal(d.logprobs, ref.logprobs)  # the same loop, bitwise


def test_the_result_is_assembled_to_the_longest_row_with_pads_after_each_stop(model):
    """Tokens and log-probabilities are cut to the longest row; past a row's stop token: pad id, mask 0, logprob 0;
    truncated = no stop token sampled. Hand-checked against the stop set."""
    logits, cache, attn = prefilled(model, 2)
    loop = SamplingLoop(16, 1.0, STOPS, pad_id=VOCAB - 1, top_k=20, group_size=2, generators=generators())
    with torch.no_grad():
        d = sample_loop(model, logits, cache, attn, loop)
    lengths = d.mask.sum(-1)
    assert d.tokens.shape == d.logprobs.shape == d.logprobs_untruncated.shape == (6, int(lengths.max()))
    for r, n in enumerate(lengths.tolist()):
        row = d.tokens[r].tolist()
        assert not any(t in STOPS for t in row[: n - 1])  # no stop token before the last sampled one
        assert bool(d.truncated[r]) == (row[n - 1] not in STOPS)
        assert all(t == VOCAB - 1 for t in row[n:]) and (d.logprobs[r, n:] == 0).all()
        assert (d.logprobs[r, :n] <= 0).all() and (d.logprobs[r, :n] >= d.logprobs_untruncated[r, :n]).all()
