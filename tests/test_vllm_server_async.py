"""In-flight weight updates on vLLM servers (rollout.engine vllm_server with rollout.max_staleness > 0;
grpolab/rollout/server_engine.py, weight_transfer.paused, grpolab/training/pipeline.py; docs/vllm.md, "In-flight
updates", and docs/async.md).

The stand-in (tests/vllm_stand_in.py) samples token by token, keeps a KV cache, and pauses as vLLM's RL API does;
its ``hold_after`` knob holds a request at a fixed token until the next sync, so where a sync lands inside a
completion is the same in every run. What a plausible bug breaks, test by test:

- every token's version and log-probability: the versions taken from the reply's last span or the engine's newest
  sync instead of vLLM's per-token spans; no pause before the update (the stand-in, like the contract, refuses it);
  a pause that aborts (requests lost) or waits (no completion spans a sync: the held requests time out); the KV
  cache of the old weights kept (later tokens' q no longer the new weights');
- the staleness bound: the check made on the version at sending instead of on every token;
- the run and its resume: per-token versions dropped from the checkpoint's queue, or the servers' version labels
  restarted on resume (both change the resumed run's metrics or samples);
- the config: truncated sampling (top-k) allowed with syncs in flight.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_vllm_engine import LOGP_ATOL, needs_vllm, reference_logprobs, rows, tiny_llama
from vllm_stand_in import StandIn

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.rollout.base import Rollout, SamplingParams
from grpolab.rollout.server_engine import VLLMServerEngine
from grpolab.runs import resume_run, start_run
from grpolab.training.distributed import group_seed
from grpolab.training.pipeline import staleness_metrics

HOLD = 3  # the token at which the stand-in holds a request until the next sync
VOLATILE = ("time/", "throughput/", "memory/", "sync/", "servers/", "async/wait_s")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def policy(tok):
    return tiny_llama(tok, seed=0)


def per_token_reference(models: dict[int, torch.nn.Module], prompt, completion, versions, temperature) -> list:
    """Each token's float64 log-probability under the model of the version that sampled it."""
    by_version = {v: reference_logprobs(m, prompt, completion, temperature) for v, m in models.items()}
    return [float(by_version[v][t]) for t, v in enumerate(versions)]


# ---------------------------------------------------------------------------------------------- the engine


@pytest.mark.usefixtures("one_thread")
def test_a_completion_spanning_a_sync_has_each_tokens_version_and_logprob(policy, tok):
    """Two servers, generations in flight on both when the weights change: the sync pauses each with requests kept
    (mode keep), updates, drops the old weights' KV, resumes; no request is lost (every prompt gets its G full
    completions). Each request's first completion was held at token HOLD, so its tokens 0..HOLD-1 carry version 0
    and the rest version 1, and every token's log-probability is the one the weights of its version give (the
    stand-in keeps a KV cache: a cache of the old weights would show). Its later completions are all version 1."""
    servers = [StandIn(tiny_llama(tok, seed=s), tok, kv_cache=True, hold_after=HOLD, hold_s=8.0) for s in (5, 6)]
    engine = VLLMServerEngine(policy, tok, torch.float32, servers=[s.url for s in servers], max_model_len=256,
                              call_timeout=30.0)  # fmt: skip
    other = tiny_llama(tok, seed=1)
    prompts = [tok.encode(t) for t in ("Hello there", "What is 2 + 2?", "Name a colour", "x")]
    params, g, new = SamplingParams(group_size=2, max_new_tokens=7, temperature=0.9), 2, 7
    began = time.monotonic()
    try:
        before = [s.requests for s in servers]
        pending = engine.submit(prompts, params, seeds=[11, 12, 13, 14])
        while sum(len(s.active) for s in servers) < len(prompts) and time.monotonic() - began < 10:
            time.sleep(0.01)  # every request has reached its server (one sent later would start after the sync)
        engine.sync_weights(other, wait=False)
        rollout = engine.finish(pending)
        assert [s.requests - n for s, n in zip(servers, before)] == [2, 2], "one request per prompt, none sent again"
        assert [s.pauses for s in servers] == [["keep", "keep"]] * 2, "the first sync's pause and this one's"
    finally:
        engine.close()
        for s in servers:
            s.close()
    assert time.monotonic() - began < 30
    assert len(rollout) == len(prompts) * g and rollout.completion_mask.sum(-1).tolist() == [new] * 8, "none lost"
    for i, completion in enumerate(rows(rollout)):
        versions = rollout.token_versions[i, : len(completion)].tolist()
        want = [0] * HOLD + [1] * (new - HOLD) if i % g == 0 else [1] * new
        assert versions == want, f"row {i}"
        assert rollout.weight_versions[i] == ("1,2" if i % g == 0 else "2")
        ref = per_token_reference({0: policy, 1: other}, prompts[i // g], completion, versions, 0.9)
        got = rollout.sampler_logprobs[i, : len(completion)].double()
        assert (got - torch.tensor(ref)).abs().max() < LOGP_ATOL, f"row {i}: q is not the weights of each token"


def test_the_staleness_bound_is_checked_on_every_token():
    """async/staleness is the oldest token's, not the version at sending; a token older than k updates (or from
    weights the trainer has not made) stops the step before it trains."""

    def rollout(versions: list[list[int]], lengths: list[int]) -> Rollout:
        mask = torch.tensor([[1] * n + [0] * (4 - n) for n in lengths])
        return Rollout(mask, mask, mask, mask, mask.float(), torch.zeros(2, dtype=torch.bool), torch.zeros(2), ["", ""],
                       token_versions=torch.tensor(versions))  # fmt: skip

    spanning = rollout([[2, 2, 3, 3], [3, 3, 3, -1]], [4, 3])
    assert staleness_metrics(5, spanning, 3, 2, 1) == {
        "async/staleness": 1.0, "async/staleness_mean": pytest.approx(2 / 7), "async/spanning_frac": 0.5,
    }  # fmt: skip
    too_old = rollout([[2, 2, 3, 3], [1, 3, 3, -1]], [4, 3])  # sent at version 2, yet one token from version 1
    with pytest.raises(GrpolabError, match=r"^step 5: its batch holds tokens sampled 2 to 0 updates before the "
                                           r"policy it trains \(version 3\), outside \[0, 1\]"):  # fmt: skip
        staleness_metrics(5, too_old, 3, 2, 1)
    with pytest.raises(GrpolabError, match=r"sampled 1 to -1 updates before"):
        staleness_metrics(5, rollout([[2, 4, 3, 3], [3, 3, 3, -1]], [4, 3]), 3, 2, 1)
    plain = rollout([[0] * 4] * 2, [4, 4])
    plain.token_versions = None  # the worker engines: the schedule's version
    assert staleness_metrics(5, plain, 3, 2, 1)["async/staleness"] == 1.0


def test_the_config_allows_servers_in_flight_and_refuses_truncated_sampling():
    base = {"engine": "vllm_server", "servers": ["http://127.0.0.1:8000"], "max_staleness": 1}
    algo = {"is_mode": "token_truncate"}
    assert from_dict({"rollout": base, "algorithm": algo}).rollout.max_staleness == 1
    with pytest.raises(ConfigError, match=r"^rollout.top_k: expected 0 with rollout.engine vllm_server and "
                                          r"rollout.max_staleness > 0, got 2: .*second scoring request"):  # fmt: skip
        from_dict({"rollout": {**base, "top_k": 2}, "algorithm": algo})
    with pytest.raises(ConfigError, match=r"^rollout.top_p: expected 1.0"):
        from_dict({"rollout": {**base, "top_p": 0.9}, "algorithm": algo})


# ---------------------------------------------------------------------------------------------- a run, resumed


def spread(completion: str, problem) -> float:
    """A reward with variance on the tiny model's near-random completions (the share of distinct characters)."""
    return len(set(completion)) / (len(completion) + 1)


@pytest.fixture(scope="module")
def run_model(tok, tmp_path_factory) -> str:
    model_dir = tmp_path_factory.mktemp("async-server-model")
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def async_run(model_dir: str, out: Path, name: str, server: StandIn, steps: int = 4):
    """k = 1 on one stand-in: 2 prompts x 4, 5 new tokens, a checkpoint every step."""
    return from_dict({
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": {"weights": {"spread": 1.0}},
        "rollout": {"engine": "vllm_server", "servers": [server.url], "group_size": 4, "temperature": 1.0,
                    "max_new_tokens": 5, "dtype": "float32", "worker_call_timeout_s": 20.0, "max_staleness": 1},
        "algorithm": {"beta": 0.0, "is_mode": "token_truncate"},
        "train": {"steps": steps, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-2, "precision": "fp32",
                  "samples_per_step": 8, "save_every": 1, "save_every_minutes": 0, "seed": 0},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    })  # fmt: skip


def holding_stand_in(tok) -> StandIn:
    """A stand-in that holds every request but step 0's at token HOLD until the next sync: the trainer waits for
    step 0 with no sync to come, and each later step is sent a whole update before the sync it spans. Its model
    computes attention eagerly: in this process its tokens overlap the trainer's passes, whose SDPA backend choice
    (torch.nn.attention.sdpa_kernel) is process-wide and would change their last bits with the timing."""
    first = {group_seed(0, 0, j) for j in range(2)}
    model = tiny_llama(tok, seed=0)
    model.set_attn_implementation("eager")
    return StandIn(model, tok, kv_cache=True, hold_after=HOLD, hold_s=15.0,
                   hold_if=lambda sp: sp.get("seed") not in first)  # fmt: skip


def sync_after_arrival(engine: VLLMServerEngine, server: StandIn) -> None:
    """Each sync waits (at most 10 s) until every sampling request the engine sent has reached the stand-in: one still
    on its way when the servers pause would start after the sync, and where the sync lands would depend on timing."""
    sent = {"count": server.generations}
    submit, sync = engine.submit, engine.sync_weights

    def counted_submit(prompts, params, seeds=None):
        sent["count"] += len(prompts)
        return submit(prompts, params, seeds)

    def sync_on_arrival(policy, wait=True, version=None):
        deadline = time.monotonic() + 10
        while server.generations < sent["count"] and time.monotonic() < deadline:
            time.sleep(0.005)
        return sync(policy, wait, version)

    engine.submit, engine.sync_weights = counted_submit, sync_on_arrival


def train_on(cfg, on_step=None, server: StandIn | None = None) -> Path:
    trainer, _ = start_run(cfg, rewards={"spread": spread})
    try:
        if server is not None:
            sync_after_arrival(trainer.engine, server)
        trainer.fit(on_step)
    finally:
        trainer.close()
    return trainer.run_dir


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_run(run: Path, whole: Path) -> None:
    stable = lambda r: {k: v for k, v in r.items() if not k.startswith(VOLATILE)}  # noqa: E731
    assert [stable(r) for r in rows_of(run / "metrics.jsonl")] == [stable(r) for r in rows_of(whole / "metrics.jsonl")]
    assert rows_of(run / "samples.jsonl") == rows_of(whole / "samples.jsonl")
    a, b = (load_file(ckpt.latest_checkpoint(r) / "model.safetensors") for r in (run, whole))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


class Crash(Exception):
    pass


@pytest.mark.usefixtures("one_thread")
def test_an_asynchronous_run_spans_each_sync_and_resumes_exactly(run_model, tok, tmp_path):
    """k = 1: steps 2-4 are each sampled partly before and partly after the sync that follows the update before
    them (per-token versions in the metrics and samples), within the bound; a run that dies in step 3 and resumes
    from step 2's checkpoint (its queue: step 3's rollout with its per-token versions) ends with the uninterrupted
    run's metrics, samples and weights."""
    server = holding_stand_in(tok)
    try:
        whole = train_on(async_run(run_model, tmp_path, "whole", server), server=server)
        assert server.pauses and set(server.pauses) == {"keep"}
    finally:
        server.close()
    metrics = rows_of(whole / "metrics.jsonl")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    assert [m["async/spanning_frac"] for m in metrics] == [0.0, 0.25, 0.25, 0.25], "each request's first completion"
    assert all(0 < m["async/staleness_mean"] < 1 for m in metrics[1:])
    versions = {(r["step"], r["weight_version"]) for r in rows_of(whole / "samples.jsonl")}
    assert versions == {(1, "1"), (2, "1,2"), (2, "2"), (3, "2,3"), (3, "3"), (4, "3,4"), (4, "4")}

    def die_in_step_3(step, metrics):
        if step == 3:  # after step 3 is logged, before its checkpoint
            raise Crash

    server = holding_stand_in(tok)
    try:
        with pytest.raises(Crash):
            train_on(async_run(run_model, tmp_path, "crashed", server), die_in_step_3, server)
        run = tmp_path / "crashed"
        queue = ckpt.load_state(ckpt.latest_checkpoint(run))["pipeline"]["queue"]
        assert [q["step"] for q in queue] == [2] and queue[0]["rollout"]["token_versions"].max() == 2
        resumed, path = resume_run(run, [], allow_changes=False, rewards={"spread": spread})
        sync_after_arrival(resumed.engine, server)
        try:
            assert path.name == "step-2"
            resumed.fit()
        finally:
            resumed.close()
    finally:
        server.close()
    assert_same_run(run, whole)


@pytest.mark.usefixtures("one_thread")
def test_a_server_whose_tokens_are_older_than_the_bound_stops_the_run(run_model, tok, tmp_path):
    """A server labelling every token with the initial weights (its labels lag): step 3 (trained at version 2, k = 1)
    holds tokens 2 updates old and stops before its update, naming the bound."""
    server = StandIn(tiny_llama(tok, seed=0), tok, label="1")
    try:
        with pytest.raises(GrpolabError, match=r"^step 2: its batch holds tokens sampled 2 to 2 updates before .*"
                                               r"outside \[0, 1\] \(rollout.max_staleness\)"):  # fmt: skip
            train_on(async_run(run_model, tmp_path, "lagging", server, steps=3))
    finally:
        server.close()
    assert [m["step"] for m in rows_of(tmp_path / "lagging" / "metrics.jsonl")] == [1, 2]


# ---------------------------------------------------------------------------------------------- the real vllm serve


@needs_vllm
def test_real_vllm_keeps_requests_across_a_sync_with_each_tokens_version(policy, tok):
    """vLLM's own pause (keep), KV reset and per-token version spans: long generations in flight while other weights
    are synced; every completion is whole, some span the sync, and each token's log-probability is the one the
    weights its span names give."""
    other = tiny_llama(tok, seed=1)
    engine = VLLMServerEngine(policy, tok, torch.float32, num_servers=1, max_model_len=256, call_timeout=60.0)
    prompts = [tok.encode(t) for t in ("Hello there", "What is 2 + 2?")]
    params = SamplingParams(group_size=4, max_new_tokens=200, temperature=1.0)
    try:
        pending = engine.submit(prompts, params, seeds=[1, 2])
        time.sleep(0.5)  # tokens under the first weights
        engine.sync_weights(other)
        rollout = engine.finish(pending)
    finally:
        engine.close()
    assert len(rollout) == 8
    spanning = [i for i in range(8) if "," in rollout.weight_versions[i]]
    assert spanning, f"no completion spans the sync: {rollout.weight_versions}"
    for i, completion in enumerate(rows(rollout)):
        versions = rollout.token_versions[i, : len(completion)].tolist()
        ref = per_token_reference({0: policy, 1: other}, prompts[i // 4], completion, versions, 1.0)
        got = rollout.sampler_logprobs[i, : len(completion)].double()
        assert (got - torch.tensor(ref)).abs().max() < LOGP_ATOL, f"row {i} ({rollout.weight_versions[i]})"
