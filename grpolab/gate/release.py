"""Release checks on serving: is the model people will serve the model that was evaluated (serving_consistency),
and can the previous model be put back, known to be what it was (rollback_ready)?

Both read what `grpolab release` measured and cached in RUN/release/serving.json (plain transformers),
serving_gguf.json (the GGUF file served by llama.cpp, `--stack gguf`) and rollback.json (grpolab.serving.check;
this module does not import it). Not run: N/A with the reason, never PASS.
"""

from __future__ import annotations

from typing import Any

from .base import FAIL, PASS, WARN, CheckResult, not_applicable
from .stats import span
from .thresholds import Thresholds

NOT_RUN = "not run: `grpolab release RUN_DIR` writes the release bundle and runs the serving and rollback checks"
GGUF_NOT_RUN = (
    "GGUF via llama.cpp: N/A, not run (`grpolab release RUN_DIR --stack gguf`, needs llama-cpp-python: "
    "`make install-gguf`)"
)
TRANSFORMERS_NOT_RUN = "transformers: N/A, not run (`grpolab release RUN_DIR`)"
ORDER = {PASS: 0, WARN: 1, FAIL: 2}


def _stop_id_problems(stops: dict[str, Any]) -> list[str]:
    """End ids: the served stack must stop on exactly the run's ids (transformers: its generation_config). llama.cpp
    (a "declared" list): the file must declare the run's ids and llama.cpp must end on each of them; the other ids
    it ends on by its own rule (token text, fill-in-the-middle tokens) are shown (serving_extra_end_ids), not failed: the completions show their effect."""
    run, served = sorted(stops["run"]), sorted(stops["served"])
    if "declared" not in stops:
        return (
            []
            if run == served
            else [
                f"end ids differ: the run stopped on {stops['run']}, the served generation_config on {stops['served']}"
            ]
        )
    problems = []
    if sorted(stops["declared"]) != run:
        problems.append(f"end ids differ: the run stopped on {run}, the GGUF file declares {sorted(stops['declared'])}")
    if set(run) - set(served):
        problems.append(f"llama.cpp does not end generation on {sorted(set(run) - set(served))} of the run's end ids")
    return problems


def serving_extra_end_ids(s: dict[str, Any]) -> list[int]:
    """Ids the served stack ends on that the run did not stop on (llama.cpp's own end-of-generation tokens)."""
    return sorted(set(s["stop_ids"]["served"]) - set(s["stop_ids"]["run"]))


def serving_identity_problems(s: dict[str, Any]) -> list[str]:
    """What makes the served model not the evaluated one, whatever it answers: a chat template other than the
    run's, prompts tokenised differently, other end ids (_stop_id_problems), weights other than the evaluated
    model's in the bundle's precision (for a GGUF: put through the conversion). Empty when none.

    >>> serving_identity_problems({"chat_template": {"run": "a", "served": "a"}, "prompts_identical": 1.0,
    ...     "stop_ids": {"run": [2], "served": []}, "weights": {"tensors": 3, "identical": 3}})
    ['end ids differ: the run stopped on [2], the served generation_config on []']
    """
    problems = []
    template = s["chat_template"]
    if template["run"] and template["run"] != template["served"]:
        problems.append(
            f"chat template differs from the run's (sha256 {template['served'][:12]} vs {template['run'][:12]})"
        )
    if s["prompts_identical"] < 1:
        problems.append(
            f"the served prompts differ from the evaluated ones on {1 - s['prompts_identical']:.0%} of the "
            f"problems (template or tokenizer)"
        )
    problems += _stop_id_problems(s["stop_ids"])
    w = s["weights"]
    if w["identical"] < w["tensors"] or w.get("missing"):
        problems.append(
            f"weights differ from the evaluated model: {w['tensors'] - w['identical']} of {w['tensors']} "
            f"tensors (max |diff| {w.get('max_abs_diff', float('nan')):.3g}; an unmerged LoRA serves the base)"
            + (f"; missing from the file: {w['missing']}" if w.get("missing") else "")
        )
    return problems


def grade_serving(s: dict[str, Any], t: Thresholds) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, numbers) of one served stack against grpolab's evaluation: the rule of
    check_serving_consistency."""
    d, m, lp = s["metric"]["diff"], s["metric"], s["logprob_diff"]
    fd = s.get("first_divergence") or {}
    gguf = s.get("gguf")
    precision = s["precision"]
    where = (
        f"gguf {precision['bundle']} (bundle {precision.get('written')}, evaluated {precision['evaluated']})"
        if gguf
        else f"{precision['bundle']} (evaluated {precision['evaluated']})"
    )
    numbers = {
        "n": s["n"],
        "identical": round(s["identical_share"], 4),
        "first_divergence_median": fd.get("median"),
        "mean_abs_dlogp": float(f"{lp['mean']:.3g}"),
        "evaluated": round(m["evaluated"], 4),
        "served": round(m["served"], 4),
        "diff": round(d["mean"], 4),
        "ci_low": round(d["ci_low"], 4),
        "ci_high": round(d["ci_high"], 4),
        "precision": where,
        "truncated_served": round(s["truncated"]["served"], 4),
        "bundle": s["bundle"],
    }
    shown = (
        f"{s['identical_share']:.0%} of {s['n']} completions identical, mean |dlogp| {lp['mean']:.2g}/token, "
        f"accuracy {m['evaluated']:.3f} -> {m['served']:.3f} ({span(d)})"
    )
    extra = serving_extra_end_ids(s)
    if extra:
        shown += f"; llama.cpp also ends on ids {extra} (its own end-of-generation rule), which the run did not stop on"
    problems = serving_identity_problems(s)
    if d["ci_high"] < 0:
        problems.append(f"served accuracy is lower, established: {span(d)}")
    if problems:
        return FAIL, "; ".join(problems) + f" -- {shown}", numbers
    if 1 - s["identical_share"] > t.serving_divergence_warn:
        return (
            WARN,
            (
                f"completions diverge beyond {t.serving_divergence_warn:.0%} (first divergence at token "
                f"{fd.get('median')}, median) while the metric holds: {shown}"
            ),
            numbers,
        )
    served_by = (
        f"llama.cpp (llama-cpp-python {s['served']['stack'].get('llama_cpp')}) from a {precision['bundle']} GGUF"
        if gguf
        else f"transformers {s['served']['stack'].get('transformers')}"
    )
    return PASS, f"served by {served_by} with the run's template, end ids and evaluated weights; {shown}", numbers


def check_serving_consistency(
    s: dict[str, Any] | None, t: Thresholds, gguf: dict[str, Any] | None = None
) -> CheckResult:
    """Serving consistency: the bundle served by another stack in another process with no grpolab code -- plain
    transformers (serving.json) and, when run, the bundle's GGUF file served by llama.cpp (serving_gguf.json) --
    against grpolab's evaluation of the checkpoint on the same held-out problems.

    Rule, per stack (grade_serving): FAIL when serving_identity_problems finds any (template, prompts, end ids,
    weights) or when the served accuracy is lower, established: the paired interval of served - evaluated lies
    below 0 (ci_high < 0). WARN when the share of completions not token-identical exceeds `serving_divergence_warn`
    (default 0.1) while the metric holds -- e.g. a bf16 bundle of an fp32 model -- with the divergence shown. PASS
    otherwise. The check takes the worse of the stacks that ran; a stack not run is named N/A in the reason and the
    numbers, never PASS. Neither run: N/A.
    """
    name, group = "serving_consistency", "release"
    if not s and not gguf:
        return not_applicable(name, group, NOT_RUN)
    graded = [("transformers", s and grade_serving(s, t)), ("llama.cpp", gguf and grade_serving(gguf, t))]
    ran = [(stack, g) for stack, g in graded if g]
    status = max((g[0] for _, g in ran), key=ORDER.__getitem__)
    if len(ran) == 2:
        (_, (st, rt, nt)), (_, (sg, rg, ng)) = ran
        reason = f"transformers {st}: {rt} | GGUF via llama.cpp {sg}: {rg}"
        return CheckResult(name, group, status, reason, nt | {f"gguf_{k}": v for k, v in ng.items() if k != "bundle"})
    stack, (_, text, numbers) = ran[0]
    if stack == "transformers":
        return CheckResult(name, group, status, f"{text}; {GGUF_NOT_RUN}", numbers | {"gguf": "N/A: not run"})
    return CheckResult(
        name,
        group,
        status,
        f"GGUF via llama.cpp: {text}; {TRANSFORMERS_NOT_RUN}",
        {f"gguf_{k}": v for k, v in numbers.items()} | {"transformers": "N/A: not run"},
    )


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
    numbers = {
        "target": r["target"],
        "kind": r["kind"],
        "weights": (w["now"] or "none")[:16],
        "n": r["n"],
        "command": r["command"],
    }
    problems = []
    if not w["recorded"]:
        problems.append("no weight hash was recorded for it: it cannot be shown to be what was measured")
    elif w["recorded"] != w["now"]:
        problems.append(
            f"its weights changed since they were measured (sha256 {str(w['now'])[:12]} vs recorded {w['recorded'][:12]})"
        )
    if not r.get("loads"):
        problems.append(f"it does not load in the serving stack: {r.get('error', 'unknown error')}")
    else:
        d = r["diff"]
        numbers.update(
            {
                "recorded": round(r["recorded_accuracy_on_sample"], 4),
                "served": round(r["served_accuracy"], 4),
                "diff": round(d["mean"], 4),
                "ci_low": round(d["ci_low"], 4),
                "ci_high": round(d["ci_high"], 4),
            }
        )
        if not d["ci_low"] <= 0 <= d["ci_high"]:
            problems.append(f"it does not reproduce its recorded score on {r['n']} problems: {span(d)}")
    what = f"{r['kind']} {r['target']} (weights sha256 {(w['now'] or 'unknown')[:12]})"
    if problems:
        return CheckResult(name, group, FAIL, f"rollback target {what}: " + "; ".join(problems), numbers)
    return CheckResult(
        name,
        group,
        PASS,
        f"rollback target {what} loads and reproduces its recorded score on {r['n']} "
        f"problems ({r['recorded_accuracy_on_sample']:.3f} -> {r['served_accuracy']:.3f}, {span(r['diff'])}); "
        f"serve it instead with: {r['command']}",
        numbers,
    )


def release_checks(evidence: dict[str, Any] | None, t: Thresholds) -> list[CheckResult]:
    """serving_consistency and rollback_ready of a run's release evidence (load_release_evidence)."""
    evidence = evidence or {}
    return [
        check_serving_consistency(evidence.get("serving"), t, evidence.get("serving_gguf")),
        check_rollback_ready(evidence.get("rollback"), t),
    ]
