"""`grpolab eval`, `grpolab compare`, `grpolab baseline` (sft, best-of-n).

`compare` rules:
- A source is an evaluation JSON (written by `grpolab eval --out` or `grpolab baseline best-of-n --out`) or a run
  directory: every ``eval/*.json`` in it, or, when none exists, its last periodic held-out eval from
  metrics.jsonl (accuracy and interval only; no per-problem records, so no paired difference).
- Rows are grouped by evaluation set (``data_hash``); only rows on the same set are put side by side. The same
  (model path, method, samples, set) seen twice is shown once. The reference of each set is the first row, or
  the first whose label contains ``--baseline``; differences are paired bootstraps on the problems both have.
- Runs whose manifests differ only in ``config.train.seed`` (grpolab.manifest.diff_manifests), evaluated on the
  same set with the same method, form a seed group: mean, sample std (ddof 1), min and max of every metric.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer
from rich.table import Table

from .app import app, baseline_app, console
from ..errors import GrpolabError

SEED_KEYS = {"config.train.seed"}


def _options(task_option: list[str]) -> dict[str, Any]:
    from ..config import parse_option

    return dict(parse_option(o) for o in task_option)


def _ci(m: dict[str, float]) -> str:
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if "ci_low" in m else f"{m['mean']:.3f}"


def _write(out: Optional[Path], data: dict[str, Any]) -> None:
    from ..api import write_result  # the file grpolab.evaluate / grpolab.compare write with out=

    if write_result(out, data):
        console.print(f"wrote {out}")


def print_eval(result: dict[str, Any]) -> None:
    """Console tables of an evaluation JSON: one row per model, then accuracy per slice."""
    dec = result["decoding"]
    how = "greedy" + (f" + {dec['samples']} samples at T={dec['temperature']}" if dec.get("samples") else "")
    metric = str(result.get("metric", "math-verify")).split(" (")[0]
    table = Table(title=f"{result['task']} / {result['split']}  (n = {result['n']}, {how}, {metric})")
    extra = [m for m in result["models"][0]["metrics"] if m != "accuracy" and "ci_low" in result["models"][0]["metrics"][m]]
    for col in ("model", "accuracy [95% CI]", "Δ vs first [95% CI]", *extra, "len", "trunc", "problems/s"):
        table.add_column(col)
    for r in result["models"]:
        diff = r.get("paired_vs_first", {}).get("accuracy")
        table.add_row(r["model"], _ci(r["metrics"]["accuracy"]), _ci(diff) if diff else "-",
                      *[f"{r['metrics'][m]['mean']:.3f}" if m in r["metrics"] else "-" for m in extra],
                      f"{r['len_mean']:.1f}", f"{r['truncated_frac']:.2f}", f"{r['problems_per_s']:.2f}")
    console.print(table)
    console.print(f"evaluation set hash {result['data_hash'][:16]}")
    for r in result["models"]:
        h = r["held_out"]
        what = f"{h['train_problems']} training problems in {h['manifest']}, none evaluated" if h["checked"] else h["note"]
        console.print(f"held-out check, {r['model']}: {what}", highlight=False)
    slices = sorted({s for r in result["models"] for s in r["per_slice"]})
    if len(slices) > 1:
        st = Table(title="accuracy per slice [95% CI]")
        st.add_column("slice")
        st.add_column("n")
        for r in result["models"]:
            st.add_column(r["model"], overflow="fold")
        for s in slices:
            cells = [_ci(r["per_slice"][s]["metrics"]["accuracy"]) if s in r["per_slice"] else "-" for r in result["models"]]
            st.add_row(s, str(result["models"][0]["per_slice"].get(s, {}).get("n", "-")), *cells)
        console.print(st)


@app.command("eval")
def eval_(
    models: Annotated[list[str], typer.Argument(help="model: hub id, path, run directory or bundled: alias")],
    task: Annotated[str, typer.Option(help="task name")] = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: str = "test",
    limit: Annotated[int, typer.Option(help="evaluate the first N problems (0 = all)")] = 0,
    max_new_tokens: int = 64,
    batch_size: Annotated[int, typer.Option(help="sequences per generate call")] = 64,
    samples: Annotated[int, typer.Option(help="k samples per problem for pass@k / maj@k / mean@k (0 = greedy only)")] = 0,
    temperature: Annotated[float, typer.Option(help="sampling temperature (with --samples)")] = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 (bf16 pays only on CPUs with bf16 matrix units, and GPUs)")] = "float32",
    out: Annotated[Optional[Path], typer.Option(help="write the JSON result here")] = None,
) -> None:
    """Held-out accuracy (math-verify) with 95% bootstrap intervals and paired differences, for one or more models."""
    from ..evaluate import run_eval

    result = run_eval(models, task, _options(task_option), split, limit, max_new_tokens, batch_size, dtype,
                      samples=samples, temperature=temperature, top_p=top_p, seed=seed)
    print_eval(result)
    _write(out, result)


# ------------------------------------------------------------------------------------------------ baselines

@baseline_app.command("best-of-n")
def best_of_n(
    model: Annotated[str, typer.Argument(help="model: hub id, path, run directory or bundled: alias")],
    n: Annotated[int, typer.Option(help="samples per problem")] = 8,
    reward_weight: Annotated[list[str], typer.Option("--reward-weight", help="training reward NAME=WEIGHT")] = [],
    reward_from: Annotated[Optional[Path], typer.Option(help="take the reward weights from this run's manifest")] = None,
    task: str = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: str = "test", limit: int = 0, max_new_tokens: int = 64, batch_size: int = 64,
    temperature: float = 1.0, seed: int = 0, dtype: str = "float32",
    out: Annotated[Optional[Path], typer.Option(help="write the JSON result here")] = None,
) -> None:
    """Sample n, keep the answer the training reward ranks highest, score it with math-verify."""
    from ..baselines import best_of_n_eval
    from ..config import RewardConfig
    from ..evaluate import eval_header, load_eval_problems, model_row
    from ..manifest import read_manifest
    from ..models import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
    from ..overlap import check_held_out
    from ..rollout.hf import HFEngine

    weights = dict(RewardConfig().weights)
    if reward_from:
        weights = read_manifest(reward_from)["config"]["reward"]["weights"]
    if reward_weight:
        weights = {k: float(v) for k, v in _options(reward_weight).items()}
    options = _options(task_option)
    problems = load_eval_problems(task, options, split, limit)
    path = resolve_model_path(model)
    held_out = check_held_out(model, path, problems)
    tok, lm = load_tokenizer(path), load_causal_lm(path, dtype)
    res = best_of_n_eval(HFEngine(lm, tok, DTYPES[dtype]), tok, problems, n, weights, temperature, max_new_tokens,
                         batch_size, seed)
    decoding = {"greedy": False, "samples": n, "temperature": temperature, "seed": seed,
                "max_new_tokens": max_new_tokens, "selection": {"reward_weights": weights}}
    result = {**eval_header(task, options, split, problems, dtype, decoding),
              "models": [model_row(f"{model} best-of-{n}", path, res, held_out, "best_of_n")]}
    print_eval(result)
    _write(out, result)


@baseline_app.command("sft")
def sft(
    out: Annotated[Path, typer.Option(help="new directory for the fine-tuned HF checkpoint")],
    model: Annotated[Optional[str], typer.Option(help="base model (default: the --match-run's model)")] = None,
    match_run: Annotated[Optional[Path], typer.Option(help="GRPO run whose model, task and optimizer-step budget to match")] = None,
    mode: Annotated[str, typer.Option(help="gold (gold solutions) or rft (own correct samples)")] = "gold",
    steps: Annotated[Optional[int], typer.Option(help="optimizer steps (default: the run's steps * mu * minibatches)")] = None,
    task: Optional[str] = None,
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    limit: Annotated[int, typer.Option(help="use the first N train problems (0 = all)")] = 0,
    batch_size: int = 8, lr: float = 1e-5, seed: int = 0,
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto (measured, as train.precision)")] = "auto",
    rft_samples: int = 4, rft_temperature: float = 1.0, max_new_tokens: int = 64,
) -> None:
    """Fine-tune the base model on gold solutions or on its own correct samples (RFT), same step budget as GRPO."""
    from ..baselines import SFTSettings, run_sft
    from ..manifest import read_manifest

    run_cfg = read_manifest(match_run)["config"] if match_run else None
    model = model or (run_cfg["model"]["name"] if run_cfg else None)
    task = task or (run_cfg["task"]["name"] if run_cfg else None)
    options = _options(task_option) if task_option or not run_cfg else dict(run_cfg["task"]["options"])
    if steps is None and run_cfg:
        t = run_cfg["train"]
        steps = t["steps"] * t.get("mu", 1) * t.get("minibatches", 1)
    if not model or not task or not steps:
        raise GrpolabError("baseline sft: give --match-run RUN, or --model, --task and --steps")
    s = SFTSettings(mode=mode, steps=steps, batch_size=batch_size, lr=lr, seed=seed, precision=precision,
                    rft_samples=rft_samples, rft_temperature=rft_temperature, max_new_tokens=max_new_tokens)
    m = run_sft(model, task, options, s, out, limit=limit)
    console.print(f"{m['method']}: {m['num_examples']} examples from {m['num_problems']} problems, {steps} steps, "
                  f"loss {m['loss_before']:.3f} -> {m['loss_after']:.3f} ({m['seconds']:.0f}s)")
    console.print(f"wrote {out}  (evaluate it with: grpolab eval {out} --task {task} --split test)")


# ------------------------------------------------------------------------------------------------ compare

def _label(row: dict[str, Any], manifest_file: Optional[Path]) -> str:
    if manifest_file is not None and manifest_file.name == "manifest.json":
        return manifest_file.parent.name + ("" if row.get("method", "greedy") == "greedy" else f" {row['method']}")
    if manifest_file is not None:
        return f"{manifest_file.parent.name} ({json.loads(manifest_file.read_text()).get('method', 'baseline')})"
    return row["model"]


def _entries_from_json(file: Path) -> list[dict[str, Any]]:
    from ..overlap import find_manifest

    data = json.loads(file.read_text(encoding="utf-8"))
    if "models" not in data or "data_hash" not in data:
        raise GrpolabError(f"{file}: not an evaluation JSON (expected 'models' and 'data_hash')")
    out = []
    for row in data["models"]:
        found = find_manifest(row["model"], row.get("path"))
        out.append({**row, "label": _label(row, found[0] if found else None), "source": str(file),
                    "data_hash": data["data_hash"], "task": data["task"], "split": data["split"],
                    "samples": data.get("decoding", {}).get("samples", 0) if isinstance(data.get("decoding"), dict) else 0,
                    "manifest": found[1] if found else None})
    return out


def _entries_from_run(run: Path) -> list[dict[str, Any]]:
    from ..manifest import read_manifest

    files = sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []
    if files:
        return [e for f in files for e in _entries_from_json(f)]
    manifest = read_manifest(run)
    last = None
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            last = rec if "eval/accuracy" in rec else last
    if last is None:
        raise GrpolabError(f"{run}: no eval/*.json and no periodic eval in metrics.jsonl; run grpolab eval {run} --out {run}/eval/NAME.json")
    acc = {"mean": last["eval/accuracy"], "ci_low": last["eval/ci_low"], "ci_high": last["eval/ci_high"]}
    cfg = manifest["config"]
    return [{"label": run.name + " (periodic eval)", "model": str(run), "path": str(run), "method": "greedy",
             "source": str(run / "metrics.jsonl"), "data_hash": manifest["hashes"]["held_out_data"],
             "task": cfg["task"]["name"], "split": cfg["eval"]["split"], "samples": 0, "n": cfg["eval"]["num_problems"],
             "metrics": {"accuracy": acc}, "accuracy": acc["mean"], "len_mean": float("nan"),
             "truncated_frac": float("nan"), "items": [], "manifest": manifest}]


def load_entries(sources: list[Path]) -> list[dict[str, Any]]:
    """Rows of every source, deduplicated on (path, method, samples, data_hash), in order."""
    entries, seen = [], set()
    for src in sources:
        if src.is_dir() and (src / "manifest.json").is_file():
            got = _entries_from_run(src)
        elif src.is_file():
            got = _entries_from_json(src)
        else:
            raise GrpolabError(f"{src}: expected a run directory (with manifest.json) or an evaluation JSON file")
        for e in got:
            key = (str(Path(e.get("path") or e["model"]).resolve()), e.get("method"), e["samples"], e["data_hash"])
            if key not in seen:
                seen.add(key)
                entries.append(e)
    return entries


def seed_groups(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Groups (size >= 2) of runs on the same set and method whose manifests differ only in config.train.seed."""
    from ..manifest import diff_manifests

    groups: list[list[dict[str, Any]]] = []
    for e in (e for e in entries if e.get("manifest")):
        for g in groups:
            h = g[0]
            if (h["data_hash"], h.get("method"), h["samples"]) == (e["data_hash"], e.get("method"), e["samples"]) \
                    and {k for k, _, _ in diff_manifests(h["manifest"], e["manifest"])} <= SEED_KEYS:
                g.append(e)
                break
        else:
            groups.append([e])
    return [g for g in groups if len(g) >= 2]


def seed_summary(group: list[dict[str, Any]]) -> dict[str, Any]:
    """mean, std (ddof 1), min, max across the group's runs of every metric they all have."""
    names = [m for m in group[0]["metrics"] if all(m in e["metrics"] for e in group)]
    out: dict[str, Any] = {"runs": [e["label"] for e in group], "n_seeds": len(group),
                           "seeds": [e["manifest"]["config"]["train"]["seed"] for e in group], "metrics": {}}
    for m in names:
        v = np.array([e["metrics"][m]["mean"] for e in group], dtype=float)
        out["metrics"][m] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)), "min": float(v.min()), "max": float(v.max())}
    return out


def compare_entries(entries: list[dict[str, Any]], baseline: str = "") -> dict[str, Any]:
    """Side-by-side rows per evaluation set, with paired differences against each set's reference."""
    from ..baselines import entry_budget
    from ..evaluate import paired_diffs

    sets: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        sets.setdefault(e["data_hash"], []).append(e)
    out_sets = []
    for h, rows in sets.items():
        ref = next((r for r in rows if baseline and baseline in r["label"]), rows[0])
        table = []
        for r in rows:
            diff = paired_diffs(ref["items"], r["items"]) if r is not ref and ref["items"] and r["items"] else {}
            table.append({k: r.get(k) for k in ("label", "model", "method", "source", "n", "len_mean", "truncated_frac")}
                         | {"metrics": r["metrics"], "diff_vs_reference": diff, "budget": entry_budget(r)})
        out_sets.append({"data_hash": h, "task": rows[0]["task"], "split": rows[0]["split"], "reference": ref["label"],
                         "rows": table})
    return {"eval_sets": out_sets, "seed_groups": [seed_summary(g) for g in seed_groups(entries)]}


@app.command("compare")
def compare(
    sources: Annotated[list[Path], typer.Argument(help="run directories and/or evaluation JSON files")],
    baseline: Annotated[str, typer.Option(help="reference row: the first whose label contains this")] = "",
    out: Annotated[Optional[Path], typer.Option(help="write the comparison JSON here")] = None,
) -> None:
    """Runs and baselines side by side on the same held-out problems; mean and spread across seeds."""
    from ..baselines import budget_cells

    result = compare_entries(load_entries(sources), baseline)
    for s in result["eval_sets"]:
        names = list(dict.fromkeys(m for r in s["rows"] for m, v in r["metrics"].items() if m != "accuracy" and "ci_low" in v))
        t = Table(title=f"{s['task']} / {s['split']}  set {s['data_hash'][:10]}  (reference: {s['reference']})")
        budget = ("wall", "peak mem", "completions", "opt steps")  # grpolab.baselines.entry_budget
        for col in ("run / model", "method", "n", "accuracy [95% CI]", "Δ vs ref [95% CI]", *names, "len", "trunc", *budget):
            t.add_column(col, overflow="fold")
        for r in s["rows"]:
            d = r["diff_vs_reference"].get("accuracy")
            t.add_row(r["label"], str(r["method"]), str(r["n"]), _ci(r["metrics"]["accuracy"]), _ci(d) if d else "-",
                      *[f"{r['metrics'][m]['mean']:.3f}" if m in r["metrics"] else "-" for m in names],
                      f"{r['len_mean']:.1f}", f"{r['truncated_frac']:.2f}", *budget_cells(r.get("budget")))
        console.print(t)
    for g in result["seed_groups"]:
        t = Table(title=f"across {g['n_seeds']} seeds {g['seeds']}: {', '.join(g['runs'])}")
        for col in ("metric", "mean", "std", "min", "max"):
            t.add_column(col)
        for m, v in g["metrics"].items():
            t.add_row(m, f"{v['mean']:.3f}", f"{v['std']:.3f}", f"{v['min']:.3f}", f"{v['max']:.3f}")
        console.print(t)
    _write(out, result)
