"""Bring your own reward, data and loop: grpolab's Python API in one script (docs/api.md).

    python examples/train_with_python_api.py                      # the bundled SmolLM2-135M-Instruct, 10 steps
    python examples/train_with_python_api.py --tiny MODEL_DIR     # any small local model, 2 tiny steps (the tests)

It builds a data set of its own (sums of two numbers up to 20, a `datasets.Dataset`, saved next to the run), trains
on it with task `hf` and a reward written here in Python beside the built-in `correct`, prints each step from its
own callback, evaluates the base and the trained model on the held-out sums the run never saw, and writes the
release report. `grpolab.train(cfg, problems=dataset, fields=...)` takes the Dataset straight from memory as well.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import datasets

import grpolab

BUNDLED = "bundled:smollm2-135m-instruct"


def brevity(completion: str, problem: grpolab.Problem) -> float | None:
    """1.0 for an answer of at most 20 words, falling linearly to 0.0 at 60 words; None (no valid reward) for an
    empty completion."""
    words = len(completion.split())
    return None if not completion.strip() else max(0.0, min(1.0, (60 - words) / 40))


def make_dataset(n: int, seed: int = 0) -> datasets.Dataset:
    """n distinct sums "What is a + b?" with a, b in 0..20, and their gold answers."""
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(21) for b in range(21)], n)
    return datasets.Dataset.from_dict(
        {"question": [f"What is {a} + {b}?" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
    )


def settings(model: str, tiny: bool, data_dir: Path) -> dict:
    """The run's config (a plain dict; grpolab.load_config also reads YAML files and dotted overrides)."""
    task = {"name": "hf", "options": {"path": str(data_dir), "test_fraction": 0.2, "num_test": 64}}
    if tiny:  # two quick steps of a tiny model: checks the wiring, learns nothing
        return {
            "model": {"name": model},
            "task": task,
            "reward": {"weights": {"correct": 1.0, "brevity": 0.1}},
            "rollout": {"group_size": 4, "max_new_tokens": 6, "dtype": "float32"},
            "algorithm": {"preset": "grpo", "beta": 0.0},
            "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-3, "save_every_minutes": 0},
            "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 6},
        }
    return {
        "model": {"name": model},
        "task": task,
        "reward": {"weights": {"correct": 1.0, "brevity": 0.1}},
        "rollout": {"group_size": 8, "max_new_tokens": 48, "temperature": 0.8, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0},
        "train": {"steps": 10, "prompts_per_step": 4, "micro_batch_size": 16, "lr": 1e-5},
        "eval": {"every_steps": 5, "num_problems": 32},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", metavar="MODEL_DIR", help="train this small local model for 2 tiny steps")
    parser.add_argument("--run-dir", default="runs/python-api", help="the new run's directory (must not exist)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    data_dir = run_dir.with_name(run_dir.name + "-data")
    make_dataset(120 if args.tiny else 400).save_to_disk(str(data_dir))

    cfg = grpolab.load_config(settings(args.tiny or BUNDLED, bool(args.tiny), data_dir))
    result = grpolab.train(
        cfg,
        rewards={"brevity": brevity},
        run_dir=run_dir,
        on_step=lambda step, m: print(f"step {step}: reward {m['reward/mean']:.3f}", flush=True),
    )
    print(f"trained {result.steps} steps; last checkpoint {result.checkpoint}")

    limit = 8 if args.tiny else 64
    evaluation = grpolab.evaluate_models(
        [cfg.model.name, str(run_dir)],
        task="hf",
        options=cfg.task.options,
        limit=limit,
        max_new_tokens=cfg.rollout.max_new_tokens,
        out=run_dir / "eval" / "base_vs_trained.json",
    )
    for model, accuracy in evaluation.accuracy.items():
        print(f"held-out accuracy {accuracy:.3f}  {model}")

    report = grpolab.release_report(run_dir, skip_safety=bool(args.tiny))
    print(f"verdict: {report.verdict} ({report.reason}); {report.paths['html']}")


if __name__ == "__main__":
    main()
