"""vLLM servers as the rollout engine (rollout.engine vllm_server: grpolab/rollout/server_engine.py, servers.py,
weight_transfer.py, the vLLM plugin in vllm_plugin/; docs/vllm.md).

Two kinds of server. Stand-ins (tests/vllm_stand_in.py: torch only, on 127.0.0.1, opened by the test) answer the
routes the engine uses and receive the weights over the same gloo group, so the engine's checks, its spreading of
requests, its syncs to every server, its bounds and its faults (a server that dies or hangs mid-run: retried on
another, or the run stopped with a checkpoint and resumed exactly) are tested in every suite. The real ``vllm serve`` (grpolab's
own start of it from ``.venv-vllm``, with grpolab's plugin) is tested where that environment exists (``make
test-vllm``; skipped with the reason elsewhere): tokens, logprobs and syncs against the trainer's weights, and a
run. Models: test_vllm_engine's tiny Llama (head size 32, which the CPU build's attention kernels take).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_vllm_engine import HAS_VLLM, LOGP_ATOL, needs_vllm, reference_logprobs, rows, tiny_llama
from vllm_stand_in import StandIn

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import GrpolabEngine
from grpolab.rollout.server_engine import VLLMServerEngine
from grpolab.rollout.servers import LocalServer, ServerClient, ServerFault, device_env, free_port, serve_command
from grpolab.rollout.vllm_engine import default_vllm_python
from grpolab.runs import check_server_version, resume_run, start_run
from grpolab.training.sampler_faults import SamplerLost


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
        ({"tied": True}, r"serves a model whose lm_head is tied to its embeddings; .*examples/launch/serving_model.py"),
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


@pytest.mark.parametrize(
    "rollout, message",
    [
        ({"num_servers": 2, "server_devices": ["cpu:0"]}, "one entry per server (rollout.num_servers = 2), got 1"),
        ({"server_devices": ["gpu:0"]}, "got 'gpu:0'"),
        ({"server_devices": ["cpu:0-"]}, "got 'cpu:0-'"),
        ({"servers": ["http://h:8000"], "server_devices": ["cpu:0"]}, "expected [] with rollout.servers listed"),
    ],
)
def test_server_devices_are_checked_naming_the_field(rollout, message):
    with pytest.raises(ConfigError, match=r"rollout.server_devices: .*" + re.escape(message)):
        from_dict({"rollout": {"engine": "vllm_server", **rollout}})
    ok = from_dict({"rollout": {"engine": "vllm_server", "num_servers": 2, "server_devices": ["cpu:0,2-3", "cuda:1"]}})
    assert [device_env(d) for d in ok.rollout.server_devices] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,2-3"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]


# ---------------------------------------------------------------------------------------------- faults in a run

VOLATILE = ("time/", "throughput/", "memory/", "sync/", "servers/")  # timings, and what differs with the servers


def spread(completion: str, problem) -> float:
    """A reward with variance on the tiny model's near-random completions (the share of distinct characters), so the
    updates follow the samples and a wrong sample shows in the weights."""
    return len(set(completion)) / (len(completion) + 1)


@pytest.fixture(scope="module")
def run_model(tok, tmp_path_factory) -> str:
    """The runs' model on disk: the stand-ins' architecture (tiny_llama), seed 0."""
    model_dir = tmp_path_factory.mktemp("server-run-model")
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def server_run(model_dir: str, out: Path, name: str, servers: list[StandIn]):
    """Three steps of 2 prompts x 4 on the stand-ins (top-k 2: each generation followed by a scoring pass), every
    request and sync bounded by 6 s, no periodic checkpoint (a stop writes its own)."""
    return from_dict({
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": {"weights": {"spread": 1.0}},
        "rollout": {"engine": "vllm_server", "servers": [s.url for s in servers], "group_size": 4, "top_k": 2,
                    "temperature": 1.0, "max_new_tokens": 4, "dtype": "float32", "worker_call_timeout_s": 6.0},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 3, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-2, "precision": "fp32",
                  "samples_per_step": 8, "save_every": 0, "save_every_minutes": 0},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    })  # fmt: skip


def train_on(cfg, on_step=None) -> Path:
    trainer, _ = start_run(cfg, rewards={"spread": spread})
    try:
        trainer.fit(on_step)
    finally:
        trainer.close()
    return trainer.run_dir


def assert_same_run(run: Path, whole: Path) -> None:
    """The two runs logged the same steps, metrics (timings aside), samples (completions, rewards, advantages, weight
    versions) and final weights."""
    stable = lambda r: {k: v for k, v in r.items() if not k.startswith(VOLATILE)}  # noqa: E731
    assert [stable(r) for r in rows_of(run / "metrics.jsonl")] == [stable(r) for r in rows_of(whole / "metrics.jsonl")]
    assert rows_of(run / "samples.jsonl") == rows_of(whole / "samples.jsonl")
    a, b = (load_file(ckpt.latest_checkpoint(r) / "model.safetensors") for r in (run, whole))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(run_model, tok, tmp_path_factory) -> Path:
    """The three steps on one healthy stand-in."""
    server = stand_in(tok)
    try:
        return train_on(server_run(run_model, tmp_path_factory.mktemp("whole"), "whole", [server]))
    finally:
        server.close()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("fault", ["killed", "hangs"])
def test_a_lost_server_s_requests_are_retried_on_another(run_model, tok, tmp_path, caplog, uninterrupted, fault):
    """Two servers, the second killed (or hung) after step 1: its request of step 2 is sent again to the first, which
    serves everything after; the run ends with every sample answered, the same samples and weights as a run on one
    healthy server, the lost server out of rotation (warned once, counted) and skipped by the syncs."""
    servers = [stand_in(tok), stand_in(tok)]

    def lose_server_1(step, metrics):
        if step == 1 and fault == "killed":
            servers[1].close()
        elif step == 1:
            servers[1].hang = 15.0

    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="grpolab"):
            run = train_on(server_run(run_model, tmp_path, "failover", servers), lose_server_1)
        assert servers[1].applied == 2, "the initial weights and step 1's: nothing once out of rotation"
        assert servers[0].applied == 4
    finally:
        for s in servers:
            s.close()
    assert time.monotonic() - began < 60
    assert_same_run(run, uninterrupted)
    metrics = rows_of(run / "metrics.jsonl")
    assert [m["servers/out_of_rotation"] for m in metrics] == [0, 1, 1]
    assert [m["servers/retried_requests"] for m in metrics] == [0, 1, 1]
    assert [sorted(k for k in m if k.startswith("sync/server/")) for m in metrics] == [
        ["sync/server/0/bytes", "sync/server/0/s", "sync/server/1/bytes", "sync/server/1/s"],
        ["sync/server/0/bytes", "sync/server/0/s"],
        ["sync/server/0/bytes", "sync/server/0/s"],
    ]
    warned = [r.getMessage() for r in caplog.records if "out of rotation" in r.getMessage()]
    assert len(warned) == 1 and f"vLLM server {servers[1].url} is out of rotation" in warned[0], warned


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("where", ["rollout", "sync"])
def test_the_last_server_lost_stops_with_a_checkpoint_and_the_resume_is_exact(
    run_model, tok, tmp_path, uninterrupted, where
):
    """One server, lost after step 1: killed (step 2's rollout finds it gone: step 2 is rolled back, step 1
    checkpointed) or refusing step 2's weight sync (step 2 is finished and checkpointed without it: a server left on
    older weights is never sampled). The run stops in one line naming the cause and the resume command; a server
    started again at the same address and `--resume` end with the uninterrupted run's metrics, samples and weights."""
    server = stand_in(tok)

    def refuse(version):
        raise RuntimeError("the weights could not be loaded")

    def lose_server(step, metrics):
        if step == 1 and where == "rollout":
            server.close()
        elif step == 1:
            server.finish = refuse

    cfg = server_run(run_model, tmp_path, "cut", [server])
    run = tmp_path / "cut"
    try:
        with pytest.raises(SamplerLost) as stopped:
            train_on(cfg, lose_server)
    finally:
        server.close()
    last = 1 if where == "rollout" else 2
    cause = "POST /inference/v1/generate failed" if where == "rollout" else "POST /finish_weight_update answered 500"
    message = str(stopped.value)
    assert "\n" not in message and message.startswith("step 2: the sampler was lost (")
    assert f"vLLM server {server.url}: {cause}" in message
    assert message.endswith(f"checkpoint of the last completed step written to {run / 'checkpoints'}/step-{last}; "
                            f"continue with: grpolab train --resume {run}")  # fmt: skip
    assert [p.name for p in ckpt.checkpoints(run)] == [f"step-{last}"]
    assert [m["step"] for m in rows_of(run / "metrics.jsonl")] == list(range(1, last + 1))
    again = StandIn(tiny_llama(tok, seed=3), tok, port=int(server.url.rsplit(":", 1)[1]))  # restarted, other weights
    try:
        resumed, path = resume_run(run, [], allow_changes=False, rewards={"spread": spread})
        try:
            assert path.name == f"step-{last}"
            resumed.fit()
        finally:
            resumed.close()
    finally:
        again.close()
    assert_same_run(run, uninterrupted)


def test_a_server_in_rotation_that_fails_a_sync_is_an_error_not_skipped(policy, tok, prompts):
    """The second server answers the weight sync but keeps its old weights: the sync fails naming it (a server left
    on older weights would serve them silently), it is not taken out of rotation, and nothing was sampled stale."""
    servers = [stand_in(tok), stand_in(tok)]
    engine = engine_on(policy, tok, servers)
    servers[1].finish = lambda version: {}  # acknowledges, applies nothing
    try:
        with pytest.raises(ServerFault, match=rf"^vLLM server {servers[1].url}: serves weight version 1 after the "
                                              r"sync of version 2 \(in the weight sync of version 2; a server in "
                                              r"rotation that misses a sync would serve older weights\)$"):  # fmt: skip
            engine.sync_weights(tiny_llama(tok, seed=1))
        assert engine.pool.out == {} and engine.last_sync == {}
    finally:
        engine.close()
        for s in servers:
            s.close()


# ---------------------------------------------------------------------------------------------- the real vllm serve


def finished_requests(url: str) -> float:
    """Requests a real server has finished so far (its Prometheus counter vllm:request_success_total, all reasons;
    a request with n completions counts n)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total{"))


def served_env(url: str) -> dict:
    """The VLLM_ environment a running server reports (GET /server_info)."""
    return ServerClient(url, 30.0).get("/server_info?config_format=json").get("vllm_env") or {}


@needs_vllm
def test_two_served_servers_each_follow_every_sync(policy, tok, prompts, tmp_path):
    """Two `vllm serve` that grpolab starts (num_servers=2, each bound to its own core by rollout.server_devices;
    first here, so that no other real server runs beside them). After each sync (other weights, then the policy's again) each server scores as the synced model and not as
    the one before; a generation's requests reach both (prompt i to server i mod 2: each server's own count of
    finished requests grows by its 2 prompts x n = 2); every sample carries the new weight version and the synced
    model's log-probabilities; both logs are kept."""
    other = tiny_llama(tok, seed=1)
    seq = prompts[1] + tok.encode(" four, I think")
    params = SamplingParams(group_size=2, max_new_tokens=6, temperature=0.8)
    engine = VLLMServerEngine(
        policy,
        tok,
        torch.float32,
        num_servers=2,
        max_model_len=256,
        log_dir=tmp_path,
        server_devices=["cpu:0", "cpu:1"],
    )
    try:
        assert len(set(engine.urls)) == 2 and all(matches(engine, policy, seq, i) for i in range(2))
        bound = [served_env(u).get("VLLM_CPU_OMP_THREADS_BIND") for u in engine.urls]
        assert bound == ["0", "1"], bound  # rollout.server_devices: each server on its own core
        for version, old, new in (("2", policy, other), ("3", other, policy)):
            engine.sync_weights(new)
            assert engine.weight_version == version
            for i in range(2):
                assert matches(engine, new, seq, i), f"server {i} lacks version {version}"
                assert not matches(engine, old, seq, i), f"server {i} still scores as before version {version}"
            before = [finished_requests(u) for u in engine.urls]
            r = engine.generate(prompts, params, seeds=[1, 2, 3, 4])
            assert [finished_requests(u) - n for u, n in zip(engine.urls, before)] == [4, 4], version
            assert r.weight_versions == [version] * 8
            ref = [reference_logprobs(new, prompts[j // 2], c, 0.8) for j, c in enumerate(rows(r))]
            worst = max((r.sampler_logprobs[j, : len(q)].double() - q).abs().max() for j, q in enumerate(ref))
            assert worst < LOGP_ATOL, (version, worst)
    finally:
        engine.close()
    assert sorted(p.name for p in tmp_path.glob("vllm_server_*.log")) == ["vllm_server_0.log", "vllm_server_1.log"]


@needs_vllm
def test_a_served_tied_model_is_refused_before_training(policy, tok, tmp_path):
    """A `vllm serve` the user started from a tied model (as saved by transformers: no lm_head in the files) lists no
    lm_head among its parameters; the run refuses it, before any sync, naming the server and the untied copy."""
    tiny_llama(tok, seed=0).save_pretrained(tmp_path / "tied")
    tok.save_pretrained(tmp_path / "tied")
    port = free_port()
    command = serve_command(default_vllm_python(), tmp_path / "tied", port, "float32", 256, 0, "gloo")
    server = LocalServer(
        command,
        tmp_path / "server.log",
        {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        f"http://127.0.0.1:{port}",
    )
    try:
        server.wait_ready(600)
        with pytest.raises(GrpolabError, match=rf"^rollout.servers: {server.url} serves a model whose lm_head is tied"):
            engine_on(policy, tok, [server])
    finally:
        server.close()


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
