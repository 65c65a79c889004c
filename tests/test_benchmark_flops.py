"""benchmarks/common.py: the FLOP count of a GRPO step against a hand count for a tiny Llama config."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "common.py"


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("grpolab_bench_common", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def tiny_config(tie: bool = True):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )


# Hand count of tiny_config(): per layer q 32*32 + k 32*16 + v 32*16 + o 32*32 = 3072, MLP 3*32*64 = 6144,
# two RMSNorms 2*32 = 64 -> 9280; two layers + the final norm (32) -> 18592. LM head 100*32 = 3200. d_attn = 4*8 = 32.
N_BODY, N_HEAD, LAYERS, D_ATTN = 18592, 3200, 2, 32


def test_shape_from_config_matches_hand_count(common):
    s = common.ModelShape.from_config(tiny_config())
    assert (s.n_body, s.n_head, s.n_layers, s.d_attn, s.d_model, s.vocab) == (N_BODY, N_HEAD, LAYERS, D_ATTN, 32, 100)


@pytest.mark.parametrize("tie", [True, False])
def test_shape_from_model_matches_config(common, tie):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(tie))
    assert common.ModelShape.from_model(model) == common.ModelShape.from_config(tiny_config(tie))


def test_smollm2_135m_non_embedding_parameters(common):
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        tie_word_embeddings=True,
    )
    s = common.ModelShape.from_config(cfg)
    # per layer: q 576*576, k and v 576*192 each, o 576*576, MLP 3*576*1536, norms 2*576
    per_layer = 331776 + 2 * 110592 + 331776 + 2654208 + 1152
    assert s.n_body == 30 * per_layer + 576 == 106_203_456
    assert s.n_head == 49152 * 576


def test_sequence_forward_flops_hand_count(common):
    s = common.ModelShape.from_config(tiny_config())
    # prompt 3 + completion 2: inputs at positions 0..3 (4 tokens), logits at 2 positions,
    # keys attended 1 + 2 + 3 + 4 = 10 -> attention 4 * layers * d_attn * 10
    expected = 2 * N_BODY * 4 + 2 * N_HEAD * 2 + 4 * LAYERS * D_ATTN * 10
    assert expected == 164096
    assert common.sequence_forward_flops(s, 3, 2) == expected
    with pytest.raises(ValueError):
        common.sequence_forward_flops(s, 3, 0)


def test_step_flops_hand_count(common):
    s = common.ModelShape.from_config(tiny_config())
    # one group of G = 2 on a 3-token prompt, completions of 2 and 1 tokens
    seq1 = 2 * N_BODY * 4 + 2 * N_HEAD * 2 + 4 * LAYERS * D_ATTN * (1 + 2 + 3 + 4)
    seq2 = 2 * N_BODY * 3 + 2 * N_HEAD * 1 + 4 * LAYERS * D_ATTN * (1 + 2 + 3)
    f = common.step_flops(s, [3, 3], [2, 1], group_size=2)
    assert f == {
        "generation": seq1 + seq2,
        "reference": seq1 + seq2,
        "policy": 3 * (seq1 + seq2),
        "total": 5 * (seq1 + seq2),
    }
    assert f["total"] == 1417920
    no_ref = common.step_flops(s, [3, 3], [2, 1], group_size=2, with_reference=False)
    assert no_ref["reference"] == 0 and no_ref["total"] == 4 * (seq1 + seq2)
    # shared prompt: the prompt (positions 0..2, one logit) once, then each completion's own inputs:
    # sequence 1 adds position 3 (1 token, keys 4) and its 1 remaining logit; sequence 2 adds nothing
    prompt = 2 * N_BODY * 3 + 2 * N_HEAD * 1 + 4 * LAYERS * D_ATTN * (1 + 2 + 3)
    rest1 = 2 * N_BODY * 1 + 2 * N_HEAD * 1 + 4 * LAYERS * D_ATTN * 4
    shared = common.step_flops(s, [3, 3], [2, 1], group_size=2, share_prompt=True)
    assert shared["generation"] == prompt + rest1
    # with G = 1, sharing changes nothing
    assert common.step_flops(s, [3], [2], 1, share_prompt=True) == common.step_flops(s, [3], [2], 1)
    with pytest.raises(ValueError):
        common.step_flops(s, [3, 3, 3], [2, 1, 1], group_size=2)


def test_attention_matches_kaplan_on_average(common):
    """Summed over a causal sequence, 4 * (p + 1) * d_attn per layer equals Kaplan's 2 * n_ctx * d_attn per token
    (up to the +1 of each token attending to itself)."""
    s = common.ModelShape(n_layers=1, d_model=8, d_attn=8, vocab=10, n_body=0, n_head=0)
    n_ctx = 1000
    ours = common.span_flops(s, 0, n_ctx, 0)
    kaplan = 2 * n_ctx * 8 * n_ctx
    assert math.isclose(ours, kaplan, rel_tol=2 / n_ctx)


def test_linear_fit_and_median(common):
    f = common.linear_fit([1.0, 2.0, 4.0], [2.5, 4.5, 8.5])
    assert math.isclose(f["slope"], 2.0) and math.isclose(f["intercept"], 0.5) and math.isclose(f["r2"], 1.0)
    assert math.isnan(common.linear_fit([1.0], [1.0])["slope"])
    assert common.median([3, 1, 2]) == 2 and common.median([4, 1, 2, 3]) == 2.5


def test_matmul_rate_is_positive(common):
    import torch

    assert common.matmul_rate(16, 16, 16, torch.float32, min_seconds=0.0, min_reps=2) > 0


def test_decode_floor_bytes_per_step_by_hand(common):
    """benchmarks/decode_floor.py: every parameter once (a tied head once) + the KV cache of G rows at the context."""
    import torch
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(PATH.parent))
    spec = importlib.util.spec_from_file_location("grpolab_bench_decode_floor", PATH.parent / "decode_floor.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    model = LlamaForCausalLM(tiny_config(tie=True))
    # per layer: q 32x32, k 32x16, v 32x16, o 32x32, gate/up 32x64 each, down 64x32, two norms of 32
    layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32
    params = 100 * 32 + 2 * layer + 32  # embedding (tied head) + 2 layers + final norm
    kv = 2 * 2 * 8 * 10 * 2 * 8  # layers x (K, V) x G x context x kv heads x head_dim
    assert floor.step_bytes(model, 8, 10, torch.float32) == (params + kv) * 4
    assert floor.step_bytes(model, 8, 10, torch.bfloat16) == (params + kv) * 2
