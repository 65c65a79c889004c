"""The release report of a run directory (`grpolab report`): gathers the evidence, has grpolab.gate judge it, and
renders the checks and the verdict.

Modules: ``evidence`` (reading a run directory into evidence records), ``periodic`` (the periodic held-out evals as
the comparison, paired on the problems), ``safety`` (the harmful-request probe),
``diversity`` (held-out pass@k of base and trained model), ``sets`` (the evidence of a set of runs, seeds of one
recipe), ``render`` (report.html), ``markdown`` (report.md), ``markup`` (HTML building blocks), ``plots``,
``reward_model`` (the learned reward model's section), ``build`` (evidence -> gate -> report), ``compare``
(`grpolab compare`), ``progress`` (heartbeat lines of the long phases). Importing this package is cheap;
`build_report` and `ReportOptions` load their dependencies on first use.

May import: gate, baselines, training (metrics), evaluation, rewards, models, manifest. Imported by: the CLI and the
Python API.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReportOptions", "build_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import build

        return getattr(build, name)
    raise AttributeError(name)
