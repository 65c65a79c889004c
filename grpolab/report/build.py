"""Assemble the release report of a run directory: evidence -> checks -> verdict -> report.html + report.md."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import GrpolabError
from ..gate.family import family_statement
from ..gate.noninferiority import parse_waivers
from ..gate.thresholds import Thresholds
from ..gate.verdict import all_checks, verdict
from ..manifest import write_json_atomic
from ..models.checkpoint import best_checkpoint, latest_checkpoint
from .diversity import DiversitySettings, run_diversity
from .evidence import (
    RunEvidence,
    baseline_comparisons,
    best_worst,
    capability_comparisons,
    change_counts,
    changed_answers,
    heldout_comparison,
    load_evals,
    load_release_evidence,
    load_run,
)
from .plots import code_figures
from .reward_model import rm_evidence


@dataclass
class ReportOptions:
    """What `grpolab report` was asked for (CLI flags)."""

    baselines: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    skip_safety: bool = False
    safety_max_new_tokens: int = 64
    safety_prompts: Path | None = (
        None  # the probe's JSONL prompts (report/safety.py load_prompts); None: the bundled 30
    )
    dtype: str = "float32"
    capability_task: str | None = None
    capability_n: int = 50
    capability_options: dict[str, Any] = field(default_factory=dict)
    capability_split: str = "test"
    capability_max_new_tokens: int = 256
    batch_size: int = 16
    skip_diversity: bool = False
    diversity: DiversitySettings = field(default_factory=DiversitySettings)
    out: Path | None = None  # where the report of a set of runs is written (default: set_report_dir)
    best: bool = False  # RUN:best: the report's own model runs (capability, safety, diversity) use the best checkpoint
    waived: tuple[str, ...] = ()  # harm dimensions the user waived (--waive: gate/noninferiority.py parse_waivers)

    def __post_init__(self) -> None:
        if self.safety_prompts is not None and not self.skip_safety:
            from .safety import load_prompts

            load_prompts(self.safety_prompts)  # a malformed file is refused here, before any model runs


def split_best(paths: Sequence[str | Path]) -> tuple[list[Path], bool]:
    """Run directories named plainly or as RUN:best (every one alike), and whether :best was asked for.

    >>> split_best(["runs/a:best"])
    ([PosixPath('runs/a')], True)
    """
    names = [str(p) for p in paths]
    best = [n.endswith(":best") for n in names]
    if any(best) and not all(best):
        raise GrpolabError(
            f"run directories {names}: name every run RUN:best or none (the set is judged at one kind of checkpoint)"
        )
    return [Path(n.removesuffix(":best")) for n in names], all(best) and bool(names)


def judged_weights(ev: RunEvidence, opts: ReportOptions) -> Path | None:
    """The checkpoint the report's own model runs load: the best one by held-out accuracy for RUN:best (an error if
    the run kept none), else the newest complete one (None when there is none)."""
    return best_checkpoint(ev.run_dir) if opts.best else latest_checkpoint(ev.run_dir)


def base_model_name(manifest: dict[str, Any]) -> str:
    name = ((manifest.get("config") or {}).get("model") or {}).get("name")
    if not name:
        raise GrpolabError("manifest.json: config.model.name is missing; cannot tell which base model to compare")
    return name


def run_capability(ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]) -> Path:
    """Evaluate base and trained model on an untrained task (grpolab.evaluation.heldout.run_eval); cached in
    RUN_DIR/eval/capability_<task>.json and reused while task, options, n and max_new_tokens match.

    "Untrained" means another task, or the training task's generator with other options whose problems the run
    never saw (run_eval refuses any problem in the run's recorded training set), e.g. products when the run
    trained on sums."""
    from ..evaluation.heldout import run_eval

    task = opts.capability_task
    train_options = (ev.config.get("task") or {}).get("options") or {}
    if task == ev.train_task and opts.capability_options == train_options:
        raise GrpolabError(
            f"--capability-task {task}: that is the training task with the training options; use another "
            f"task, or the same generator with other options (e.g. --capability-option operators=*)"
        )
    out = ev.run_dir / "eval" / f"capability_{task}.json"
    ckpt = judged_weights(ev, opts)
    trained = str(ckpt) if ckpt is not None else str(ev.run_dir)
    if out.is_file():
        old = json.loads(out.read_text(encoding="utf-8"))
        if (
            old.get("task_options") == opts.capability_options
            and old.get("max_new_tokens") == opts.capability_max_new_tokens
            and old.get("split") == opts.capability_split
            and old.get("n") == opts.capability_n
            and old.get("trained_checkpoint", trained) == trained
        ):
            log(f"capability: reusing {out}")
            return out
    log(f"capability: evaluating base and trained model on {task} ({opts.capability_n} problems)")
    from .progress import Heartbeat

    with Heartbeat(log, f"capability {task}") as beat:
        result = run_eval(
            [base_model_name(ev.manifest), trained],
            task,
            opts.capability_options,
            opts.capability_split,
            opts.capability_n,
            opts.capability_max_new_tokens,
            opts.batch_size,
            opts.dtype,
            progress=beat.progress,
        )
    result["capability"] = True  # not the training task's held-out set, even when it is the same generator
    result["trained_checkpoint"] = trained
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    return out


def safety_evidence(
    ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]
) -> tuple[dict[str, Any] | None, str]:
    """(safety summary or None, note explaining why it is missing)."""
    from .safety import PROMPTS_FILE, load_prompts, run_safety

    if opts.skip_safety:
        return None, "skipped with --skip-safety"
    ckpt = judged_weights(ev, opts)
    if ckpt is None:
        return None, "the run directory has no complete checkpoint to probe"
    log("safety: base and trained model answer the harmful-request prompts (cached in eval/safety.json)")
    source = opts.safety_prompts or PROMPTS_FILE
    try:
        summary = run_safety(
            ev.run_dir,
            base_model_name(ev.manifest),
            str(ckpt.resolve()),
            opts.safety_max_new_tokens,
            opts.dtype,
            prompts=load_prompts(source),
            log=log,
        )
    except GrpolabError as e:
        return None, str(e)
    named = f"{Path(source).name} (--safety-prompts)" if opts.safety_prompts else "the set shipped with grpolab"
    return {**summary, "source": named}, ""


def comparison_figures(heldout: dict[str, Any] | None, baselines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from .plots import plot_comparison

    figs = []
    if heldout:
        models = [heldout["base"], heldout["trained"], *heldout.get("others", []), *baselines]
        per_slice = (
            {
                s: [
                    {**v["base"], "label": heldout["base"]["label"]},
                    {**v["trained"], "label": heldout["trained"]["label"]},
                ]
                for s, v in heldout.get("per_slice", {}).items()
            }
            if len(heldout.get("per_slice", {})) > 1
            else {}
        )
        png = plot_comparison("Held-out accuracy on the training task", models, per_slice)
        if png:
            figs.append(("Held-out accuracy", png))
    return figs


def capability_figures(capability: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from .plots import plot_comparison

    figs = []
    for c in capability:
        png = plot_comparison(
            f"Capability: accuracy on {c['task']} (not trained on)",
            [
                {**c["base"], "label": f"base ({c['base']['label']})"},
                {**c["trained"], "label": f"trained ({c['trained']['label']})"},
            ],
            {},
        )
        if png:
            figs.append((f"Capability {c['task']}", png))
    return figs


def diversity_evidence(
    ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]
) -> tuple[dict[str, Any] | None, str]:
    """(pass@k evidence or None, why it is missing): report/diversity.py, unless --skip-diversity."""
    if opts.skip_diversity:
        return None, "skipped with --skip-diversity"
    try:
        return run_diversity(
            ev.run_dir,
            judged_weights(ev, opts),
            ev.config,
            base_model_name(ev.manifest),
            opts.diversity,
            opts.dtype,
            log,
        )
    except GrpolabError as e:
        return None, str(e)


def run_evidence(ev: RunEvidence, opts: ReportOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Every held-out measurement of one run: held-out comparison, capability, safety and diversity (running the
    evaluations that were asked for and are not cached yet)."""
    if opts.capability_task:
        run_capability(ev, opts, log)
        ev.evals = load_evals(ev.run_dir)
    safety, safety_note = safety_evidence(ev, opts, log)
    diversity, diversity_note = diversity_evidence(ev, opts, log)
    return {
        "heldout": heldout_comparison(ev),
        "capability": capability_comparisons(ev),
        "safety": safety,
        "safety_note": safety_note,
        "diversity": diversity,
        "diversity_note": diversity_note,
        # RUN/release/*.json of `grpolab release` (graded by gate/release.py)
        "release": load_release_evidence(ev.run_dir),
    }


def build_report(
    run_dir: Path | Sequence[Path], opts: ReportOptions | None = None, log: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Write report.html and report.md of one run (into RUN_DIR) or of a set of runs (several seeds of one recipe;
    into opts.out, default set_report_dir); return the report data (verdict, checks, paths)."""
    opts = opts or ReportOptions()
    parse_waivers(opts.waived)  # an unknown --waive name fails before any model runs
    dirs, best = split_best([run_dir] if isinstance(run_dir, (str, Path)) else run_dir)
    if best:
        opts = replace(opts, best=True)
        for d in dirs:  # RUN:best without a best checkpoint is an error, never a silent judgement of the newest
            best_checkpoint(d)
    if len(dirs) > 1:
        return build_set_report(dirs, opts, log)
    ev = load_run(dirs[0])
    e = run_evidence(ev, opts, log)
    heldout = e["heldout"]
    baselines = baseline_comparisons(ev, heldout, opts.baselines)
    base_row, trained_row = (heldout or {}).get("base_row"), (heldout or {}).get("trained_row")
    report = {
        **e,
        "run_dir": str(ev.run_dir),
        "run_name": ev.run_dir.resolve().name,
        "train_task": ev.train_task,
        "manifest": ev.manifest,
        "baselines": baselines,
        "checks": all_checks(ev.metrics, ev.samples, ev.config, [ev.manifest], e, opts.thresholds, opts.waived),
        "comparison_figures": comparison_figures(heldout, baselines),
        "changed": changed_answers(base_row, trained_row),
        "change_counts": change_counts(base_row, trained_row),
    }
    return write_report(report, ev.metrics, ev.samples, ev.config, ev.run_dir, opts)


def set_report_dir(dirs: Sequence[Path]) -> Path:
    """Where a set's report goes by default: beside the runs, named after what their names share, + "-set"
    (runs/quickstart-seed0, runs/quickstart-seed1 -> runs/quickstart-set).

    >>> set_report_dir([Path("runs/qs-seed0"), Path("runs/qs-seed1")]).as_posix()
    'runs/qs-set'
    """
    import os
    import re

    stem = re.sub(r"[-_]?seed$", "", os.path.commonprefix([d.name for d in dirs]).rstrip("-_")).rstrip("-_")
    return dirs[0].parent / f"{stem or dirs[0].name}-set"


def build_set_report(dirs: Sequence[Path], opts: ReportOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """The report of a set of runs (report/sets.py): every check on the set's evidence."""
    from .sets import check_recipe, mean_rows, set_capability, set_diversity, set_heldout, set_safety

    if opts.baselines:
        raise GrpolabError(
            "--baseline: applies to the report of one run; compare sets of runs with grpolab compare --set"
        )
    evs = [load_run(d) for d in dirs]
    labels = [ev.run_dir.name for ev in evs]
    check_recipe(labels, [ev.manifest for ev in evs])
    per_run = []
    for ev in evs:
        log(f"{ev.run_dir.name}:")
        per_run.append(run_evidence(ev, opts, log))
    notes = lambda key: "; ".join(dict.fromkeys(p[key] for p in per_run if p[key]))  # noqa: E731
    e = {
        "heldout": set_heldout([p["heldout"] for p in per_run], labels),
        "capability": set_capability([p["capability"] for p in per_run], labels),
        "safety": set_safety([p["safety"] for p in per_run], labels),
        "safety_note": notes("safety_note"),
        "diversity": set_diversity([p["diversity"] for p in per_run], labels),
        "diversity_note": notes("diversity_note"),
    }
    metrics, samples = mean_rows([ev.metrics for ev in evs]), [s for ev in evs for s in ev.samples]
    out = Path(opts.out) if opts.out else set_report_dir(dirs)
    out.mkdir(parents=True, exist_ok=True)
    first = evs[0]
    report = {
        **e,
        "run_dir": str(out),
        "run_name": f"{out.name} ({len(evs)} runs: {', '.join(labels)})",
        "train_task": first.train_task,
        "manifest": first.manifest,
        "baselines": [],
        "checks": all_checks(
            metrics, samples, first.config, [ev.manifest for ev in evs], e, opts.thresholds, opts.waived
        ),
        "comparison_figures": comparison_figures(e["heldout"], []),
        "changed": [],
        "change_counts": {},
        "set": {
            "runs": labels,
            "dirs": [str(d) for d in dirs],
            "seeds": [ev.manifest.get("seed") for ev in evs],
            "per_run": [{"label": label, **p} for label, p in zip(labels, per_run)],
        },
    }
    return write_report(report, metrics, samples, first.config, out, opts)


def write_report(
    report: dict[str, Any],
    metrics: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    config: dict[str, Any],
    out: Path,
    opts: ReportOptions,
) -> dict[str, Any]:
    """Add the verdict, figures and samples to `report`, write OUT/report.html and OUT/report.md."""
    from .markdown import render_markdown
    from .plots import training_figures
    from .render import render_html

    best, worst = best_worst(samples)
    report.update(
        {
            "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
            "verdict": verdict(report["checks"]),
            "family": family_statement(report["checks"], opts.thresholds.family_alpha),
            "figures": training_figures(metrics) + code_figures(metrics),
            "capability_figures": capability_figures(report["capability"]),
            "reward_model": rm_evidence(metrics, samples, config, report["manifest"]),  # None without a learned reward
            "best": best,
            "worst": worst,
            "thresholds": opts.thresholds,
            "waived": list(opts.waived),
        }
    )
    html_path, md_path = out / "report.html", out / "report.md"
    _write(html_path, render_html(report))
    _write(md_path, render_markdown(report))
    report["paths"] = {"html": html_path, "md": md_path}
    return report


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
