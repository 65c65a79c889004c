"""LoRA runs on vLLM servers that sync only the adapter (rollout.lora_sync: adapter; grpolab/rollout/server_adapters.py).

On stand-in servers (tests/vllm_stand_in.py) that load peft adapter files as vLLM does: the base model goes once
through the weight transfer, each sync loads a new adapter per version and unloads the ones no generation uses,
requests name the version's adapter and are sampled by it, a sync leaves in-flight requests on their own adapter,
and servers that cannot serve the adapters are refused naming them. The real server (`make test-vllm`): after a sync
its log-probabilities follow the merged LoRA model and not the base.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from test_vllm_engine import needs_vllm, tiny_llama
from test_vllm_server import engine_on, matches, stand_in

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.server_engine import VLLMServerEngine

RANK = 8


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(t) for t in ("Hello there", "What is 2 + 2?", "Name a colour", "x")]


def lora_policy(tok, seed: int = 0):
    """A tiny Llama with rank-8 adapters on every linear layer of its blocks, B = 0 (the base model)."""
    import peft

    config = peft.LoraConfig(r=RANK, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                             "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")  # fmt: skip
    return peft.get_peft_model(tiny_llama(tok, seed=seed), config)


def train_adapter(policy, seed: int) -> None:
    """Stand-in for an update: every adapter tensor drawn anew (B != 0, so the model moves away from the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def merged(policy):
    """The plain model W + (alpha / r) B A of a LoRA policy (a fresh copy)."""
    return copy.deepcopy(policy).merge_and_unload()


def adapter_engine(policy, tok, servers, **kwargs) -> VLLMServerEngine:
    return engine_on(policy, tok, servers, lora_sync="adapter", **kwargs)


def test_each_sync_loads_the_adapter_only_and_requests_sample_with_it(tok, prompts):
    """The base goes once through the weight transfer (one update applied); each sync loads a new adapter and unloads
    the last; the servers then score as the merged model, not the base; every sample carries its adapter's version
    and the merged model's log-probabilities; a sync moves the adapter's bytes, not the model's."""
    policy = lora_policy(tok)
    servers = [stand_in(tok, seed=5, lora_rank=RANK), stand_in(tok, seed=6, lora_rank=RANK)]
    engine = adapter_engine(policy, tok, servers)
    seq = prompts[1] + tok.encode(" four, I think")
    base, v1, v2 = merged(policy), engine.adapters.name(1), engine.adapters.name(2)
    try:
        assert [s.applied for s in servers] == [1, 1] and [s.adapter_loads for s in servers] == [[v1]] * 2
        assert all(matches(engine, base, seq, i) for i in range(2))
        train_adapter(policy, seed=1)
        engine.sync_weights(policy)
        trained = merged(policy)
        for s in servers:
            assert s.applied == 1 and s.adapter_loads == [v1, v2] and list(s.adapters) == [v2]
        for i in range(2):
            assert matches(engine, trained, seq, i) and not matches(engine, base, seq, i), f"server {i}"
        lora_bytes = sum(p.numel() * 4 for n, p in policy.named_parameters() if "lora_" in n)
        assert lora_bytes < engine.last_sync["server/0/bytes"] < lora_bytes + 8192  # + the safetensors header
        assert engine.last_sync["bytes"] == 2 * engine.last_sync["server/0/bytes"]
        r = engine.generate(
            prompts, SamplingParams(group_size=2, max_new_tokens=6, temperature=0.8), seeds=[1, 2, 3, 4]
        )
        assert r.weight_versions == ["2"] * 8 and (r.token_versions[r.completion_mask.bool()] == 1).all()
        for j in range(8):
            ids = r.completion_ids[j][r.completion_mask[j].bool()].tolist()
            assert matches_sampled(trained, prompts[j // 2], ids, r.sampler_logprobs[j, : len(ids)])
    finally:
        engine.close()
        for s in servers:
            s.close()


def matches_sampled(model, prompt, completion, logprobs, temperature: float = 0.8) -> bool:
    from test_vllm_engine import LOGP_ATOL, reference_logprobs

    diff = logprobs.double() - reference_logprobs(model, prompt, completion, temperature)
    return diff.abs().max().item() < LOGP_ATOL


def test_a_generation_in_flight_keeps_its_adapter_across_a_sync(tok, prompts):
    """A generation sent at version 1 and still running when version 2 loads is sampled wholly by version 1 (its
    completions labelled 1); version 1 stays loaded while it runs and is unloaded at the next sync after it ended."""
    policy = lora_policy(tok)
    server = stand_in(tok, seed=5, lora_rank=RANK)
    engine = adapter_engine(policy, tok, [server])
    try:
        server.hang = 1.5  # every request waits before sampling: the sync below falls inside the generation
        pending = engine.submit(prompts[:2], SamplingParams(group_size=2, max_new_tokens=4, temperature=0.8), [1, 2])
        train_adapter(policy, seed=1)
        engine.sync_weights(policy)
        assert list(server.adapters) == [engine.adapters.name(1), engine.adapters.name(2)]  # v1 still samples
        r = engine.finish(pending)
        assert r.weight_versions == ["1"] * 4 and (r.token_versions[r.completion_mask.bool()] == 0).all()
        server.hang = 0.0
        engine.sync_weights(policy)
        assert list(server.adapters) == [engine.adapters.name(3)]
    finally:
        engine.close()
        server.close()


def test_truncated_sampling_scores_with_the_version_s_adapter(tok, prompts):
    """Top-k sampling: the untruncated log-probabilities (a second, scoring request) come from the same adapter as
    the samples, the merged model's and not the base's."""
    policy = lora_policy(tok)
    server = stand_in(tok, seed=5, lora_rank=RANK)
    engine = adapter_engine(policy, tok, [server])
    try:
        base = merged(policy)
        train_adapter(policy, seed=1)
        engine.sync_weights(policy)
        trained = merged(policy)
        r = engine.generate(
            prompts[:2], SamplingParams(group_size=2, max_new_tokens=5, temperature=1.0, top_k=2), [1, 2]
        )
        for j in range(4):
            ids = r.completion_ids[j][r.completion_mask[j].bool()].tolist()
            untruncated = r.sampler_logprobs_untruncated[j, : len(ids)]
            assert matches_sampled(trained, prompts[j // 2], ids, untruncated, temperature=1.0)
            assert not matches_sampled(base, prompts[j // 2], ids, untruncated, temperature=1.0)
    finally:
        engine.close()
        server.close()


def test_a_second_run_on_the_same_server_loads_its_own_names(tok):
    """Closing an engine unloads its adapters; a later engine on the same server (a resume, another run) names its
    versions apart, so vLLM's refusal of a name loaded twice never meets it."""
    server = stand_in(tok, seed=5, lora_rank=RANK)
    try:
        first = adapter_engine(lora_policy(tok), tok, [server])
        names = [first.adapters.name(1)]
        first.close()
        assert server.adapters == {}
        second = adapter_engine(lora_policy(tok), tok, [server])
        names.append(second.adapters.name(1))
        second.close()
        assert names[0] != names[1] and server.adapter_loads == names and server.adapters == {}
    finally:
        server.close()


@pytest.mark.parametrize(
    "knobs, message",
    [
        (
            {},
            r"serves no LoRA adapters; start it with --enable-lora --max-lora-rank 8 and "
            r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, or set rollout.lora_sync: merged",
        ),  # fmt: skip
        ({"lora_rank": 4}, r"serves LoRA ranks up to 4; the run's is 8: start it with --max-lora-rank 8"),
    ],
)
def test_a_server_that_cannot_serve_the_adapter_is_refused_naming_it(tok, knobs, message):
    server = stand_in(tok, **knobs)
    try:
        with pytest.raises(GrpolabError, match=rf"^rollout.servers: {server.url} {message}"):
            adapter_engine(lora_policy(tok), tok, [server])
    finally:
        server.close()


def test_merged_sync_still_sends_the_whole_model(tok, prompts):
    """rollout.lora_sync: merged: every sync is the merged model through the weight transfer, no adapter loaded."""
    policy = lora_policy(tok)
    server = stand_in(tok, seed=5, lora_rank=RANK)
    engine = engine_on(policy, tok, [server], lora_sync="merged")
    try:
        train_adapter(policy, seed=1)
        engine.sync_weights(policy)
        assert server.applied == 2 and server.adapter_loads == []
        assert matches(engine, merged(policy), prompts[1] + tok.encode(" four"), 0)
    finally:
        engine.close()
        server.close()


@needs_vllm
def test_a_served_adapter_follows_the_trainer(tok, prompts, tmp_path):
    """A real `vllm serve` started for adapters: after the adapter changes and syncs, its teacher-forced
    log-probabilities equal the merged model's and not the base's; the next sync unloads the old version."""
    policy = lora_policy(tok)
    seq = prompts[1] + tok.encode(" four, I think")
    engine = VLLMServerEngine(policy, tok, torch.float32, num_servers=1, max_model_len=256, log_dir=tmp_path,
                              lora_sync="adapter")  # fmt: skip
    base = merged(policy)
    try:
        assert matches(engine, base, seq, 0)
        train_adapter(policy, seed=1)
        engine.sync_weights(policy)
        trained = merged(policy)
        assert matches(engine, trained, seq, 0) and not matches(engine, base, seq, 0)
        served = [m["id"] for m in engine.clients[0].get("/v1/models")["data"]]
        assert engine.adapters.name(2) in served and engine.adapters.name(1) not in served, served
    finally:
        engine.close()


@pytest.mark.parametrize(
    "rollout, message",
    [
        ({"adapter_dir": "/nonexistent/adapters"}, r"rollout.adapter_dir: expected an existing directory"),
        ({"lora_sync": "delta"}, r"rollout.lora_sync: .*'adapter'.*'merged'.*delta"),
    ],
)
def test_lora_sync_settings_are_checked_naming_the_field(rollout, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"rollout": {"engine": "vllm_server", **rollout}})
    assert from_dict({"rollout": {"engine": "vllm_server"}}).rollout.lora_sync == "merged"


@pytest.mark.parametrize("max_loras, warned", [(1, True), (3, False)])
def test_a_server_batching_too_few_adapters_is_warned_of(tok, caplog, max_loras, warned):
    """With rollout.max_staleness 2 up to 3 versions sample at once: a server that batches fewer adapters is slower,
    not wrong, so a warning names --max-loras, and none when it holds enough."""
    server = stand_in(tok, lora_rank=RANK, max_loras=max_loras)
    try:
        with caplog.at_level(logging.WARNING, logger="grpolab"):
            adapter_engine(lora_policy(tok), tok, [server], adapter_slots=4).close()
        found = [r.getMessage() for r in caplog.records if "--max-loras" in r.getMessage()]
        assert found == ([f"rollout.servers: {server.url} batches 1 LoRA adapter(s) at once; up to 3 versions sample "
                          "together here (rollout.max_staleness + 1): start it with --max-loras 4"] if warned else [])  # fmt: skip
    finally:
        server.close()
