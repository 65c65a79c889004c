"""Does bf16 learn less than fp32? The quickstart over several seeds in each precision, evaluated on the same
held-out problems, compared as two sets of runs (docs/performance.md, "bf16 against fp32, over seeds").

    python benchmarks/seeds_precision.py --seeds 0,1,2,3,4 --out runs/seeds

For each precision P in (fp32, bf16) and seed s: `grpolab train configs/quickstart.yaml` with train.precision and
rollout.dtype forced to P (runs/seeds/<P>-seed<s>; a run already finished is kept), then one `grpolab eval` of the
base model and every run, greedy, on the demo's 266 held-out problems (`<out>/eval.json`, copied into each run's
eval/), then `grpolab compare` of the two sets (difference of mean held-out accuracy, bootstrapped over runs and
problems). `--mixed` adds the two crossed recipes (sample in one precision, train in the other) to say which half
costs, if one does.
Each command is printed before it runs; the machine and thread count go into `<out>/machine.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRPOLAB = str(Path(sys.executable).with_name("grpolab"))
EVAL_TASK = [
    "--task",
    "arithmetic",
    "--task-option",
    "max_operand=20",
    "--task-option",
    "operators=+-",
    "--task-option",
    "terms=2",
    "--task-option",
    "test_fraction=0.3",
    "--task-option",
    "num_test=300",
    "--split",
    "test",
    "--max-new-tokens",
    "48",
]
RECIPES = {"bf16": ("bf16", "bfloat16"), "fp32": ("fp32", "float32")}
STEPS = 30  # configs/quickstart.yaml's train.steps
MIXED = {"sample-bf16-train-fp32": ("fp32", "bfloat16"), "sample-fp32-train-bf16": ("bf16", "float32")}


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def train(out: Path, name: str, update: str, sampling: str, seed: int) -> Path:
    run_dir = out / name
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and any(json.loads(line)["step"] == STEPS for line in metrics.read_text().splitlines()):
        print(f"kept {run_dir} (finished)", flush=True)
        return run_dir
    run(
        [
            GRPOLAB,
            "train",
            "configs/quickstart.yaml",
            "--set",
            f"train.precision={update}",
            "--set",
            f"rollout.dtype={sampling}",
            "--set",
            f"train.seed={seed}",
            "--set",
            f"run.output_dir={out}",
            "--set",
            f"run.name={name}",
            "--set",
            "eval.every_steps=0",
        ]
    )
    return run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--out", type=Path, default=Path("runs/seeds"))
    ap.add_argument("--mixed", action="store_true", help="also the crossed recipes (sampler and update differ)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(
        json.dumps(
            {
                "cpu": next(
                    (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                    platform.processor(),
                ),
                "threads": os.environ.get("OMP_NUM_THREADS", "default"),
                "python": platform.python_version(),
            },
            indent=1,
        )
    )
    recipes = {**RECIPES, **(MIXED if args.mixed else {})}
    sets = {name: [train(out, f"{name}-seed{s}", *recipes[name], s) for s in seeds] for name in recipes}
    runs = [str(r) for rs in sets.values() for r in rs]
    run([GRPOLAB, "eval", "bundled:smollm2-135m-instruct", *runs, *EVAL_TASK, "--out", str(out / "eval.json")])
    for r in runs:  # each run directory holds the evaluation (compare --set reads a run's own row from its eval/)
        (Path(r) / "eval").mkdir(exist_ok=True)
        shutil.copyfile(out / "eval.json", Path(r) / "eval" / "seeds_precision.json")
    compare = [GRPOLAB, "compare", str(out / "eval.json")]
    for name, rs in sets.items():
        compare += ["--set", f"{name}={','.join(map(str, rs))}"]
    run(compare + ["--out", str(out / "compare.json")])


if __name__ == "__main__":
    main()
