"""The release gate: checks, plots and the HTML/Markdown report of a run directory (`grpolab report`).

Modules: base (statuses incl. N/A, CheckResult, Thresholds, helpers on metric rows and the resolved config),
hacking (reward-hacking checks), checks (learning-signal and dynamics checks; re-exports base and hacking),
gates (held-out, capability, safety, reproducibility, verdict), evidence (reading a run directory), safety
(harmful-request probe), diversity (held-out pass@k of base and trained model), the checks of particular runs --
agent, code, judge, reward_model, serving (is the served model the evaluated one) -- sets (a set of runs, seeds of
one recipe), compare (`grpolab compare`), plots, markup (HTML building blocks), render (report.html, report.md),
build (evidence -> checks -> verdict -> report), progress (heartbeat lines of the long phases).
Importing this package is cheap; `build_report` and `ReportOptions` load their dependencies on first use.

May import: baselines, training (metrics), evaluation, rewards, models, manifest. Imported by: card, runs, the CLI
and the Python API.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReportOptions", "build_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import build

        return getattr(build, name)
    raise AttributeError(name)
