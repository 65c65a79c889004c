#!/usr/bin/env python
"""GRPO's cost claim, measured: one training step of PPO with a critic vs GRPO, on identical settings.

    python benchmarks/ppo_vs_grpo.py                         # quickstart task and model, fp32, 2 rounds x 2 steps
    python benchmarks/ppo_vs_grpo.py --beta 0.04 --json-out ppo_vs_grpo.json

The second seed's argument for GRPO is that it drops PPO's value model and so saves memory and compute. Both sides
here are grpolab's one code path (grpolab.training.trainer.Trainer and grpolab.baselines.ppo.GAEStep, its advantage step): the same
model (bundled SmolLM2-135M-Instruct unless --model), the same task (the quickstart's: two-term +/- with operands up
to 20), the same prompts in the same order (the prompt sampler is seeded by train.seed), G, max_new_tokens,
prompts per step, micro-batch size, precision, learning rate, beta and the same AdamW; they differ only in what PPO
adds -- a value model (a value head on a copy of the backbone, its own AdamW), a no-grad pass of the policy for the
old logprobs (GRPO with mu = 1 reuses the detached training-pass logprobs), a no-grad value pass, GAE, and the
critic's forward/backward/step.

Each side runs in its own worker process (peak RSS is per side); rounds alternate grpo, ppo, grpo, ppo, ... Each
worker runs --warmup steps (not counted) and --steps measured steps. Phases are measured by wrapping methods of the
live objects (nothing in grpolab is edited):

  generation     GrpolabEngine.generate                 reward        batch.score_rollout
  old logprobs   PolicyUpdater.logprobs_no_grad(policy)   reference  ... (reference model; beta > 0 only)
  values         Critic.values (PPO)               critic update  Critic.update (PPO)
  policy update  PolicyUpdater.update minus its own no-grad passes         weight sync   GrpolabEngine.sync_weights
  other          step wall time minus all of the above (advantages / GAE, metrics, logging)

Printed: median seconds per phase and per step for each side, the ratio PPO / GRPO, and peak RSS of each.
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
from collections import defaultdict
from pathlib import Path
from typing import Any

TASK_OPTIONS = {"max_operand": 20, "operators": "+-", "terms": 2, "seed": 0, "test_fraction": 0.3, "num_test": 300}
PHASES = [
    "generation",
    "reward",
    "old_logprobs",
    "reference",
    "values",
    "critic_update",
    "policy_update",
    "weight_sync",
    "other",
]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def config(args, side: str, out: str) -> dict[str, Any]:
    return {
        "model": {"name": args.model},
        "task": {"name": "arithmetic", "options": TASK_OPTIONS},
        "reward": {"weights": {"correct": 1.0, "format": 0.0}},
        "rollout": {
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 0.8,
            "dtype": "float32" if args.precision == "fp32" else "bfloat16",
        },
        "algorithm": {
            "preset": "grpo",
            "beta": args.beta,
            **({"estimator": "gae", "kl_placement": "reward"} if side == "ppo" else {}),
        },
        "train": {
            "steps": args.warmup + args.steps,
            "prompts_per_step": args.prompts_per_step,
            "lr": 1e-5,
            "micro_batch_size": args.micro_batch_size,
            "precision": args.precision,
            "seed": args.seed,
            "save_every": 0,
            "save_every_minutes": 0,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": out, "name": side},
    }


def wrap(obj, name: str, phase, times: dict[str, float]) -> None:
    """Time every call of obj.name into times[phase] (phase may be a function of the call's arguments)."""
    real = getattr(obj, name)

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            key = phase(*a, **k) if callable(phase) else phase
            times[key] += time.perf_counter() - t0

    setattr(obj, name, timed)


def wrap_update(updater, times: dict[str, float]) -> None:
    """policy_update = PolicyUpdater.update's time minus the no-grad passes it makes itself (GRPO's reference pass),
    which are counted in their own phases."""
    real = updater.update

    def timed(*a, **k):
        inner0, t0 = times["reference"] + times["old_logprobs"], time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            inner = times["reference"] + times["old_logprobs"] - inner0
            times["policy_update"] += time.perf_counter() - t0 - inner

    updater.update = timed


def worker(args) -> dict[str, Any]:
    import torch

    import grpolab.baselines.ppo  # noqa: F401 -- registers algorithm.estimator gae
    import grpolab.training.batch as B
    from grpolab.config import from_dict
    from grpolab.training.trainer import Trainer

    torch.set_num_threads(args.threads) if args.threads else None
    out = tempfile.mkdtemp(prefix=f"ppo-vs-grpo-{args.worker}-")
    cfg = from_dict(config(args, args.worker, out))
    (Path(out) / args.worker).mkdir()
    t0 = time.perf_counter()
    trainer = Trainer(cfg, Path(out) / args.worker)
    setup_s, setup_rss = time.perf_counter() - t0, peak_rss_mb()
    trainer.save = lambda: None  # no checkpoint writes in a timing run
    times: dict[str, float] = defaultdict(float)
    policy, ref = trainer.policy, trainer.reference
    wrap(trainer.engine, "generate", "generation", times)
    wrap(trainer.engine, "sync_weights", "weight_sync", times)
    wrap(B, "score_rollout", "reward", times)
    wrap(
        trainer.updater,
        "logprobs_no_grad",
        lambda model, *a, **k: "reference" if model is ref else "old_logprobs",
        times,
    )
    wrap_update(trainer.updater, times)
    if hasattr(trainer, "critic"):
        wrap(trainer.estimator.critic, "values", "values", times)
        wrap(trainer.estimator.critic, "update", "critic_update", times)
    steps, last = [], [time.perf_counter()]

    def on_step(step: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        rec = {p: times.get(p, 0.0) for p in PHASES if p != "other"}
        rec["wall"] = now - last[0]
        rec["other"] = max(rec["wall"] - sum(rec[p] for p in PHASES if p != "other"), 0.0)
        rec["completion_tokens_mean"] = metrics.get("completion/len_mean")
        rec["reward_mean"] = metrics.get("reward/mean")
        steps.append(rec)
        times.clear()
        last[0] = time.perf_counter()

    trainer.fit(on_step=on_step)
    return {
        "side": args.worker,
        "setup_s": setup_s,
        "rss_after_setup_mb": setup_rss,
        "peak_rss_mb": peak_rss_mb(),
        "parameters_m": sum(p.numel() for p in policy.parameters()) / 1e6,
        "critic_parameters_m": sum(p.numel() for p in trainer.estimator.critic.model.parameters()) / 1e6
        if hasattr(trainer, "critic")
        else 0.0,
        "torch_threads": torch.get_num_threads(),
        "steps": steps[args.warmup :],
    }


def run_worker(args, side: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, "--worker", side, "--worker-out", path, *sys.argv[1:]]
    subprocess.run(cmd, check=True)
    return json.loads(Path(path).read_text())


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for side in ("grpo", "ppo"):
        runs = [r for r in results if r["side"] == side]
        steps = [s for r in runs for s in r["steps"]]
        out[side] = {
            "step_s": statistics.median(s["wall"] for s in steps),
            "phases_s": {p: statistics.median(s[p] for s in steps) for p in PHASES},
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "rss_after_setup_mb": max(r["rss_after_setup_mb"] for r in runs),
            "completion_tokens_mean": statistics.mean(s["completion_tokens_mean"] for s in steps),
            "measured_steps": len(steps),
            "critic_parameters_m": runs[0]["critic_parameters_m"],
            "parameters_m": runs[0]["parameters_m"],
        }
    return out


def print_table(s: dict[str, Any]) -> None:
    g, p = s["grpo"], s["ppo"]
    print(f"{'':22s} {'GRPO':>9s} {'PPO':>9s} {'PPO/GRPO':>9s}")
    for ph in PHASES:
        a, b = g["phases_s"][ph], p["phases_s"][ph]
        print(f"{ph + ' s':22s} {a:9.2f} {b:9.2f} {b / a if a > 0.005 else float('nan'):9.2f}")
    print(f"{'step s (median)':22s} {g['step_s']:9.2f} {p['step_s']:9.2f} {p['step_s'] / g['step_s']:9.2f}")
    print(
        f"{'peak RSS MiB':22s} {g['peak_rss_mb']:9.0f} {p['peak_rss_mb']:9.0f} {p['peak_rss_mb'] / g['peak_rss_mb']:9.2f}"
    )
    print(
        f"{'RSS after setup MiB':22s} {g['rss_after_setup_mb']:9.0f} {p['rss_after_setup_mb']:9.0f} "
        f"{p['rss_after_setup_mb'] / g['rss_after_setup_mb']:9.2f}"
    )
    print(f"{'completion tokens/row':22s} {g['completion_tokens_mean']:9.1f} {p['completion_tokens_mean']:9.1f}")
    print(f"trainable parameters: policy {g['parameters_m']:.1f} M; PPO's critic {p['critic_parameters_m']:.1f} M more")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient of both sides (quickstart: 0)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per worker")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds: grpo, ppo, grpo, ppo, ...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json-out", default="")
    ap.add_argument("--worker", choices=["grpo", "ppo"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(args)))
        return
    results = []
    for r in range(args.rounds):
        for side in ("grpo", "ppo"):
            print(f"round {r + 1}/{args.rounds}: {side}", flush=True)
            results.append(run_worker(args, side))
    s = summarise(results)
    print(f"\n{' '.join(sys.argv)}\n")
    print_table(s)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "summary": s, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
