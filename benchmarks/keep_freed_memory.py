#!/usr/bin/env python
"""speed.keep_freed_memory on and off (grpolab/training/cpu_memory.py): the quickstart's steps, one process per
setting, alternating over --rounds.

    python benchmarks/keep_freed_memory.py --precision bf16 --rounds 2

Each worker builds the quickstart trainer (configs/quickstart.yaml, the given precision for the update and the
sampler), runs --warmup steps, then times --steps steps (collect: generation + reward; update: reference,
policy forward/backward, optimizer). Both settings train on the same batches: the workers' losses and rewards
must be the same bytes (the allocator changes where memory comes from, not what is computed) -- checked here.
Prints the median update and collect seconds per setting, their ratio, and each worker's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    from grpolab.config import load_config
    from grpolab.training.trainer import Trainer

    dtype = {"bf16": "bfloat16", "fp32": "float32"}[args.precision]
    cfg = load_config(
        ROOT / "configs" / "quickstart.yaml",
        [
            f"train.precision={args.precision}",
            f"rollout.dtype={dtype}",
            f"speed.keep_freed_memory={args.worker == 'on'}",
            "eval.every_steps=0",
        ],
    )
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="grpolab-kfm-")))
    collect, update, values = [], [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        batch = trainer.collect()
        t1 = time.perf_counter()
        metrics, _ = trainer.update_step(batch, t0)
        if i >= args.warmup:
            collect.append(t1 - t0)
            update.append(time.perf_counter() - t1)
        values.append([metrics["reward/mean"], metrics["loss/total"], metrics["optim/grad_norm"]])
    print(
        json.dumps(
            {
                "collect": collect,
                "update": update,
                "values": values,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_worker(setting: str, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        setting,
        "--precision",
        args.precision,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker {setting} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for setting in ("off", "on"):
            runs[setting].append(run_worker(setting, args))
            last = runs[setting][-1]
            print(
                f"round {r + 1} keep_freed_memory={setting}: update "
                + " ".join(f"{x:.2f}" for x in last["update"])
                + " s, collect "
                + " ".join(f"{x:.2f}" for x in last["collect"])
                + f" s, peak RSS {last['peak_rss_mib']:.0f} MiB"
            )
    same = all(w["values"] == runs["off"][0]["values"] for s in runs for w in runs[s])
    print(f"\nprecision {args.precision}; same rewards, losses and gradient norms in every worker: {same}")
    med = {s: {k: statistics.median(x for w in runs[s] for x in w[k]) for k in ("update", "collect")} for s in runs}
    for k in ("update", "collect"):
        print(
            f"  median {k:7s} s: off {med['off'][k]:.3f}  on {med['on'][k]:.3f}  on/off {med['on'][k] / med['off'][k]:.3f}"
        )
    rss = {s: max(w["peak_rss_mib"] for w in runs[s]) for s in runs}
    print(f"  peak RSS MiB: off {rss['off']:.0f}  on {rss['on']:.0f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
