#!/usr/bin/env python
"""LoRA against full fine-tuning on the quickstart: step time and peak memory, each side in its own process.

    python benchmarks/lora_vs_full.py                                  # quickstart as configured, 2 rounds
    python benchmarks/lora_vs_full.py --set train.precision=fp32 --set rollout.dtype=float32

Worker processes alternate -- full, LoRA, full, LoRA, ... (--rounds) -- so slow drift of a shared machine hits both
sides alike, and each side's peak RSS is its own. A worker builds the quickstart trainer (configs/quickstart.yaml,
held-out eval off, the --set overrides, plus model.lora.rank=--rank for LoRA), samples the first step's batch, and
updates the policy on it twice (each update: forward, backward, optimizer step, sampler sync). It reports the
rollout seconds, both update times, the completion tokens and the process's peak RSS.

Like for like: LoRA's B starts at zero, so the LoRA policy *is* the base model, and every group's sampling stream
is seeded by (seed, step, group), so both sides sample the same completions (the printed token counts agree) and
train on the same batch. The second update runs with the optimizer state already allocated (AdamW allocates its
two moments in the first step), so the peak RSS covers weights, gradients, optimizer state and activations together.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from grpolab.config import load_config
    from grpolab.training.metrics import peak_rss_mb
    from grpolab.training.trainer import Trainer

    overrides = ["eval.every_steps=0", "train.steps=2", *args.set]
    if args.worker == "lora":
        overrides.append(f"model.lora.rank={args.rank}")
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run")
        trainable = sum(p.numel() for p in trainer.optimizer.param_groups[0]["params"])
        t0 = time.perf_counter()
        batch = trainer.collect()
        first, _ = trainer.update_step(batch, t0)
        second, _ = trainer.update_step(batch, time.perf_counter())  # same batch, optimizer state allocated
        tokens = round(first["completion/len_mean"] * cfg.train.prompts_per_step * cfg.rollout.group_size)
    print(
        json.dumps(
            {
                "kind": args.worker,
                "trainable": trainable,
                "rollout_s": first["time/rollout_s"],
                "update_s": [first["time/update_s"], second["time/update_s"]],
                "tokens": tokens,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    )


def run_worker(kind: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--rank", str(args.rank)]
    for s in args.set:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if out.returncode != 0:
        raise SystemExit(f"{kind} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--set", action="append", default=[], help="a quickstart override, e.g. train.precision=fp32")
    p.add_argument("--worker", choices=["full", "lora"], help=argparse.SUPPRESS)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    results = {"full": [], "lora": []}
    for r in range(args.rounds):
        for kind in ("full", "lora"):
            res = run_worker(kind, args)
            results[kind].append(res)
            print(
                f"round {r + 1} {kind:4s}: rollout {res['rollout_s']:.1f}s, updates {res['update_s'][0]:.1f}s and "
                f"{res['update_s'][1]:.1f}s ({res['tokens']} completion tokens), peak RSS {res['peak_rss_mb']:.0f} MiB",
                flush=True,
            )
    summary = {}
    for kind, runs in results.items():
        summary[kind] = {
            "trainable_params": runs[0]["trainable"],
            "rollout_s": statistics.median(run["rollout_s"] for run in runs),
            "update_s": statistics.median(u for run in runs for u in run["update_s"]),
            "peak_rss_mb": statistics.median(run["peak_rss_mb"] for run in runs),
        }
    f, lo = summary["full"], summary["lora"]
    print(f"median over {args.rounds} rounds (same batch on both sides):")
    for key in ("rollout_s", "update_s", "peak_rss_mb"):
        print(f"  {key:16s} full {f[key]:8.1f}  lora {lo[key]:8.1f}  ratio lora/full {lo[key] / f[key]:.2f}")
    print(f"  trainable params full {f['trainable_params'] / 1e6:.2f} M, lora {lo['trainable_params'] / 1e6:.2f} M")
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": summary, "runs": results, "argv": sys.argv[1:]}, indent=2))


if __name__ == "__main__":
    main()
