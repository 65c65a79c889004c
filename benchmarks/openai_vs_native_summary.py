"""The table of benchmarks/openai_vs_native_lookup.sh: per seed, each path's held-out success before (the warm
start) and after GRPO, and openai - native paired over the 200 states; over the seeds, the set difference of the
trained models (grpolab.evaluation.sets.set_difference: states paired across the sets, each set's seeds its own
between-seed part) and of the gains over each path's own warm start.

    python benchmarks/openai_vs_native_summary.py runs/openai_vs_native "0 1 2"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grpolab.evaluation.intervals import mean_interval
from grpolab.evaluation.sets import aligned, row_scores, set_difference


def ci(r: dict) -> str:
    return f"{r['mean']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"


def rows(runs: Path, path: str, seed: str) -> tuple[dict, dict]:
    """(warm start, trained) per-state success of one path and seed: the eval JSON's two model rows."""
    data = json.loads((runs / f"{path}-grpo-seed{seed}" / "eval" / "heldout.json").read_text())
    warm, trained = data["models"][0], data["models"][-1]
    return row_scores(warm), row_scores(trained)


def main(runs: Path, seeds: list[str]) -> None:
    names = [f"{p}-seed{s}" for p in ("native", "openai") for s in seeds]
    table = {p: [rows(runs, p, s) for s in seeds] for p in ("native", "openai")}
    every = [r for p in ("native", "openai") for pair in table[p] for r in pair]
    _, x = aligned(every, [f"{n}-{k}" for n in names for k in ("sft", "grpo")])
    warm = {p: x[i * 2 * len(seeds) : (i + 1) * 2 * len(seeds) : 2] for i, p in enumerate(("native", "openai"))}
    grpo = {p: x[i * 2 * len(seeds) + 1 : (i + 1) * 2 * len(seeds) : 2] for i, p in enumerate(("native", "openai"))}
    print("| seed | native: warm start -> GRPO | openai: warm start -> GRPO | openai - native (GRPO), paired |")
    print("|---|---|---|---|")
    for j, s in enumerate(seeds):
        d = mean_interval(grpo["openai"][j] - grpo["native"][j])
        print(
            f"| {s} | {warm['native'][j].mean():.3f} -> {grpo['native'][j].mean():.3f} | "
            f"{warm['openai'][j].mean():.3f} -> {grpo['openai'][j].mean():.3f} | {ci(d)} |"
        )
    trained = set_difference(grpo["native"], grpo["openai"])
    gains = set_difference(grpo["native"] - warm["native"], grpo["openai"] - warm["openai"])
    print(
        f"set of {len(seeds)} seeds, {x.shape[1]} states: trained openai - native {ci(trained)}; "
        f"gain over the warm start, openai - native {ci(gains)}"
    )
    print(f"  native trained {trained['a']['mean']:.3f}, openai trained {trained['b']['mean']:.3f}")
    out = {"seeds": seeds, "states": int(x.shape[1]), "trained_difference": trained, "gain_difference": gains}
    (runs / "openai_vs_native.json").write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split())
