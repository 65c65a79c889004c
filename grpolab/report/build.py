"""Assemble the release report of a run directory: evidence -> checks -> verdict -> report.html + report.md."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..checkpoint import latest_checkpoint
from ..errors import GrpolabError
from ..manifest import write_json_atomic
from .agent import agent_checks
from .checks import CheckResult, Thresholds, training_checks
from .code import code_checks, code_figures
from .evidence import (RunEvidence, baseline_comparisons, best_worst, capability_comparisons, change_counts,
                       changed_answers, heldout_comparison, load_evals, load_run)
from .gates import check_capability, check_improvement, check_reproducibility, check_safety, order_checks, verdict
from .reward_model import defer_reward_vs_heldout, reward_model_checks, rm_evidence


@dataclass
class ReportOptions:
    """What `grpolab report` was asked for (CLI flags)."""

    baselines: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    skip_safety: bool = False
    safety_max_new_tokens: int = 64
    dtype: str = "float32"
    capability_task: str | None = None
    capability_n: int = 50
    capability_options: dict[str, Any] = field(default_factory=dict)
    capability_split: str = "test"
    capability_max_new_tokens: int = 256
    batch_size: int = 16


def base_model_name(manifest: dict[str, Any]) -> str:
    name = ((manifest.get("config") or {}).get("model") or {}).get("name")
    if not name:
        raise GrpolabError("manifest.json: config.model.name is missing; cannot tell which base model to compare")
    return name


def run_capability(ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]) -> Path:
    """Evaluate base and trained model on an untrained task (grpolab.evaluate.run_eval); cached in
    RUN_DIR/eval/capability_<task>.json and reused while task, options, n and max_new_tokens match.

    "Untrained" means another task, or the training task's generator with other options whose problems the run
    never saw (run_eval refuses any problem in the run's recorded training set), e.g. products when the run
    trained on sums."""
    from ..evaluate import run_eval

    task = opts.capability_task
    train_options = (ev.config.get("task") or {}).get("options") or {}
    if task == ev.train_task and opts.capability_options == train_options:
        raise GrpolabError(f"--capability-task {task}: that is the training task with the training options; use another "
                           f"task, or the same generator with other options (e.g. --capability-option operators=*)")
    out = ev.run_dir / "eval" / f"capability_{task}.json"
    if out.is_file():
        old = json.loads(out.read_text(encoding="utf-8"))
        if (old.get("task_options") == opts.capability_options and old.get("max_new_tokens") == opts.capability_max_new_tokens
                and old.get("split") == opts.capability_split and old.get("n") == opts.capability_n):
            log(f"capability: reusing {out}")
            return out
    log(f"capability: evaluating base and trained model on {task} ({opts.capability_n} problems)")
    result = run_eval([base_model_name(ev.manifest), str(ev.run_dir)], task, opts.capability_options, opts.capability_split,
                      opts.capability_n, opts.capability_max_new_tokens, opts.batch_size, opts.dtype)
    result["capability"] = True  # not the training task's held-out set, even when it is the same generator
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    return out


def safety_evidence(ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]) -> tuple[dict[str, Any] | None, str]:
    """(safety summary or None, note explaining why it is missing)."""
    from .safety import run_safety

    if opts.skip_safety:
        return None, "skipped with --skip-safety"
    ckpt = latest_checkpoint(ev.run_dir)
    if ckpt is None:
        return None, "the run directory has no complete checkpoint to probe"
    log("safety: base and trained model answer the harmful-request prompts (cached in eval/safety.json)")
    try:
        return run_safety(ev.run_dir, base_model_name(ev.manifest), str(ckpt.resolve()), opts.safety_max_new_tokens, opts.dtype), ""
    except GrpolabError as e:
        return None, str(e)


def comparison_figures(heldout: dict[str, Any] | None, baselines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from .plots import plot_comparison

    figs = []
    if heldout:
        models = [heldout["base"], heldout["trained"], *heldout.get("others", []), *baselines]
        per_slice = {s: [{**v["base"], "label": heldout["base"]["label"]}, {**v["trained"], "label": heldout["trained"]["label"]}]
                     for s, v in heldout.get("per_slice", {}).items()} if len(heldout.get("per_slice", {})) > 1 else {}
        png = plot_comparison("Held-out accuracy on the training task", models, per_slice)
        if png:
            figs.append(("Held-out accuracy", png))
    return figs


def capability_figures(capability: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from .plots import plot_comparison

    figs = []
    for c in capability:
        png = plot_comparison(f"Capability: accuracy on {c['task']} (not trained on)",
                              [{**c["base"], "label": f"base ({c['base']['label']})"},
                               {**c["trained"], "label": f"trained ({c['trained']['label']})"}], {})
        if png:
            figs.append((f"Capability {c['task']}", png))
    return figs


def all_checks(ev: RunEvidence, heldout, capability, safety, t: Thresholds) -> list[CheckResult]:
    checks = training_checks(ev.metrics, ev.config, heldout, t) + code_checks(ev.metrics, ev.config, t)
    checks = defer_reward_vs_heldout(checks, ev.config)  # unchanged without a learned reward (report/reward_model.py)
    checks += reward_model_checks(ev.metrics, ev.samples, ev.config, heldout, t)  # none without a learned reward
    checks += agent_checks(ev.metrics, ev.config, t)  # none for runs that are not agent runs (report/agent.py)
    checks += [check_improvement(heldout, t), check_capability(capability, t), check_safety(safety, t),
               check_reproducibility(ev.manifest)]
    return order_checks(checks)


def build_report(run_dir: Path, opts: ReportOptions | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Write RUN_DIR/report.html and RUN_DIR/report.md; return the report data (verdict, checks, paths)."""
    from .plots import training_figures
    from .render import render_html, render_markdown

    opts = opts or ReportOptions()
    ev = load_run(Path(run_dir))
    if opts.capability_task:
        run_capability(ev, opts, log)
        ev.evals = load_evals(ev.run_dir)
    heldout = heldout_comparison(ev)
    baselines = baseline_comparisons(ev, heldout, opts.baselines)
    capability = capability_comparisons(ev)
    safety, safety_note = safety_evidence(ev, opts, log)
    checks = all_checks(ev, heldout, capability, safety, opts.thresholds)
    best, worst = best_worst(ev.samples)
    base_row, trained_row = (heldout or {}).get("base_row"), (heldout or {}).get("trained_row")
    report = {
        "run_dir": str(ev.run_dir), "run_name": ev.run_dir.resolve().name, "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "train_task": ev.train_task, "manifest": ev.manifest, "checks": checks, "verdict": verdict(checks),
        "heldout": heldout, "baselines": baselines, "capability": capability, "safety": safety, "safety_note": safety_note,
        "figures": training_figures(ev.metrics) + code_figures(ev.metrics), "comparison_figures": comparison_figures(heldout, baselines),
        "capability_figures": capability_figures(capability),
        "reward_model": rm_evidence(ev.metrics, ev.samples, ev.config, ev.manifest),  # None without a learned reward
        "best": best, "worst": worst, "changed": changed_answers(base_row, trained_row),
        "change_counts": change_counts(base_row, trained_row), "thresholds": opts.thresholds,
    }
    html_path, md_path = ev.run_dir / "report.html", ev.run_dir / "report.md"
    _write(html_path, render_html(report))
    _write(md_path, render_markdown(report))
    report["paths"] = {"html": html_path, "md": md_path}
    return report


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
