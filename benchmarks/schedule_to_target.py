#!/usr/bin/env python
"""Learning per minute: wall time to a held-out accuracy target with and without the pass-rate prompt schedule.

    OMP_NUM_THREADS=2 python benchmarks/schedule_to_target.py                     # both settings, seeds 0 1
    python benchmarks/schedule_to_target.py --settings hard --seeds 0 1 2 --json-out schedule.json

`train.prompt_schedule: pass_rate` skips prompts whose last group was saturated (G/G or 0/G: zero advantages, so
their generation time teaches nothing). Whether that buys learning per minute is measured here, not argued: for each
setting and seed, two training runs that differ only in `train.prompt_schedule` (shuffle vs pass_rate; the same
config, seed, model and held-out problems) evaluate greedily on the same held-out problems every --eval-every steps.
A run's time to target is its training wall time (the sum of `time/step_s`, which leaves out the evaluations
themselves) up to the first evaluation at or above the target; a run that never reaches it is censored at its total
time (printed as "> T").

The target is fixed before training: the base model's accuracy on the same held-out problems (measured first, with
`grpolab eval`) plus --gain. Settings (both from configs/quickstart.yaml, with a training pool small enough that
the walk revisits its prompts -- the schedule only acts from the second epoch on):

- quickstart: the quickstart's task (two-term +/- up to 20), a pool of --pool training problems;
- hard: two terms up to 60, where the base model is rarely right (0.094 on the 64 held-out problems; most
  groups are 0/G). Three terms up to 50 was tried first: the base model was never right (0.000), 97% of groups
  were 0/G in both arms, and neither reached the target -- nothing for a schedule to act on.

Printed per setting: the base accuracy and target, each run's eval curve, time to target and final accuracy, and
per seed the ratio pass_rate / shuffle of time to target; the mean of each arm with a t interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "quickstart": [],
    "hard": ["task.options.max_operand=60"],
}
SCHEDULES = ("shuffle", "pass_rate")
T_975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def task_sets(args, setting: str) -> list[str]:
    return [f"task.options.num_train={args.pool}", *SETTINGS[setting]]


def task_options(sets: list[str]) -> list[str]:
    """The --task-option flags of `grpolab eval` for the quickstart's task with these overrides."""
    import yaml

    options = dict(yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())["task"]["options"])
    for s in sets:
        key, value = s.split("=", 1)
        options[key.rsplit(".", 1)[1]] = value
    return [flag for k, v in options.items() for flag in ("--task-option", f"{k}={v}")]


def base_accuracy(args, sets: list[str], out: Path) -> float:
    path = out / "base.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab",
            "eval",
            args.model,
            "--task",
            "arithmetic",
            *task_options(sets),
            "--limit",
            str(args.eval_problems),
            "--max-new-tokens",
            "48",
            "--out",
            str(path),
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(path.read_text())["models"][0]["accuracy"]


def train(args, sets: list[str], schedule: str, seed: int, out: Path) -> list[dict[str, Any]]:
    """One run; returns its metrics rows."""
    name = f"{schedule}-seed{seed}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab",
            "train",
            "configs/quickstart.yaml",
            "--set",
            f"model.name={args.model}",
            "--set",
            f"run.output_dir={out}",
            "--set",
            f"run.name={name}",
            "--set",
            f"train.steps={args.steps}",
            "--set",
            f"train.seed={seed}",
            "--set",
            f"train.prompt_schedule={schedule}",
            "--set",
            f"eval.every_steps={args.eval_every}",
            "--set",
            f"eval.num_problems={args.eval_problems}",
            "--set",
            "train.save_every_minutes=0",
            *[flag for s in sets for flag in ("--set", s)],
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]


def time_to_target(rows: list[dict[str, Any]], target: float) -> tuple[float, bool]:
    """(training seconds up to the first eval >= target, reached?); censored at the total when never reached."""
    elapsed = 0.0
    for row in rows:
        elapsed += row["time/step_s"]
        if row.get("eval/accuracy", -1.0) >= target:
            return elapsed, True
    return elapsed, False


def mean_interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.0f}" if values else "-"
    m, s = statistics.mean(values), statistics.stdev(values)
    half = T_975.get(len(values) - 1, 2.0) * s / len(values) ** 0.5
    return f"{m:.0f} [{m - half:.0f}, {m + half:.0f}]"


def run_setting(args, setting: str, out: Path) -> dict[str, Any]:
    sets = task_sets(args, setting)
    base = base_accuracy(args, sets, out)
    target = base + args.gain
    print(
        f"\n== {setting}: {' '.join(sets)}; base {base:.3f} on {args.eval_problems} held-out, target {target:.3f}",
        flush=True,
    )
    runs = []
    for seed in args.seeds:
        for schedule in SCHEDULES:
            rows = train(args, sets, schedule, seed, out / setting)
            seconds, reached = time_to_target(rows, target)
            curve = [(r["step"], round(r["eval/accuracy"], 3)) for r in rows if "eval/accuracy" in r]
            skipped = rows[-1].get("schedule/skipped_total", 0)
            zero = statistics.mean(r.get("groups/frac_zero_std", 0.0) for r in rows)
            runs.append(
                {
                    "seed": seed,
                    "schedule": schedule,
                    "seconds": seconds,
                    "reached": reached,
                    "curve": curve,
                    "final": curve[-1][1],
                    "total_s": sum(r["time/step_s"] for r in rows),
                    "skipped": skipped,
                    "frac_zero_std": zero,
                }
            )
            print(
                f"  seed {seed} {schedule:9s} time to target {'' if reached else '> '}{seconds:6.0f} s  "
                f"final {curve[-1][1]:.3f}  zero-variance groups {zero:.2f}  skipped {skipped}  curve {curve}",
                flush=True,
            )
    for schedule in SCHEDULES:
        mine = [r for r in runs if r["schedule"] == schedule]
        print(
            f"  {schedule:9s} time to target, mean [95% t interval] over {len(mine)} seeds: "
            f"{mean_interval([r['seconds'] for r in mine])} s ({sum(r['reached'] for r in mine)} reached); "
            f"final accuracy {mean_interval([1000 * r['final'] for r in mine])} / 1000"
        )
    ratios = [p["seconds"] / s["seconds"] for s, p in zip(runs[0::2], runs[1::2])]
    print(f"  pass_rate / shuffle time to target per seed: {', '.join(f'{x:.2f}' for x in ratios)}")
    return {"setting": setting, "sets": sets, "base": base, "target": target, "runs": runs, "ratios": ratios}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bundled:smollm2-135m-instruct")
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--pool", type=int, default=24, help="training problems (an epoch is pool / 4 steps)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-problems", type=int, default=64)
    p.add_argument("--gain", type=float, default=0.15, help="target = base accuracy + gain")
    p.add_argument("--json-out", default="")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpolab-schedule-") as tmp:
        results = [run_setting(args, s, Path(tmp)) for s in args.settings]
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
