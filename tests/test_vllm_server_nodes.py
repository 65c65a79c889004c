"""Beyond one host: the trainer over torchrun as two nodes (two `torchrun --nnodes 2 --nproc-per-node 1` agents on
this machine, meeting at a c10d rendezvous endpoint on 127.0.0.1) sampling on two vLLM servers (rollout.engine
vllm_server; stand-ins, tests/vllm_stand_in.py), against one process on two servers of its own.

What a plausible bug breaks: each rank samples its own groups on the shared servers, but rank 0 alone syncs them
(another rank's sync would re-form each server's weight-transfer group or double every update), every rank waits for
the sync before it samples again (else it samples the old weights), and requests are spread by rank (else ranks with
few groups all ask the first server). Gloo on the CPU, every port free on 127.0.0.1, a tiny random Llama.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_vllm_engine import tiny_llama
from vllm_stand_in import StandIn

from grpolab.rollout.base import Ranks, SamplingParams
from grpolab.rollout.server_engine import VLLMServerEngine
from grpolab.rollout.servers import free_port

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed" / "server_worker.py"
STEPS, PROMPTS, GROUP = 2, 2, 4


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def run_model(tok, tmp_path_factory) -> str:
    """The run's model on disk: the stand-ins' architecture, seed 0 (the stand-ins start on other weights)."""
    model_dir = tmp_path_factory.mktemp("nodes-model")
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def run_config(model_dir: str, servers: list[StandIn], out: Path, name: str, strategy: str) -> dict:
    """STEPS steps of PROMPTS prompts x GROUP on the servers (top-k 2: each generation followed by a scoring pass),
    fp32 everywhere, the plain training pass (fsdp2's; speed.share_prompt off), no checkpoint but the last."""
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": {"weights": {"spread": 1.0}},
        "rollout": {"engine": "vllm_server", "servers": [s.url for s in servers], "group_size": GROUP, "top_k": 2,
                    "temperature": 1.0, "max_new_tokens": 4, "dtype": "float32", "worker_call_timeout_s": 20.0},
        "algorithm": {"beta": 0.0},
        "train": {"steps": STEPS, "prompts_per_step": PROMPTS, "micro_batch_size": 8, "lr": 1e-2, "seed": 3,
                  "precision": "fp32", "samples_per_step": 4, "save_every": 0, "save_every_minutes": 0,
                  "strategy": strategy},
        "speed": {"share_prompt": False},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }  # fmt: skip


def environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(HERE.parent)}  # fmt: skip


def two_node_commands(spec: Path) -> list[list[str]]:
    """Two torchrun agents, one per "node", one trainer process each, meeting at a c10d endpoint on a free port (the
    first agent to bind it hosts the rendezvous store, the other joins it). c10d gives the ranks in the order the agents
    join (--node-rank is read by the static backend only), so the records are read by each worker's RANK."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
         "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "--local-addr",
         "127.0.0.1", "--max-restarts", "0", str(WORKER), str(spec)]
        for node in (0, 1)
    ]  # fmt: skip


def launch(commands: list[list[str]], spec: dict, path: Path, timeout: float = 150.0) -> None:
    """Run the commands at once (each node's torchrun, or one process), each in a session of its own, and wait for all,
    bounded (a session left running is killed whole: agent and workers); all must succeed."""
    path.write_text(json.dumps(spec))
    logs = [path.with_suffix(f".{i}.log") for i in range(len(commands))]
    procs = []
    for command, log in zip(commands, logs):
        with log.open("w") as out:
            procs.append(subprocess.Popen(command, env=environment(), stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    tails = "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text().splitlines()[-25:]) for f in logs)
    assert all(p.returncode == 0 for p in procs), f"exit codes {[p.returncode for p in procs]}\n{tails}"


def servers_of(tok) -> list[StandIn]:
    """Two stand-ins on weights other than the run's (seeds 5, 6): only the run's syncs give them the policy."""
    return [StandIn(tiny_llama(tok, seed=5), tok), StandIn(tiny_llama(tok, seed=6), tok)]


LAUNCHES = {"one": ["ddp"], "two": ["ddp", "fsdp2"]}
"""The runs of each launch: one process (train.strategy ddp is then a plain run), two torchrun nodes (ddp, fsdp2)."""


@pytest.fixture(scope="module")
def runs(run_model, tok, tmp_path_factory) -> tuple[Path, dict]:
    """Each launch's runs, each run on two fresh stand-ins; per launch and run, each stand-in's counters."""
    root = tmp_path_factory.mktemp("nodes")
    counts: dict[str, dict[str, list[dict]]] = {}
    for name, strategies in LAUNCHES.items():
        servers, path = {s: servers_of(tok) for s in strategies}, root / f"{name}.json"
        configs = [run_config(run_model, servers[s], root / "runs", f"{name}-{s}", s) for s in strategies]
        spec = {"runs": [{"name": s, "config": c} for s, c in zip(strategies, configs)], "out": str(root / name)}
        commands = [[sys.executable, str(WORKER), str(path)]] if name == "one" else two_node_commands(path)
        try:
            launch(commands, spec, path)
            counts[name] = {s: [{"requests": x.requests, "applied": x.applied, "joins": x.joins,
                                 "version": x.weight_version} for x in servers[s]] for s in strategies}  # fmt: skip
        finally:
            for pair in servers.values():
                for x in pair:
                    x.close()
    return root, counts


def ranks_of(out: Path) -> list[dict]:
    """Each rank's record of a run (server_worker.py), its final weights under "weights"."""
    records = []
    for r in range(len(list(out.glob("rank-*.json")))):
        records.append({**json.loads((out / f"rank-{r}.json").read_text()),
                        "weights": load_file(out / f"rank-{r}.safetensors")})  # fmt: skip
    return records


@pytest.mark.parametrize("strategy", LAUNCHES["two"])
def test_two_nodes_on_two_servers_run_the_one_process_experiment(runs, run_model, strategy):
    root, counts = runs
    (one,), two = ranks_of(root / "one" / "ddp"), ranks_of(root / "two" / strategy)
    assert len(two) == 2
    # rank 0 alone holds each server's weight-transfer group; each server joined one group, took the first sync and
    # one per step, and serves the last version
    assert [r["senders"] for r in two] == [2, 0]
    for c in counts["one"]["ddp"] + counts["two"][strategy]:
        assert (c["joins"], c["applied"], c["version"]) == (1, STEPS + 1, str(STEPS + 1)), counts
    # every group of every step sampled once, by one rank, the same tokens as by one process, on the step's weights
    # (version s + 1 after s updates: no rank sampled before rank 0's sync had reached both servers)
    sampled = {}
    for r in two:
        assert not set(sampled) & set(r["sampled"]), "a group sampled by two ranks"
        sampled.update(r["sampled"])
    assert len(sampled) == STEPS * PROMPTS
    assert {k: v["ids"] for k, v in sampled.items()} == {k: v["ids"] for k, v in one["sampled"].items()}
    assert all(v["versions"] == [str(int(k.split("/")[0]) + 1)] * GROUP for k, v in sampled.items()), sampled
    assert {k.split("/")[-1] for k in two[1]["sampled"]} == {"1"}  # rank 1 owns group 1 of each step
    # every request answered, spread over both servers as one process spreads them (rank 1's group on server 1);
    # rank 1's checks before training add one probe request per server
    assert [c["requests"] for c in counts["two"][strategy]] == [c["requests"] + 1 for c in counts["one"]["ddp"]]
    # both ranks end with the same weights (bitwise), moved from the start and equal to one process's within 1e-5 of
    # each tensor's norm: two ranks' gradients are summed by an all-reduce (fsdp2: a reduce-scatter) after two half
    # backward passes, one process's in one, so the rounding differs (measured 6.6e-7 ddp, 2.7e-7 fsdp2); a wrong
    # denominator or an averaged gradient moves them by more than 1e-3 (tests/test_distributed.py)
    w0, w1, w_one = two[0]["weights"], two[1]["weights"], one["weights"]
    assert w0.keys() == w1.keys() == w_one.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    worst = max(((w0[k] - w_one[k]).norm() / w_one[k].norm()).item() for k in w0)
    assert worst <= 1e-5, worst
    start = load_file(Path(run_model) / "model.safetensors")
    assert any((w0[k] - start[k]).abs().max() > 1e-4 for k in start), "the updates moved the weights"
    metrics = [json.loads(line) for line in (Path(two[0]["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["reward/invalid_frac"] == 0 and m["sync/server/1/bytes"] > 0 for m in metrics)


def test_servers_started_here_are_refused_under_torchrun():
    """rollout.num_servers starts servers per process: with several processes the URLs must be given."""
    from grpolab.config import from_dict
    from grpolab.errors import ConfigError
    from grpolab.rollout.base import Ranks
    from grpolab.rollout.engines import EngineRequest, vllm_server_engine

    cfg = from_dict({"rollout": {"engine": "vllm_server", "num_servers": 2}})
    request = EngineRequest(cfg, None, None, "float32", False, [], None, Ranks(0, 2))
    with pytest.raises(ConfigError, match=r"^rollout.servers: expected the URLs of running servers with 2 trainer"):
        vllm_server_engine(request)


def thread_ranks(size: int) -> list[Ranks]:
    """`size` trainer ranks as threads of this process: their gather an all-gather through a barrier."""
    slots, barrier = [None] * size, threading.Barrier(size, timeout=60)

    def gather_of(rank: int):
        def gather(obj) -> list:
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()  # nobody writes the next round's slot before all have read this one
            return out

        return gather

    return [Ranks(r, size, gather_of(r)) for r in range(size)]


def on_ranks(fn, size: int = 2) -> list:
    """fn(rank) on `size` threads at once (the engines' collectives need every rank); each result, or its error."""
    results: list = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except Exception as e:  # noqa: BLE001 -- returned to the test
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_a_server_lost_by_one_rank_leaves_every_rank_s_rotation(tok):
    """Rank 1's request finds server 1 dead (retried on server 0) while rank 0 has not asked it since: the fault
    metrics every rank logs count rank 1's loss and retries; at the next sync every rank takes it out of rotation
    and rank 0 syncs server 0 alone, instead of failing on server 1 and stopping every rank."""
    servers, ranks = servers_of(tok), thread_ranks(2)
    policies = [tiny_llama(tok, seed=0), tiny_llama(tok, seed=0)]

    def start(rank: int) -> VLLMServerEngine:
        return VLLMServerEngine(policies[rank], tok, torch.float32, servers=[s.url for s in servers],
                                max_model_len=256, call_timeout=20.0, ranks=ranks[rank])  # fmt: skip

    engines = on_ranks(start)
    try:
        assert all(isinstance(e, VLLMServerEngine) for e in engines), engines
        servers[1].close()
        prompts = [tok.encode("Hello there"), tok.encode("x")]
        r = engines[1].generate(prompts, SamplingParams(group_size=2, max_new_tokens=3, temperature=1.0), seeds=[1, 2])
        assert r.completion_ids.shape[0] == 4
        assert list(engines[1].pool.out) == [1] and not engines[0].pool.out
        retried = engines[1].pool.retried
        assert retried > 0 and engines[0].pool.retried == 0
        counted = {"servers/out_of_rotation": 1.0, "servers/retried_requests": float(retried)}
        assert on_ranks(lambda rank: engines[rank].fault_metrics()) == [counted, counted]  # rank 0 logs them
        assert on_ranks(lambda rank: engines[rank].sync_weights(policies[rank])) == [None, None]
        assert [list(e.pool.out) for e in engines] == [[1], [1]]
        assert servers[0].applied == 2 and servers[0].weight_version == "2"
        assert "server/1/s" not in engines[0].last_sync and engines[0].last_sync["server/0/bytes"] > 0
    finally:
        for e in engines:
            if isinstance(e, VLLMServerEngine):
                e.close()
        servers[0].close()
