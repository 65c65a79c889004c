#!/usr/bin/env python
"""The quickstart end to end, grpolab vs TRL's GRPOTrainer: wall time for one step budget, and the held-out
accuracy each reaches -- rerunnable by any user.

    pip install -e ".[bench]"                                          # TRL
    python benchmarks/quickstart_vs_trl.py --out-dir runs/vs-trl       # configs/quickstart.yaml, 30 steps each
    python benchmarks/quickstart_vs_trl.py --precision fp32 --steps 10 --checkpoint-every 5 --out-dir runs/vs-trl-fp32

Both sides train from the same weights on the same problems in the same order with the same objective: the run
`--config` describes (grpolab trains it with `grpolab train`; TRL gets the settings grpolab's card gives for TRL,
checked against TRL's numbers in tests/test_card_peers.py, plus the same sampling, optimiser, micro-batch and step
budget -- benchmarks/trl_side.py). Each side saves a resumable checkpoint (weights and optimizer
state) every --checkpoint-every steps. Then one `grpolab
eval` scores the base model and every checkpoint of both sides greedily on the same held-out problems (the config's
test split), with bootstrap intervals and paired differences.

Precision: each side in its best precision on this machine. `--precision auto` (default) lets grpolab's probe
choose for grpolab (recorded in its manifest) and gives TRL `bf16=True` (autocast over fp32 weights, generation
included) exactly when the probe chose bf16 for grpolab's update; `fp32` / `bf16` force both sides.

Wall time is what the user waits for: a side's process, from launch to its last checkpoint written (model loading,
the precision probe, every step and every save). The wall time to an intermediate checkpoint charges the whole
set-up and saving overhead up front: (process wall - sum of step times) + the step times up to that step.

Printed: the machine, each side's wall time, steps and peak RSS, the ratio grpolab / TRL for the same step budget,
each checkpoint's held-out accuracy with its 95% interval, grpolab - TRL paired at the final step, and the wall time
grpolab needed to reach TRL's final held-out accuracy (its first checkpoint at or above that accuracy) over TRL's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402
import trl_side  # noqa: E402


def load_config(args, out_dir: Path):
    """The run both sides train: --config with this benchmark's overrides (no in-training evaluation, checkpoints)."""
    from grpolab.config import from_dict

    raw = yaml.safe_load(Path(args.config).read_text())
    fixed = {
        "run": {"output_dir": str(out_dir), "name": "grpolab"},
        "eval": {"every_steps": 0},
        "train": {
            "steps": args.steps,
            "save_every": args.checkpoint_every,
            "save_every_minutes": 0,
            "keep_last": args.steps // args.checkpoint_every,
        },
    }  # every checkpoint is evaluated
    if args.precision != "auto":
        fixed["train"]["precision"] = args.precision
        fixed.setdefault("rollout", {})["dtype"] = {"bf16": "bfloat16", "fp32": "float32"}[args.precision]
    for section, values in fixed.items():
        raw.setdefault(section, {}).update(values)
    return raw, from_dict(raw)


# ============================================================================================ the two sides


def run_grpolab(raw: dict, out_dir: Path) -> dict[str, Any]:
    config = out_dir / "grpolab.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = out_dir / "grpolab.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "grpolab", "train", str(config)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        ).returncode
    wall = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"grpolab train exited with {rc}; its log: {log}")
    run_dir = out_dir / "grpolab"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/step_s" in r]
    precision = json.loads((run_dir / "manifest.json").read_text())["precision"]
    return {
        "wall_s": wall,
        "step_s": [r["time/step_s"] for r in rows],
        "peak_rss_mb": max(r.get("memory/peak_rss_mb", 0.0) for r in rows),
        "precision": {"update": precision["update"], "sampling": precision["sampling"]},
        "checkpoints": {int(p.name.split("-")[1]): str(p) for p in (run_dir / "checkpoints").glob("step-*")},
    }


def trl_worker(args) -> None:
    """In its own process: TRL trains the same run, saving every --checkpoint-every steps; writes its timings."""
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpolab.models.load import load_tokenizer

    t_start = time.perf_counter()
    out_dir = Path(args.out_dir)
    _, cfg = load_config(args, out_dir)
    problems = trl_side.ordered_problems(cfg, args.steps * cfg.train.prompts_per_step)
    settings = trl_side.trl_settings(cfg, bf16=args.worker_bf16, max_steps=args.steps, gradient_checkpointing=False)
    # full checkpoints (TRL's default: weights, optimizer, scheduler, RNG), as resumable as grpolab's
    config = GRPOConfig(
        output_dir=str(out_dir / "trl"), save_strategy="steps", save_steps=args.checkpoint_every, **settings
    )
    trainer = GRPOTrainer(
        model=cfg.model.name,
        reward_funcs=[trl_side.trl_reward(cfg.reward.weights)],
        args=config,
        train_dataset=trl_side.trl_dataset(problems),
        processing_class=load_tokenizer(cfg.model.name),
    )
    step_s: list[float] = []
    last = [time.perf_counter()]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            last[0] = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_s.append(time.perf_counter() - last[0])

    trainer.add_callback(StepTimer())
    trainer.train()
    out = {
        "step_s": step_s,
        "in_process_s": time.perf_counter() - t_start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "mixed_precision": str(getattr(trainer.accelerator, "mixed_precision", "?")),
        "checkpoints": {int(p.name.split("-")[1]): str(p) for p in (out_dir / "trl").glob("checkpoint-*")},
    }
    Path(args.worker_out).write_text(json.dumps(out))


def run_trl(args, out_dir: Path, bf16: bool) -> dict[str, Any]:
    result_path, log = out_dir / "trl.json", out_dir / "trl.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--worker-out",
        str(result_path),
        "--config",
        args.config,
        "--out-dir",
        str(out_dir),
        "--steps",
        str(args.steps),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--precision",
        args.precision,
    ]
    if bf16:
        cmd.append("--worker-bf16")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
        ).returncode
    wall = time.perf_counter() - t0
    if rc or not result_path.is_file():
        raise SystemExit(f"the TRL worker exited with {rc}; its log: {log}")
    result = json.loads(result_path.read_text())
    result["checkpoints"] = {int(k): v for k, v in result["checkpoints"].items()}
    return {**result, "wall_s": wall}


# ============================================================================================ evaluation and report


def evaluate(cfg, base: str, models: list[str], out_dir: Path) -> dict[str, Any]:
    out = out_dir / "eval.json"
    cmd = [
        sys.executable,
        "-m",
        "grpolab",
        "eval",
        base,
        *models,
        "--task",
        cfg.task.name,
        "--split",
        "test",
        "--max-new-tokens",
        str(cfg.rollout.max_new_tokens),
        "--out",
        str(out),
    ]
    for key, value in cfg.task.options.items():
        cmd += ["--task-option", f"{key}={value}"]
    with open(out_dir / "eval.log", "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"grpolab eval exited with {rc}; its log: {out_dir / 'eval.log'}")
    return json.loads(out.read_text())


def wall_to(side: dict[str, Any], step: int) -> float:
    """Wall time to the end of `step`, all set-up and saving overhead charged up front."""
    overhead = side["wall_s"] - sum(side["step_s"])
    return overhead + sum(side["step_s"][:step])


def curve(side: dict[str, Any], rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "step": s,
            "wall_s": wall_to(side, s),
            "accuracy": rows[p]["accuracy"],
            "ci_low": rows[p]["ci_low"],
            "ci_high": rows[p]["ci_high"],
            "items": rows[p]["items"],
        }
        for s, p in sorted(side["checkpoints"].items())
    ]


def summarise(ours: dict[str, Any], trl: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    from grpolab.evaluation.heldout import paired_diffs

    rows = {m["model"]: m for m in result["models"]}
    base = result["models"][0]
    ours_curve, trl_curve = curve(ours, rows), curve(trl, rows)
    target = trl_curve[-1]["accuracy"]
    reached = next((c for c in ours_curve if c["accuracy"] >= target), None)
    return {
        "base": {k: base[k] for k in ("accuracy", "ci_low", "ci_high", "n")},
        "same_budget_ratio": ours["wall_s"] / trl["wall_s"],
        "final_paired": paired_diffs(trl_curve[-1]["items"], ours_curve[-1]["items"])["accuracy"],
        "target": target,
        "reached_step": reached and reached["step"],
        "to_target_ratio": reached and reached["wall_s"] / trl["wall_s"],
        "curves": {
            "grpolab": [{k: v for k, v in c.items() if k != "items"} for c in ours_curve],
            "trl": [{k: v for k, v in c.items() if k != "items"} for c in trl_curve],
        },
    }


def print_report(machine: dict[str, Any], ours: dict[str, Any], trl: dict[str, Any], s: dict[str, Any]) -> None:
    flags = ", ".join(f for f, on in machine["flags"].items() if on)
    print(
        f"machine: {machine['model']}, {machine['logical_cpus']} logical CPUs, torch threads {machine['torch_threads']} ({flags})"
    )
    print(
        f"grpolab: update {ours['precision']['update']}, sampling {ours['precision']['sampling']}; "
        f"TRL: mixed precision {trl['mixed_precision']}"
    )
    for name, side in (("grpolab", ours), ("TRL", trl)):
        print(
            f"  {name:8s} wall {side['wall_s']:7.1f} s  steps {len(side['step_s'])}  median step "
            f"{common.median(side['step_s']):6.2f} s  outside steps (start, loading, saving) "
            f"{side['wall_s'] - sum(side['step_s']):5.1f} s  peak RSS {side['peak_rss_mb']:.0f} MiB"
        )
    print(
        f"same step budget: wall grpolab / TRL = {s['same_budget_ratio']:.3f} "
        f"(median step {common.median(ours['step_s']) / common.median(trl['step_s']):.3f})"
    )
    b = s["base"]
    print(f"held-out accuracy (greedy, n = {b['n']}): base {b['accuracy']:.3f} [{b['ci_low']:.3f}, {b['ci_high']:.3f}]")
    for name in ("grpolab", "trl"):
        for c in s["curves"][name]:
            print(
                f"  {name:8s} step {c['step']:3d}  wall {c['wall_s']:7.1f} s  {c['accuracy']:.3f} "
                f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
            )
    d = s["final_paired"]
    print(f"final step, grpolab - TRL (paired): {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
    if s["reached_step"] is None:
        print(f"grpolab did not reach TRL's final accuracy {s['target']:.3f} at any checkpoint")
    else:
        print(
            f"wall time to TRL's final accuracy {s['target']:.3f}: grpolab step {s['reached_step']}, "
            f"ratio grpolab / TRL = {s['to_target_ratio']:.3f}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    p.add_argument("--steps", type=int, default=30, help="the step budget of both sides")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--out-dir", required=True, help="a new directory for both runs, the evaluation and summary.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--worker-bf16", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or not 1 <= args.checkpoint_every <= args.steps or args.steps % args.checkpoint_every:
        p.error("expected --steps >= 1 and --checkpoint-every dividing --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        trl_worker(args)
        return 0
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print('TRL is not installed: pip install -e ".[bench]"', file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"--out-dir {out_dir} is not empty: give a new directory (nothing there is overwritten)", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    from grpolab.models.load import resolve_model_path

    raw, cfg = load_config(args, out_dir)
    raw["model"]["name"] = resolve_model_path(cfg.model.name)  # both sides read the same local files
    ours = run_grpolab(raw, out_dir)
    bf16 = ours["precision"]["update"] == "bf16" if args.precision == "auto" else args.precision == "bf16"
    args.config = str(out_dir / "grpolab.yaml")  # the worker reads the resolved config grpolab trained
    trl = run_trl(args, out_dir, bf16)
    models = [
        *(ours["checkpoints"][s] for s in sorted(ours["checkpoints"])),
        *(trl["checkpoints"][s] for s in sorted(trl["checkpoints"])),
    ]
    result = evaluate(cfg, raw["model"]["name"], models, out_dir)
    summary = summarise(ours, trl, result)
    machine = common.cpu_features()
    print_report(machine, ours, trl, summary)
    (out_dir / "summary.json").write_text(
        json.dumps({"machine": machine, "grpolab": ours, "trl": trl, **summary}, indent=1)
    )
    print(f"wrote {out_dir / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
