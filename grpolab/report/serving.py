"""Release checks on serving: is the model people will serve the model that was evaluated (serving_consistency),
and can the previous model be put back, known to be what it was (rollback_ready)?

Both read what `grpolab release` measured and cached in RUN/release/serving.json and RUN/release/rollback.json
(grpolab.serving.check; this module does not import it). Not run: N/A with the reason, never PASS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import FAIL, PASS, WARN, CheckResult, Thresholds, not_applicable

SERVING_FILE, ROLLBACK_FILE = "serving.json", "rollback.json"
NOT_RUN = "not run: `grpolab release RUN_DIR` writes the release bundle and runs the serving and rollback checks"


def load_release_evidence(run_dir: Path) -> dict[str, Any]:
    """{"serving": serving.json or None, "rollback": rollback.json or None} of RUN/release/."""
    out: dict[str, Any] = {}
    for key, name in (("serving", SERVING_FILE), ("rollback", ROLLBACK_FILE)):
        path = Path(run_dir) / "release" / name
        try:
            out[key] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[key] = None
    return out


def _span(d: dict[str, float]) -> str:
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def serving_identity_problems(s: dict[str, Any]) -> list[str]:
    """What makes the served model not the evaluated one, whatever it answers: a chat template other than the
    run's, prompts tokenised differently, other end ids, weights other than the evaluated model's in the bundle's
    precision. Empty when none.

    >>> serving_identity_problems({"chat_template": {"run": "a", "served": "a"}, "prompts_identical": 1.0,
    ...     "stop_ids": {"run": [2], "served": []}, "weights": {"tensors": 3, "identical": 3}})
    ['end ids differ: the run stopped on [2], the served generation_config on []']
    """
    problems = []
    template = s["chat_template"]
    if template["run"] and template["run"] != template["served"]:
        problems.append(f"chat template differs from the run's (sha256 {template['served'][:12]} vs {template['run'][:12]})")
    if s["prompts_identical"] < 1:
        problems.append(f"the served prompts differ from the evaluated ones on {1 - s['prompts_identical']:.0%} of the "
                        f"problems (template or tokenizer)")
    if sorted(s["stop_ids"]["run"]) != sorted(s["stop_ids"]["served"]):
        problems.append(f"end ids differ: the run stopped on {s['stop_ids']['run']}, the served generation_config on "
                        f"{s['stop_ids']['served']}")
    w = s["weights"]
    if w["identical"] < w["tensors"]:
        problems.append(f"weights differ from the evaluated model: {w['tensors'] - w['identical']} of {w['tensors']} "
                        f"tensors (max |diff| {w.get('max_abs_diff', float('nan')):.3g}; an unmerged LoRA serves the base)")
    return problems


def check_serving_consistency(s: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Serving consistency: the bundle served by plain transformers (another process, no grpolab code) against
    grpolab's evaluation of the checkpoint on the same held-out problems.

    Rule: FAIL when serving_identity_problems finds any (template, prompts, end ids, weights) or when the served
    accuracy is lower, established: the paired interval of served - evaluated lies below 0 (ci_high < 0). WARN when
    the share of completions not token-identical exceeds `serving_divergence_warn` (default 0.1) while the metric
    holds -- e.g. a bf16 bundle of an fp32 model -- with the divergence shown. PASS otherwise. Not run: N/A.
    """
    name, group = "serving_consistency", "release"
    if not s:
        return not_applicable(name, group, NOT_RUN)
    d, m, lp = s["metric"]["diff"], s["metric"], s["logprob_diff"]
    fd = s.get("first_divergence") or {}
    numbers = {"n": s["n"], "identical": round(s["identical_share"], 4), "first_divergence_median": fd.get("median"),
               "mean_abs_dlogp": float(f"{lp['mean']:.3g}"), "evaluated": round(m["evaluated"], 4),
               "served": round(m["served"], 4), "diff": round(d["mean"], 4), "ci_low": round(d["ci_low"], 4),
               "ci_high": round(d["ci_high"], 4), "precision": f"{s['precision']['bundle']} (evaluated {s['precision']['evaluated']})",
               "truncated_served": round(s["truncated"]["served"], 4), "bundle": s["bundle"]}
    shown = (f"{s['identical_share']:.0%} of {s['n']} completions identical, mean |dlogp| {lp['mean']:.2g}/token, "
             f"accuracy {m['evaluated']:.3f} -> {m['served']:.3f} ({_span(d)})")
    problems = serving_identity_problems(s)
    if d["ci_high"] < 0:
        problems.append(f"served accuracy is lower, established: {_span(d)}")
    if problems:
        return CheckResult(name, group, FAIL, "; ".join(problems) + f" -- {shown}", numbers)
    if 1 - s["identical_share"] > t.serving_divergence_warn:
        return CheckResult(name, group, WARN, f"completions diverge beyond {t.serving_divergence_warn:.0%} "
                           f"(first divergence at token {fd.get('median')}, median) while the metric holds: {shown}", numbers)
    return CheckResult(name, group, PASS, f"served by transformers {s['served']['stack']['transformers']} "
                       f"with the run's template, end ids and evaluated weights; {shown}", numbers)


def check_rollback_ready(r: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Rollback readiness: the rollback target (the base model, or a previous release bundle) is named with its
    weight hash, that hash is the one recorded when it was measured, it loads in the serving stack, and it
    reproduces its recorded held-out score on a sample: the paired interval of served - recorded contains 0.

    Rule: FAIL when the hash is unknown or differs, the target does not load, or the interval excludes 0; PASS
    otherwise, with the one command that serves the target instead. Not run: N/A.
    """
    name, group = "rollback_ready", "release"
    if not r:
        return not_applicable(name, group, NOT_RUN)
    w = r["weights"]
    numbers = {"target": r["target"], "kind": r["kind"], "weights": (w["now"] or "none")[:16], "n": r["n"],
               "command": r["command"]}
    problems = []
    if not w["recorded"]:
        problems.append("no weight hash was recorded for it: it cannot be shown to be what was measured")
    elif w["recorded"] != w["now"]:
        problems.append(f"its weights changed since they were measured (sha256 {str(w['now'])[:12]} vs recorded {w['recorded'][:12]})")
    if not r.get("loads"):
        problems.append(f"it does not load in the serving stack: {r.get('error', 'unknown error')}")
    else:
        d = r["diff"]
        numbers.update({"recorded": round(r["recorded_accuracy_on_sample"], 4), "served": round(r["served_accuracy"], 4),
                        "diff": round(d["mean"], 4), "ci_low": round(d["ci_low"], 4), "ci_high": round(d["ci_high"], 4)})
        if not d["ci_low"] <= 0 <= d["ci_high"]:
            problems.append(f"it does not reproduce its recorded score on {r['n']} problems: {_span(d)}")
    what = f"{r['kind']} {r['target']} (weights sha256 {(w['now'] or 'unknown')[:12]})"
    if problems:
        return CheckResult(name, group, FAIL, f"rollback target {what}: " + "; ".join(problems), numbers)
    return CheckResult(name, group, PASS, f"rollback target {what} loads and reproduces its recorded score on {r['n']} "
                       f"problems ({r['recorded_accuracy_on_sample']:.3f} -> {r['served_accuracy']:.3f}, {_span(r['diff'])}); "
                       f"serve it instead with: {r['command']}", numbers)


def release_checks(evidence: dict[str, Any] | None, t: Thresholds) -> list[CheckResult]:
    """serving_consistency and rollback_ready of a run's release evidence (load_release_evidence)."""
    evidence = evidence or {}
    return [check_serving_consistency(evidence.get("serving"), t), check_rollback_ready(evidence.get("rollback"), t)]
