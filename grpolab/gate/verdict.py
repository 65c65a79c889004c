"""The verdict over every check (ship / don't ship / not established), the reproducibility check, and the gate's
entry point: every check of a run's (or a set's) evidence records, under the family-wise control of the FAIL rules."""

from __future__ import annotations

from typing import Any, Sequence

from .agent import agent_checks
from .base import FAIL, NA, PASS, SEVERITY, WARN, CheckResult
from .code import code_checks
from .evidence import Evidence
from .family import family_control
from .heldout import check_improvement
from .judge import judge_checks
from .noninferiority import apply_waivers, lacking_noninferiority, ni_text, parse_waivers, waived_names
from .regression import check_capability, check_diversity, check_safety
from .release import release_checks
from .reward_model import defer_reward_vs_heldout, reward_model_checks
from .thresholds import Thresholds
from .training import training_checks

SHIP, DONT_SHIP, NOT_ESTABLISHED = "ship", "don't ship", "not established"


def check_reproducibility(manifest: dict[str, Any]) -> CheckResult:
    """Reproducibility: the run can be re-run exactly.

    Rule: WARN when the working tree had uncommitted changes (git.dirty true), when the git state is
    unknown, when the command is missing, or when any entry of `hashes` is None. Never FAIL.
    """
    name, group = "reproducibility", "reproducibility"
    git = manifest.get("git") or {}
    missing = sorted(k for k, v in (manifest.get("hashes") or {}).items() if v is None)
    problems = []
    if git.get("dirty"):
        problems.append("the working tree had uncommitted changes (the commit alone does not reproduce the code)")
    elif git.get("dirty") is None or not git.get("commit"):
        problems.append("git state unknown (not run from a git checkout)")
    if missing:
        problems.append(f"manifest lacks hashes: {', '.join(missing)}")
    if not manifest.get("command"):
        problems.append("no command recorded")
    numbers = {"commit": git.get("commit"), "dirty": git.get("dirty"), "missing_hashes": ", ".join(missing) or "none"}
    if problems:
        return CheckResult(name, group, WARN, "; ".join(problems), numbers)
    return CheckResult(name, group, PASS, "clean commit, every hash and the command recorded", numbers)


def order_checks(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """FAIL first, then WARN, then PASS, then N/A; report order kept within each."""
    return sorted(checks, key=lambda c: -SEVERITY[c.status])


def verdict(checks: Sequence[CheckResult]) -> tuple[str, str]:
    """(verdict, one-line explanation).

    N/A checks that cannot fail in this run's configuration are ignored: neither a pass nor "not measured". Of the
    rest: don't ship: any FAIL (after Holm: family_control). not established: no FAIL, but heldout_improvement is not
    PASS (a WARN -- not established, or worse on a slice --, or N/A), or some required evidence was not measured or
    is too little (a check with ``measured`` False, N/A "too little evidence" included), or a harm dimension's
    non-inferiority is not established and not waived (CheckResult.noninferiority: each capability task, pass@k,
    safety; the line names each with the problems that would establish it). ship: otherwise (remaining WARNs and
    the N/A checks are listed with it). A FAIL that Holm did not keep (numbers["harm_unresolved"]) is a WARN here:
    it blocks only through its dimension's non-inferiority. The verdict is never ship without a PASS of
    heldout_improvement, and every line names what the user waived.
    """
    waived = waived_names(checks)
    tail = f"; waived by the user: {', '.join(waived)}" if waived else ""
    na = [c.name for c in checks if c.status == NA and c.measured]
    lacking = [c.name for c in checks if not c.measured]
    fails = [c.name for c in checks if c.status == FAIL]
    if fails:
        return DONT_SHIP, f"failing checks: {', '.join(fails)}{tail}"
    improvement = next((c for c in checks if c.name == "heldout_improvement"), None)
    if improvement is None or improvement.status != PASS:
        return NOT_ESTABLISHED, (improvement.reason if improvement else "no held-out comparison") + tail
    if lacking:
        return NOT_ESTABLISHED, f"not measured or too little evidence: {', '.join(lacking)}{tail}"
    unshown = lacking_noninferiority(checks)
    if unshown:
        return NOT_ESTABLISHED, (
            "non-inferiority not established (measure more, or waive with --waive): "
            + "; ".join(ni_text(label, r) for label, r in unshown)
            + tail
        )
    warns = [c.name for c in checks if c.status == WARN]
    why = f"no check fails; warnings: {', '.join(warns)}" if warns else "all applicable checks pass"
    return SHIP, why + (f"; N/A in this configuration: {', '.join(na)}" if na else "") + tail


def all_checks(
    metrics: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    config: dict[str, Any],
    manifests: list[dict[str, Any]],
    e: Evidence,
    t: Thresholds,
    waived: Sequence[str] = (),
) -> list[CheckResult]:
    """Every check, on one run's evidence or a set's (`metrics`, `samples`: the training history, a set's averaged
    per step; `config`: the resolved config; `manifests`: each run's; `e`: the held-out evidence records), under the
    family-wise control of the FAIL rules, with the harm dimensions the user `waived` (``--waive``:
    noninferiority.parse_waivers) marked, in report order."""
    heldout = e["heldout"]
    checks = training_checks(metrics, config, heldout, t, e["diversity"]) + code_checks(metrics, config, t)
    checks = defer_reward_vs_heldout(checks, config)  # unchanged without a learned reward (gate/reward_model.py)
    checks += reward_model_checks(metrics, samples, config, heldout, t)  # none without a learned reward
    checks += judge_checks(samples, config, t)  # none without an LLM judge (gate/judge.py)
    checks += agent_checks(metrics, config, t)  # none for runs that are not agent runs (gate/agent.py)
    checks += [
        check_improvement(heldout, t),
        check_capability(e["capability"], t),
        check_diversity(e["diversity"], e["diversity_note"], t),
        check_safety(e["safety"], t, e.get("safety_note", "")),
        max((check_reproducibility(m) for m in manifests), key=lambda c: SEVERITY[c.status]),
    ]
    checks += release_checks(e.get("release"), t)  # N/A until `grpolab release` ran (a set of runs: N/A)
    return judged(checks, t, waived)


def judged(checks: Sequence[CheckResult], t: Thresholds, waived: Sequence[str] = ()) -> list[CheckResult]:
    """The checks as the verdict reads them: Holm over every FAIL rule (family.family_control), the user's waivers
    marked (noninferiority.apply_waivers, names checked by parse_waivers), in report order."""
    checks = family_control(checks, t.family_alpha)
    return order_checks(apply_waivers(checks, parse_waivers(waived)))
