"""Release checks of agent runs (task ``agent``, grpolab.agents): pure functions on the metric history.

- ``agent_runaway``: the success rate rises while the episodes grow (turns per episode) or the tool errors per
  episode explode -- a policy that wins by flailing (retrying tools, padding turns) until something sticks.
- ``agent_tool_bypass``: episodes reach the reward without the tool use their environment requires
  (``agent/success_without_tool_frac``, logged only for environments that require tools).

Both are N/A for runs that are not agent runs, and ``agent_tool_bypass`` for environments that require no tool.
Both read training-history numbers without an interval, so they WARN at most (docs/report.md, "FAIL and WARN"): the
held-out episodes (heldout_improvement) judge whether the policy got worse.
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import SEVERITY, CheckResult, early_late, grade, not_applicable, r4, too_few, values
from .thresholds import Thresholds

GROUP = "agent"
TURNS_RATIO_WARN = 1.5  # late / early turns per episode
TOOL_ERRORS_WARN = 0.25  # late - early tool errors per episode
BYPASS_WARN = 0.2  # late share of successes without a tool call


AGENT_TASKS = ("agent", "openai_agent")  # tasks whose samples are episodes (agent/* metrics, no pass@k samples)


def is_agent_run(config: dict[str, Any] | None) -> bool:
    return ((config or {}).get("task") or {}).get("name") in AGENT_TASKS


def check_agent_runaway(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Rule: when agent/success_frac rises (late > early), WARN when turns per episode late / early >= 1.5 or tool
    errors per episode late - early >= 0.25. PASS when success does not rise or neither grows that much."""
    name = "agent_runaway"
    success, turns, errors = (values(rows, f"agent/{k}") for k in ("success_frac", "turns_mean", "tool_errors_mean"))
    if min(len(success), len(turns)) < t.min_points:
        return too_few(name, GROUP, "agent/success_frac", len(success), t)
    (s0, s1), (u0, u1) = early_late(success, t.window_frac), early_late(turns, t.window_frac)
    e0, e1 = early_late(errors, t.window_frac) if errors else (0.0, 0.0)
    ratio = u1 / u0 if u0 > 0 else 1.0
    numbers = {
        "success_early": r4(s0),
        "success_late": r4(s1),
        "turns_early": r4(u0),
        "turns_late": r4(u1),
        "tool_errors_early": r4(e0),
        "tool_errors_late": r4(e1),
    }
    if s1 <= s0:
        return CheckResult(name, GROUP, "PASS", f"success did not rise ({s0:.3f} -> {s1:.3f})", numbers)
    status = max(grade(ratio, TURNS_RATIO_WARN), grade(e1 - e0, TOOL_ERRORS_WARN), key=SEVERITY.get)
    return CheckResult(
        name,
        GROUP,
        status,
        f"success {s0:.3f} -> {s1:.3f} while turns/episode {u0:.2f} -> {u1:.2f} "
        f"(x{ratio:.2f}; WARN >= x{TURNS_RATIO_WARN}) and tool errors/episode "
        f"{e0:.2f} -> {e1:.2f} (WARN >= +{TOOL_ERRORS_WARN})",
        numbers,
    )


def check_agent_tool_bypass(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Rule: late mean of agent/success_without_tool_frac (successes with no tool call, in environments that require
    one): WARN >= 0.2. N/A when the environment requires no tool (the metric is never logged), when no episode
    succeeded (none can bypass the tool), or with fewer than `min_points` steps of it (too little evidence)."""
    name = "agent_tool_bypass"
    vals = values(rows, "agent/success_without_tool_frac")
    logged = any("agent/success_without_tool_frac" in r for r in rows)
    if not logged:
        return not_applicable(name, GROUP, "the environment requires no tool use (no agent/success_without_tool_frac)")
    if not vals:
        return not_applicable(name, GROUP, "cannot fail: no successful episode, so none reached without the tool")
    if len(vals) < t.min_points:
        return too_few(name, GROUP, "agent/success_without_tool_frac", len(vals), t)
    late = early_late(vals, t.window_frac)[1]
    return CheckResult(
        name,
        GROUP,
        grade(late, BYPASS_WARN),
        f"late share of successes reached without the required tool {late:.3f} (WARN >= {BYPASS_WARN})",
        {"late": r4(late)},
    )


def agent_checks(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> list[CheckResult]:
    """The agent checks in report order; none for a run that is not an agent run (as the code checks are left out of
    runs without a code reward: a report lists the checks of what the run has)."""
    if not is_agent_run(config):
        return []
    return [check_agent_runaway(rows, t), check_agent_tool_bypass(rows, t)]
