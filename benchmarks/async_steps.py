#!/usr/bin/env python
"""Synchronous vs asynchronous GRPO steps (rollout.max_staleness k = 0, 1, 2): wall time per step and end to end.

    python benchmarks/async_steps.py                                    # the quickstart, 6 steps per variant, CPU
    python benchmarks/async_steps.py --config configs/reasoning_gym.yaml --steps 10 --json-out async.json
    python benchmarks/async_steps.py --engine vllm --device cuda --threads 0   # a GPU machine with vLLM installed
    python benchmarks/async_steps.py --compare engines --threads 0      # the sampling paths side by side (make install-vllm)

Each variant is one `grpolab train` of the config (its own process, a fresh run directory, the held-out eval off),
measured from its metrics.jsonl: the median and total of `time/step_s` (step 1 left out of the median: it warms the
caches), the mean of `time/update_s` and `async/wait_s` (how long the trainer waited for a batch: the rollout time
asynchrony could not hide), and the process's wall time (model load and engine start included).

Variants, in this order (every one with algorithm.is_mode token_truncate, so that they differ only in the schedule):

    k0-here       rollout.engine grpolab (the decode loop in the trainer's process), synchronous: today's loop
    k0-worker     the engine in a worker process (--engine: grpolab_process or vllm), synchronous
    k1-worker     the same, max_staleness 1: step s+1's rollout is generated while step s updates
    k2-worker     max_staleness 2

Cores (--threads N, default 1): the trainer process runs N torch threads (OMP_NUM_THREADS) and the worker N
(rollout.worker_threads), so on a 2-core machine each gets one core; k0-here runs with 2N threads, all of them in
one process, as the synchronous loop would. 0 leaves torch's defaults (a GPU machine). The printed ratios are
each variant's median step time over the first variant's (k0-here unless --only leaves it out), measured in the same
run; run it on an idle machine.

--compare engines runs, synchronous, each sampling path instead: own-loop (rollout.engine grpolab), vllm-offline (the
offline vLLM engine in its worker), server-1 and server-2 (rollout.engine vllm_server, one or two `vllm serve` started
here; two each bound to a core of their own), with the median weight sync's seconds and bytes; ratios over own-loop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRPOLAB = Path(sys.executable).with_name("grpolab")


def variants(engine: str) -> list[tuple[str, dict[str, str]]]:
    worker = {"rollout.engine": engine}
    return [
        ("k0-here", {"rollout.engine": "grpolab", "rollout.max_staleness": "0"}),
        ("k0-worker", {**worker, "rollout.max_staleness": "0"}),
        ("k1-worker", {**worker, "rollout.max_staleness": "1"}),
        ("k2-worker", {**worker, "rollout.max_staleness": "2"}),
    ]


# --compare engines: every sampling path of the trainer, synchronous (is one vLLM server started here as fast as the
# offline worker?)
ENGINE_VARIANTS = [
    ("own-loop", {"rollout.engine": "grpolab"}),
    ("vllm-offline", {"rollout.engine": "vllm"}),
    ("server-1", {"rollout.engine": "vllm_server", "rollout.num_servers": "1"}),
    (
        "server-2",
        {"rollout.engine": "vllm_server", "rollout.num_servers": "2", "rollout.server_devices": "[cpu:0, cpu:1]"},
    ),
]


def run_variant(name: str, sets: dict[str, str], args: argparse.Namespace, out: Path) -> dict:
    threads = args.threads * (2 if name == "k0-here" else 1)
    sets = {
        **sets,
        "train.steps": str(args.steps),
        "train.seed": str(args.seed),
        "train.device": args.device,
        "algorithm.is_mode": "token_truncate",
        "eval.every_steps": "0",
        "rollout.worker_threads": str(args.threads),
        "run.output_dir": str(out),
        "run.name": name,
    }
    cmd = [str(GRPOLAB), "train", args.config, *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")]]
    env = dict(os.environ, TQDM_DISABLE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(
            f"{name}: grpolab train exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step_s"] for r in rows]
    syncs = [r["time/weight_sync_s"] for r in rows[1:] if "time/weight_sync_s" in r]
    return {
        "variant": name,
        "median_sync_s": statistics.median(syncs) if syncs else None,
        "sync_bytes": next((r["sync/bytes"] for r in rows if "sync/bytes" in r), None),
        "threads_trainer": threads,
        "threads_worker": 0 if name == "k0-here" else args.threads,
        "median_step_s": statistics.median(steps[1:] or steps),
        "total_steps_s": sum(steps),
        "mean_update_s": statistics.mean(r["time/update_s"] for r in rows),
        "mean_wait_s": statistics.mean(r.get("async/wait_s", r["time/rollout_s"]) for r in rows),
        "process_wall_s": wall,
        "final_reward_mean": rows[-1]["reward/mean"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="grpolab_process", choices=["grpolab_process", "vllm"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer and of the worker")
    parser.add_argument(
        "--compare",
        default="staleness",
        choices=["staleness", "engines"],
        help="staleness: k = 0, 1, 2 on --engine; engines: own loop, offline vLLM, 1 and 2 servers",
    )
    parser.add_argument("--only", nargs="*", help="run these variants only")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print(
        f"config {args.config}, {args.steps} steps, engine {args.engine}, device {args.device}, threads {args.threads}"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="grpolab-async-") as tmp:
        for name, sets in ENGINE_VARIANTS if args.compare == "engines" else variants(args.engine):
            if args.only and name not in args.only:
                continue
            results.append(run_variant(name, sets, args, Path(tmp)))
            r = results[-1]
            print(
                f"{name:10s} median step {r['median_step_s']:6.2f} s  steps total {r['total_steps_s']:7.1f} s  "
                f"update {r['mean_update_s']:5.2f} s  waited for rollouts {r['mean_wait_s']:5.2f} s  "
                f"process {r['process_wall_s']:6.1f} s",
                flush=True,
            )
    base = results[0] if results else None
    for r in results:
        r["ratio_vs_" + base["variant"]] = ratio = r["median_step_s"] / base["median_step_s"]
        sync = (
            f"  weight sync {r['median_sync_s']:.2f} s, {r['sync_bytes'] / 1e6:.0f} MB"
            if r["median_sync_s"] is not None
            else ""
        )
        print(f"{r['variant']:12s} median step time / {base['variant']}: {ratio:.2f}{sync}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
