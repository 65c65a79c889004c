"""vLLM servers as the rollout engine (rollout.engine vllm_server: grpolab/rollout/server_engine.py, servers.py,
weight_transfer.py, the vLLM plugin in vllm_plugin/; docs/vllm.md).

Two kinds of server. Stand-ins (tests/vllm_stand_in.py: torch only, on 127.0.0.1, opened by the test) answer the
routes the engine uses and receive the weights over the same gloo group, so the engine's checks, its spreading of
requests, its syncs to every server and its bounds are tested in every suite. The real ``vllm serve`` (grpolab's
own start of it from ``.venv-vllm``, with grpolab's plugin) is tested where that environment exists (``make
test-vllm``; skipped with the reason elsewhere): tokens, logprobs and syncs against the trainer's weights, and a
run. Models: test_vllm_engine's tiny Llama (head size 32, which the CPU build's attention kernels take).
"""

from __future__ import annotations

import json
import socket

import pytest
import torch
from test_vllm_engine import HAS_VLLM, LOGP_ATOL, reference_logprobs, rows, tiny_llama
from vllm_stand_in import StandIn

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import GrpolabEngine
from grpolab.rollout.server_engine import VLLMServerEngine
from grpolab.runs import check_server_version

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM's environment is absent: `make install-vllm` creates it")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def policy(tok):
    return tiny_llama(tok, seed=0)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(t) for t in ("Hello there", "What is 2 + 2?", "Name a colour", "x")]


def stand_in(tok, seed: int = 0, **knobs) -> StandIn:
    return StandIn(tiny_llama(tok, seed=seed), tok, **knobs)


def engine_on(policy, tok, servers, **kwargs) -> VLLMServerEngine:
    return VLLMServerEngine(policy, tok, torch.float32, servers=[s.url for s in servers], max_model_len=256,
                            call_timeout=kwargs.pop("call_timeout", 60.0), **kwargs)  # fmt: skip


def matches(engine, model, seq: list[int], server: int) -> bool:
    """The engine's server `server` scores `seq` as `model` does (float64 reference, fp32 tolerance)."""
    got = engine.score([seq], server=server)[0].double()
    return (got - reference_logprobs(model, seq[:1], seq[1:], 1.0)).abs().max().item() < LOGP_ATOL


# ---------------------------------------------------------------------------------------------- stand-in servers


def test_every_sync_lands_on_every_server(policy, tok, prompts):
    """Two servers that start with other weights: the engine's first sync gives both the policy's; a sync of other
    weights moves both (each server's scores equal the new model's and differ from the old); last_sync has bytes and
    seconds per server; each server reports the version synced."""
    servers = [stand_in(tok, seed=5), stand_in(tok, seed=6)]
    engine = engine_on(policy, tok, servers)
    other = tiny_llama(tok, seed=1)
    seq = prompts[1] + tok.encode(" four, I think")
    try:
        assert all(matches(engine, policy, seq, i) for i in range(2))
        engine.sync_weights(other)
        for i in range(2):
            assert matches(engine, other, seq, i) and not matches(engine, policy, seq, i), f"server {i}"
        size = sum(p.numel() * 4 for _, p in other.named_parameters(remove_duplicate=False))
        assert engine.last_sync["server/0/bytes"] == engine.last_sync["server/1/bytes"] == size
        assert engine.last_sync["bytes"] == 2 * size and engine.last_sync["server/1/s"] > 0
        assert [s.weight_version for s in servers] == ["2", "2"] and [s.applied for s in servers] == [2, 2]
    finally:
        engine.close()
        for s in servers:
            s.close()


def test_requests_spread_and_versions_recorded(policy, tok, prompts):
    """Prompt i goes to server i mod 2; every sample carries the weight version that sampled it; greedy tokens equal
    grpolab's decoder's."""
    servers = [stand_in(tok), stand_in(tok)]
    engine = engine_on(policy, tok, servers)
    try:
        params = SamplingParams(greedy=True, max_new_tokens=6)
        before = [s.requests for s in servers]  # the checks' probe request included
        got = engine.generate(prompts, params)
        assert [s.requests - n for s, n in zip(servers, before)] == [2, 2]
        assert rows(got) == rows(GrpolabEngine(policy, tok, torch.float32).generate(prompts, params))
        assert got.weight_versions == ["1"] * 4
        engine.sync_weights(policy)
        sampled = engine.generate(prompts[:2], SamplingParams(group_size=3, max_new_tokens=4, temperature=0.8), [1, 2])
        assert sampled.weight_versions == ["2"] * 6 and sampled.select([5, 0]).weight_versions == ["2", "2"]
        assert torch.isfinite(sampled.sampler_logprobs[sampled.completion_mask.bool()]).all()
    finally:
        engine.close()
        for s in servers:
            s.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"rl_api": False}, r"has no RL API \(GET /weight_info: 404\); start it with VLLM_SERVER_DEV_MODE=1"),
        ({"scale_out": False}, r"does not take token ids .*--enable-scale-out"),
        ({"token_offset": 1}, r"serves another tokenizer"),
        ({"logprobs_mode": "raw_logprobs"}, r"returns raw_logprobs log-probabilities; start it with --logprobs-mode"),
        ({"backend": "nccl"}, r"has weight-transfer backend nccl; expected gloo"),
        ({"max_model_len": 64}, r"holds 64 tokens per sequence; the run needs 256"),
    ],
)
def test_a_server_that_would_fail_later_is_refused_in_one_line(policy, tok, knobs, message):
    server = stand_in(tok, **knobs)
    try:
        with pytest.raises(GrpolabError, match=rf"^rollout.servers: {server.url} {message}") as e:
            engine_on(policy, tok, [server])
        assert "\n" not in str(e.value)
    finally:
        server.close()


def test_an_unreachable_server_is_refused_naming_it(policy, tok):
    url = closed_port_url()
    with pytest.raises(GrpolabError, match=rf"^rollout.servers: {url} is unreachable \(.*\); expected a running"):
        VLLMServerEngine(policy, tok, torch.float32, servers=[url], max_model_len=256, call_timeout=10.0)


def test_a_server_of_another_model_is_refused_at_the_first_sync(policy, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    wider = LlamaForCausalLM(LlamaConfig(**{**policy.config.to_dict(), "hidden_size": 128}))
    server = StandIn(wider, tok)
    try:
        with pytest.raises(GrpolabError, match=rf"^rollout.servers: the run's model \(LlamaForCausalLM, \d+ parameters\) "
                                               rf"could not be loaded into every server: vLLM server {server.url}"):  # fmt: skip
            engine_on(policy, tok, [server])
    finally:
        server.close()


def test_servers_of_two_vllm_versions_are_refused(policy, tok):
    servers = [stand_in(tok), stand_in(tok, version="0.31.0")]
    try:
        with pytest.raises(GrpolabError, match=rf"{servers[1].url} runs vLLM 0.31.0, {servers[0].url} runs 0.32.0"):
            engine_on(policy, tok, servers)
    finally:
        for s in servers:
            s.close()


def test_a_hung_request_is_bounded_and_names_the_server(policy, tok, prompts):
    server = stand_in(tok)
    engine = engine_on(policy, tok, [server], call_timeout=3.0)
    server.hang = 10.0
    try:
        with pytest.raises(GrpolabError, match=rf"vLLM server {server.url}: POST /inference/v1/generate gave no "
                                               r"answer within 3 s"):  # fmt: skip
            engine.generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=2))
    finally:
        engine.close()
        server.close()


@pytest.mark.parametrize(
    "code, message",
    [
        ("import time; print('loading', flush=True); time.sleep(60)", r"was not ready within 2 s .*and was stopped"),
        ("import sys; print('bad flag', flush=True); sys.exit(3)", r"exited with code 3 while starting"),
    ],
)
def test_a_server_start_is_bounded_and_names_the_server(tmp_path, code, message):
    """A server grpolab starts that never answers /health, or exits: one error naming it, with its log's tail;
    nothing left running."""
    import sys

    from grpolab.rollout.servers import LocalServer, free_port
    from grpolab.rollout.workers.process import EngineUnavailable

    url = f"http://127.0.0.1:{free_port()}"
    server = LocalServer([sys.executable, "-c", code], tmp_path / "vllm_server_0.log", {}, url)
    try:
        with pytest.raises(EngineUnavailable, match=rf"(?s)^vLLM server {url} {message}.*(loading|bad flag)"):
            server.wait_ready(2.0)
        assert server.proc.poll() is not None
    finally:
        server.close()


def test_resume_on_another_vllm_version_names_the_server():
    recorded = {"versions": {"vllm": "0.32.0"}}
    current = {"versions": {"vllm": "0.33.0"}, "rollout_servers": [{"url": "http://h:8000", "vllm": "0.33.0"}]}
    with pytest.raises(GrpolabError, match=r"^rollout.servers: http://h:8000 run vLLM 0.33.0; the run was recorded "
                                           r"with vLLM 0.32.0"):  # fmt: skip
        check_server_version(recorded, current, allow_changes=False)
    check_server_version(recorded, current, allow_changes=True)
    check_server_version(recorded, {**current, "versions": {"vllm": "0.32.0"}}, allow_changes=False)


def test_config_refuses_a_server_that_is_not_a_url():
    with pytest.raises(ConfigError, match=r"rollout.servers: expected a list of server URLs"):
        from_dict({"rollout": {"engine": "vllm_server", "servers": ["localhost:8000"]}})
    cfg = from_dict({"rollout": {"engine": "vllm_server", "servers": ["http://127.0.0.1:8000"], "num_servers": 2}})
    assert cfg.rollout.servers == ["http://127.0.0.1:8000"]


# ---------------------------------------------------------------------------------------------- the real vllm serve


@pytest.fixture(scope="module")
def served(policy, tok, tmp_path_factory):
    """One `vllm serve` that grpolab starts (its log kept in log_dir at close)."""
    if not HAS_VLLM:
        pytest.skip("vLLM's environment is absent: `make install-vllm` creates it")
    log_dir = tmp_path_factory.mktemp("server-logs")
    engine = VLLMServerEngine(policy, tok, torch.float32, num_servers=1, max_model_len=256, log_dir=log_dir)
    engine.log_dir_for_test = log_dir
    yield engine
    engine.close()


@needs_vllm
def test_served_greedy_and_logprobs_match_the_trainer(served, policy, tok, prompts):
    params = SamplingParams(greedy=True, max_new_tokens=10)
    assert rows(served.generate(prompts, params)) == rows(
        GrpolabEngine(policy, tok, torch.float32).generate(prompts, params)
    )
    r = served.generate(prompts, SamplingParams(group_size=3, max_new_tokens=8, temperature=0.8), seeds=[1, 2, 3, 4])
    assert r.weight_versions == [served.weight_version] * 12
    worst = max(
        (r.sampler_logprobs[i, : len(c)].double() - reference_logprobs(policy, prompts[i // 3], c, 0.8)).abs().max()
        for i, c in enumerate(rows(r))
    )
    assert worst < LOGP_ATOL, worst


@needs_vllm
def test_served_sync_follows_the_trainer_on_every_server(served, policy, tok, prompts):
    """The real server and a stand-in, as servers the user started: after a sync of other weights both score as the
    new model (not the old), and greedy on the real server follows it; then the policy's weights go back."""
    other = tiny_llama(tok, seed=1)
    extra = stand_in(tok, seed=7)
    engine = VLLMServerEngine(policy, tok, torch.float32, servers=[served.urls[0], extra.url], max_model_len=256)
    seq = prompts[1] + tok.encode(" four, I think")
    try:
        assert matches(engine, policy, seq, 0) and matches(engine, policy, seq, 1)
        engine.sync_weights(other)
        for i in range(2):
            assert matches(engine, other, seq, i) and not matches(engine, policy, seq, i), f"server {i}"
        params = SamplingParams(greedy=True, max_new_tokens=10)
        ours = GrpolabEngine(other, tok, torch.float32).generate(prompts, params)
        assert rows(engine.generate(prompts, params)) == rows(ours)
        engine.sync_weights(policy)
        assert matches(engine, policy, seq, 0)
    finally:
        engine.close()
        extra.close()


@needs_vllm
def test_a_training_run_on_vllm_servers(tok, tmp_path):
    """rollout.engine vllm_server end to end: a server grpolab starts, two steps each followed by a sync through the
    weight-transfer API; per-server sync metrics, the mismatch within fp32 noise, each sample's weight version, the
    manifest's servers and vLLM version, the server's log in the run directory."""
    import earnable

    from grpolab.runs import start_run

    model_dir = tmp_path / "tiny32"
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = {
        "model": {"name": str(model_dir)},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": earnable.reward_config(),
        "rollout": {**earnable.rollout_config(group_size=4), "engine": "vllm_server", "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-3, "precision": "fp32"},
        "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 4},
        "run": {"output_dir": str(tmp_path), "name": "server-run"},
    }
    trainer, manifest = start_run(from_dict(cfg))
    try:
        trainer.fit()
    finally:
        trainer.close()
    run = trainer.run_dir
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["sync/server/0/bytes"] > 0 for m in metrics)
    assert all(m["sampler/logp_diff_max"] < LOGP_ATOL for m in metrics), [m["sampler/logp_diff_max"] for m in metrics]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"]: s["weight_version"] for s in samples} == {1: "1", 2: "2"}
    recorded = json.loads((run / "manifest.json").read_text())
    assert recorded["versions"]["vllm"] and recorded["rollout_servers"][0]["started_here"] is True
    assert (run / "vllm_server_0.log").is_file()
