#!/usr/bin/env python
"""The serving check's planted faults, shown on a real run (docs/release.md, "Planted faults on the quickstart").

    python benchmarks/planted_serving_faults.py runs/demo --lora-run runs/lora --n 64 --out runs/planted

RUN is an evaluated run (``grpolab eval ... --out RUN/eval/base_vs_trained.json``), e.g. the one ``make demo`` writes;
LORA_RUN (optional) an evaluated run trained with ``model.lora.rank > 0``. Each row below is a release bundle served
by plain transformers in its own process (grpolab.serving.check.run_serving_check) and graded by the report's rule
(grpolab.gate.release.check_serving_consistency), on the first N held-out problems the release was measured on:

- ``clean``: RUN's bundle as ``grpolab release`` writes it;
- ``wrong_template``: its chat_template.jinja with the system line changed (a template from another model or
  version: the prompts the served model reads are not the evaluated ones);
- ``end_id_dropped``: its generation_config.json without ``eos_token_id`` entries (the stop ids not carried over:
  answers run to the token bound);
- ``bf16_export``: RUN's bundle written in bfloat16 (``grpolab release --dtype bfloat16``) from an fp32-evaluated
  model: the divergence is measured and shown, FAIL only if the served accuracy drops, established;
- ``lora_clean`` / ``lora_not_merged``: LORA_RUN's bundle (the adapter merged), and the same bundle with the base
  model's weights in place of the merged ones -- what a LoRA run saved without its merge serves.

The planted bundles are copies under OUT. Each bundle's ``source_run`` is pointed at a scratch directory under OUT
holding a copy of the run's manifest, so the serving results land there and the run's own release evidence
(RUN/release/serving.json) is never overwritten. Prints one table row per bundle and writes OUT/planted.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from grpolab.gate.release import check_serving_consistency
from grpolab.gate.thresholds import Thresholds
from grpolab.manifest import read_manifest
from grpolab.serving.bundle import RELEASE_FILE, write_release
from grpolab.serving.check import run_serving_check

EXPECTED = {
    "clean": "PASS",
    "wrong_template": "FAIL",
    "end_id_dropped": "FAIL",
    "bf16_export": "PASS or WARN",
    "lora_clean": "PASS",
    "lora_not_merged": "FAIL",
}


def _rehome(bundle: Path, scratch: Path, run_dir: Path) -> Path:
    """Point `bundle`'s release.json at `scratch` (a copy of run_dir's manifest.json), where its results go."""
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "manifest.json", scratch / "manifest.json")
    release = json.loads((bundle / RELEASE_FILE).read_text())
    (bundle / RELEASE_FILE).write_text(json.dumps({**release, "source_run": str(scratch.resolve())}, indent=2))
    return bundle


def plant_wrong_template(bundle: Path) -> None:
    template = bundle / "chat_template.jinja"
    text = template.read_text()
    changed = text.replace("You are a helpful AI assistant", "You are a pirate")
    if changed == text:
        raise SystemExit(f"{template}: the system line to change is not in this template")
    template.write_text(changed)


def plant_end_id_dropped(bundle: Path) -> None:
    path = bundle / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": []}, indent=2))


def plant_base_weights(bundle: Path, run_dir: Path) -> None:
    """The base model's weights in place of the merged ones (a LoRA run exported without its merge)."""
    base = Path(read_manifest(run_dir)["model_path"])
    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{base}: the base model has no safetensors weights to plant")
    for f in bundle.glob("*.safetensors"):
        f.unlink()
    for f in files:
        shutil.copy(f, bundle / f.name)


def bundles(run: Path, lora_run: Path | None, out: Path) -> list[tuple[str, Path, Path]]:
    """(name, bundle, source run) of every row, written under `out`."""
    clean = write_release(run, out / "clean")
    rows = [("clean", clean, run)]
    for name, plant in (("wrong_template", plant_wrong_template), ("end_id_dropped", plant_end_id_dropped)):
        shutil.copytree(clean, out / name)
        plant(out / name)
        rows.append((name, out / name, run))
    rows.append(("bf16_export", write_release(run, out / "bf16_export", dtype="bfloat16"), run))
    if lora_run:
        lora = write_release(lora_run, out / "lora_clean")
        if not json.loads((lora / RELEASE_FILE).read_text())["lora_merged"]:
            raise SystemExit(f"{lora_run}: not a LoRA run (its checkpoint is not an adapter)")
        shutil.copytree(lora, out / "lora_not_merged")
        plant_base_weights(out / "lora_not_merged", lora_run)
        rows += [("lora_clean", lora, lora_run), ("lora_not_merged", out / "lora_not_merged", lora_run)]
    return [(name, _rehome(b, out / "results" / name, src), src) for name, b, src in rows]


def row(name: str, s: dict, status: str, reason: str) -> dict:
    d = s["metric"]["diff"]
    return {
        "bundle": name,
        "expected": EXPECTED[name],
        "status": status,
        "n": s["n"],
        "identical_share": s["identical_share"],
        "first_divergence_median": (s["first_divergence"] or {}).get("median"),
        "mean_abs_dlogp": s["logprob_diff"]["mean"],
        "prompts_identical": s["prompts_identical"],
        "truncated_served": s["truncated"]["served"],
        "evaluated": s["metric"]["evaluated"],
        "served": s["metric"]["served"],
        "diff": [d["mean"], d["ci_low"], d["ci_high"]],
        "seconds": round(s["seconds"], 1),
        "reason": reason,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="an evaluated run directory")
    parser.add_argument("--lora-run", type=Path, default=None, help="an evaluated LoRA run (adds the not-merged fault)")
    parser.add_argument("--n", type=int, default=64, help="held-out problems each bundle answers")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the served stack (0: its default)")
    parser.add_argument("--out", type=Path, required=True, help="new directory for the bundles and results")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"--out: {args.out} exists; choose a new directory")
    results = []
    print(
        "| bundle | expected | graded | identical | first divergence (median) | mean abs dlogp | prompts identical "
        "| served runs to the bound | accuracy evaluated -> served, paired [95% CI] | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, bundle, _ in bundles(args.run, args.lora_run, args.out):
        s = run_serving_check(bundle, n=args.n, threads=args.threads, log=lambda m: print(m, file=sys.stderr))
        c = check_serving_consistency(s, Thresholds())
        r = row(name, s, c.status, c.reason)
        results.append(r)
        fd = r["first_divergence_median"]
        print(
            f"| {name} | {r['expected']} | **{r['status']}** | {r['identical_share']:.2f} | {'-' if fd is None else fd} "
            f"| {r['mean_abs_dlogp']:.4f} | {r['prompts_identical']:.2f} | {r['truncated_served']:.2f} "
            f"| {r['evaluated']:.3f} -> {r['served']:.3f}, {r['diff'][0]:+.3f} [{r['diff'][1]:+.3f}, {r['diff'][2]:+.3f}] "
            f"| {r['seconds']} |",
            flush=True,
        )
        print(f"  {name}: {c.status}: {c.reason}", file=sys.stderr, flush=True)
    (args.out / "planted.json").write_text(
        json.dumps(
            {
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "run": str(args.run),
                "lora_run": str(args.lora_run),
                "rows": results,
            },
            indent=2,
        )
    )
    wrong = [r["bundle"] for r in results if r["status"] not in r["expected"].split(" or ")]
    if wrong:
        raise SystemExit(f"graded otherwise than expected: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
