"""The sampler side of the sampler/trainer contract.

- the recorded sampler logprob is that of the distribution actually sampled (temperature, then top-k, then top-p,
  as Hugging Face's own warpers compute it) for both decoders, and the untruncated one is kept beside it;
- the importance weight uses the sampled distribution, the mismatch metric the untruncated one;
- `frozen_copy` leaves the global RNG alone and copies weights, tied weights and (non-persistent) buffers exactly;
- `GrpolabEngine.sync_weights` copies by name, whatever the registration order, and names a missing key;
- the decode loop does not import the training forward.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from grpolab.models.load import frozen_copy
from grpolab.rollout.base import Rollout, SamplingParams, concat_rollouts
from grpolab.rollout.decode import sample_tokens
from grpolab.rollout.grpolab_engine import GrpolabEngine

T, TOP_K, TOP_P = 0.7, 20, 0.87


def hf_warpers(temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    """Hugging Face's sampling warpers in the order `generate` applies them: temperature, top-k, top-p."""
    procs = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


@pytest.fixture
def float64_rmsnorm(monkeypatch):
    """HF's RMSNorm computes in float32 whatever the model dtype; this is its formula in the input's dtype."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(LlamaRMSNorm, "forward", forward)


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir, one_thread):
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


def teacher_forced_logits(model, rollout: Rollout, i: int) -> torch.Tensor:
    """[Lc_i, V] float64 logits predicting row i's completion tokens, from one unpadded forward of that row."""
    prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()]
    n = int(rollout.completion_mask[i].sum())
    ids = torch.cat([prompt, rollout.completion_ids[i, :n]]).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    return logits[len(prompt) - 1 : len(prompt) - 1 + n]


# ------------------------------------------------------------------------------------ one decode step


@pytest.mark.parametrize("top_k, top_p", [(0, 0.6), (5, 1.0), (3, 0.8), (8, 0.5)])
def test_sample_tokens_records_the_logprob_of_the_warped_distribution(top_k, top_p):
    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(3)) * 2
    u = torch.rand(64, generator=torch.Generator().manual_seed(4))
    tok, lp, lp_full = sample_tokens(logits, T, u, top_k, top_p)
    warped = hf_warpers(T, top_k, top_p)(None, logits.double())
    ref = torch.log_softmax(warped, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    ref_full = torch.log_softmax(logits.double() / T, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    assert torch.isfinite(ref).all()  # every sampled token is one HF's warpers keep
    assert torch.allclose(lp.double(), ref, atol=2e-6, rtol=0)
    assert torch.allclose(lp_full.double(), ref_full, atol=2e-6, rtol=0)
    assert float((ref - ref_full).min()) > 1e-3 and float((ref - ref_full).mean()) > 0.1  # truncation changed them


def test_sample_tokens_without_truncation_returns_one_tensor():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(5))
    tok, lp, lp_full = sample_tokens(logits, T, torch.rand(5), top_k=0, top_p=1.0)
    assert lp is lp_full  # no second pass and no second tensor
    tok, lp, lp_full = sample_tokens(logits, T, torch.rand(5), top_k=40, top_p=1.0)  # k = V keeps everything
    assert lp is lp_full


# ------------------------------------------------------------------------------------------ both decoders


@pytest.mark.parametrize("decoder", ["grpolab", "hf"])
def test_recorded_logprobs_are_those_of_the_hf_warped_distribution(tiny_lm, float64_rmsnorm, decoder):
    model, tok = tiny_lm
    prompts = prompts_of(tok, ["What is 2 + 3?", "Hi there"])
    params = SamplingParams(group_size=3, temperature=T, top_k=TOP_K, top_p=TOP_P, max_new_tokens=6)
    torch.manual_seed(0)
    r = GrpolabEngine(model, tok, torch.float64, decoder=decoder).generate(prompts, params)
    warp = hf_warpers(T, TOP_K, TOP_P)
    checked = 0
    for i in range(len(r)):
        logits = teacher_forced_logits(model, r, i)
        n, toks = logits.shape[0], r.completion_ids[i, : logits.shape[0]].unsqueeze(-1)
        ref = torch.log_softmax(warp(None, logits.clone()), -1).gather(-1, toks).squeeze(-1)
        ref_full = torch.log_softmax(logits / T, -1).gather(-1, toks).squeeze(-1)
        assert torch.isfinite(ref).all()
        assert torch.allclose(r.sampler_logprobs[i, :n].double(), ref, atol=1e-5, rtol=0)
        assert torch.allclose(r.untruncated_logprobs()[i, :n].double(), ref_full, atol=1e-5, rtol=0)
        assert float((ref - ref_full).min()) > 1.0  # 20 of ~49k tokens kept: the two differ by nats
        checked += n
    assert checked >= 12 and r.sampler_logprobs_untruncated is not None


@pytest.mark.parametrize("decoder", ["grpolab", "hf"])
def test_without_truncation_one_logprob_tensor_is_recorded(tiny_lm, decoder):
    model, tok = tiny_lm
    params = SamplingParams(group_size=2, temperature=T, max_new_tokens=3)
    r = GrpolabEngine(model, tok, torch.float64, decoder=decoder).generate(prompts_of(tok, ["Hi"]), params)
    assert r.sampler_logprobs_untruncated is None and r.untruncated_logprobs() is r.sampler_logprobs
    assert torch.isfinite(r.sampler_logprobs).all() and (r.sampler_logprobs[r.completion_mask.bool()] < 0).all()


def test_importance_weight_uses_the_untruncated_sampler_distribution(tiny_model_dir, one_thread):
    """On-policy sampling with top-k/top-p: the trainer's pi_old equals the untruncated sampler logprob (mismatch
    ~0), so the token_truncate weight pi_old / q is 1 with q the untruncated softmax(logits / T); the truncated
    distribution would shift every weight by the kept mass (far below 1 here: what the weight used to be)."""
    from grpolab.config import from_dict
    from grpolab.training.update import PolicyUpdater

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    cfg = from_dict(
        {
            "rollout": {
                "group_size": 3,
                "max_new_tokens": 5,
                "temperature": T,
                "top_k": TOP_K,
                "top_p": TOP_P,
                "dtype": "float32",
            },
            "algorithm": {"beta": 0.0, "is_mode": "token_truncate", "is_c_max": 2.0},
            "train": {"micro_batch_size": 6},
        }
    )
    params = SamplingParams(group_size=3, temperature=T, top_k=TOP_K, top_p=TOP_P, max_new_tokens=5)
    torch.manual_seed(1)
    rollout = GrpolabEngine(policy, tok, torch.float64).generate(prompts_of(tok, ["What is 2 + 3?", "Hi"]), params)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    updater = PolicyUpdater(cfg, policy, None, optimizer, scheduler)
    old = updater.logprobs_no_grad(policy, rollout, "fp32")
    m = rollout.completion_mask.bool()
    metrics = updater.update(
        rollout, torch.tensor([1.0, -1, 0.5, -0.5, 0.2, -0.2], dtype=torch.float64), torch.ones(6, dtype=torch.bool)
    )
    expected_w = torch.exp(old - rollout.untruncated_logprobs().double()).clamp(max=2.0)[m]
    assert float((expected_w - 1).abs().max()) < 1e-4  # on-policy: w = 1 up to rounding
    truncated_w = torch.exp(old - rollout.sampler_logprobs.double())[m]
    assert float(truncated_w.max()) < 0.01  # the truncated q is far above pi_old: the kept mass would shift w
    assert metrics["sampler/is_weight_mean"] == pytest.approx(float(expected_w.mean()), rel=1e-4)
    assert metrics["sampler/is_weight_max"] == pytest.approx(float(expected_w.max()), rel=1e-4)
    assert metrics["sampler/logp_diff_max"] < 1e-4  # like with like: trainer vs untruncated sampler logprobs


def test_select_and_concat_carry_the_untruncated_logprobs():
    def rollout(n, lc, untrunc):
        lp = -torch.rand(n, lc)
        return Rollout(
            torch.ones(n, 2, dtype=torch.long),
            torch.ones(n, 2, dtype=torch.long),
            torch.ones(n, lc, dtype=torch.long),
            torch.ones(n, lc, dtype=torch.long),
            lp,
            torch.zeros(n, dtype=torch.bool),
            torch.arange(n),
            [""] * n,
            lp - 1.0 if untrunc else None,
        )

    a, b = rollout(2, 3, True), rollout(3, 2, False)
    assert torch.equal(a.select([1]).sampler_logprobs_untruncated, a.sampler_logprobs_untruncated[[1]])
    assert b.select([0, 2]).sampler_logprobs_untruncated is None
    assert b.untruncated_logprobs() is b.sampler_logprobs
    both = concat_rollouts([a, b], pad_id=0)
    assert torch.equal(both.sampler_logprobs_untruncated[:2], a.sampler_logprobs_untruncated)
    assert torch.equal(both.sampler_logprobs_untruncated[2:, :2], b.sampler_logprobs)  # None: the sampled ones
    assert (both.sampler_logprobs_untruncated[2:, 2:] == 0).all()
    assert concat_rollouts([b, b], pad_id=0).sampler_logprobs_untruncated is None


# ------------------------------------------------------------------------------------------ frozen_copy


def small_llama(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frozen_copy_leaves_the_global_rng_and_copies_exactly(one_thread, dtype):
    model = small_llama()
    config_dtype = model.config.dtype
    torch.manual_seed(123)
    before = torch.get_rng_state()
    c = frozen_copy(model, dtype)
    assert torch.equal(torch.get_rng_state(), before)
    assert not c.training and c.lm_head.weight is c.model.embed_tokens.weight  # eval mode, still tied
    assert model.config.dtype == config_dtype  # the policy's config is left as it was
    # what the old construction (random init from the config, then the weights) builds, buffers included
    old_way = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=dtype)
    old_way.load_state_dict(model.state_dict())
    old_way.eval()
    ours, theirs = dict(c.named_buffers()), dict(old_way.named_buffers())
    assert ours.keys() == theirs.keys() and "model.rotary_emb.inv_freq" in ours
    for name, buf in theirs.items():
        assert ours[name].dtype == buf.dtype and torch.equal(ours[name], buf), name
    assert ours["model.rotary_emb.inv_freq"].dtype == torch.float32  # rotary frequencies keep their precision
    for name, p in old_way.named_parameters():
        q = c.get_parameter(name)
        assert q.dtype == dtype and torch.equal(q, p), name
        assert q.data_ptr() != model.get_parameter(name).data_ptr()  # a copy, not the policy's storage
    ids = torch.randint(0, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(c(input_ids=ids).logits, old_way(input_ids=ids).logits)
        if dtype == torch.float32:
            assert torch.equal(c(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


# ------------------------------------------------------------------------------------------ sync_weights


def engine_for(policy) -> GrpolabEngine:
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    engine = GrpolabEngine(policy, tok, torch.float64)
    assert engine.own_copy
    return engine


def reorder(module: torch.nn.Module, names: list[str]) -> None:
    """Re-register the children of `module` in the given order: same names, another parameter order."""
    children = dict(module._modules)
    module._modules.clear()
    for n in names:
        module._modules[n] = children[n]


def test_sync_weights_goes_by_name_not_by_position(one_thread):
    policy = small_llama()
    engine = engine_for(policy)
    for layer in policy.model.layers:  # k and v have the same shape: a positional copy would swap them silently
        reorder(layer.self_attn, ["q_proj", "v_proj", "k_proj", "o_proj"])
    reorder(policy.model.layers, ["1", "0"])  # the two layers too
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p))
    engine.sync_weights(policy)
    names = [n for n, _ in policy.named_parameters()]
    assert names != [n for n, _ in engine.model.named_parameters()]  # the orders do differ
    for name, p in policy.named_parameters():
        assert torch.equal(engine.model.get_parameter(name), p.double()), name
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    assert torch.equal(engine.model.lm_head.weight, policy.lm_head.weight.double())


def test_sync_weights_names_a_missing_key(one_thread):
    policy = small_llama()
    engine = engine_for(policy)
    policy.model.layers[1].post_attention_layernorm.register_parameter("bias", torch.nn.Parameter(torch.zeros(32)))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.post_attention_layernorm\.bias"):
        engine.sync_weights(policy)
    del policy.model.layers[1].post_attention_layernorm.bias
    del policy.model.layers[0].mlp.up_proj.weight  # now the copy has one the policy lacks
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight"):
        engine.sync_weights(policy)


# ------------------------------------------------------------------------------------------ layering


def test_the_rollout_package_does_not_import_the_training_modules():
    root = Path(__file__).resolve().parents[1] / "grpolab"
    training = {"grpolab.training.forward", "grpolab.training.update", "grpolab.training.trainer"}
    for path in sorted((root / "rollout").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = "grpolab.rollout".rsplit(".", node.level - 1)[0] if node.level else ""
                target = f"{base}.{node.module}" if base and node.module else base or node.module
                names = {target} | {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            assert not names & training, f"{path.name} imports {names & training}"
