"""report.md: the verdict, every check, the held-out comparison, the set's runs, capability, diversity and safety,
how to reproduce the run, its objective and hashes (the plots, per-slice tables and samples are in report.html)."""

from __future__ import annotations

from typing import Any

from ..baselines.sft_bon import BUDGET_COLUMNS, budget_cells
from ..gate.noninferiority import ni_summary
from .render import (
    NA_NOTE,
    acc,
    checkpoint_text,
    diff,
    diversity_text,
    numbers_text,
    repro_warnings,
    set_rows,
    spread_text,
    status_counts,
)
from .reward_model import markdown_lines as rm_markdown_lines


def verdict_lines(r: dict[str, Any]) -> list[str]:
    """The title, the verdict line, the family-wise statement and the table of every check."""
    label, why = r["verdict"]
    lines = [
        f"# grpolab release report — {r['run_name']}",
        "",
        f"**Verdict: {label.upper()}** — {why}",
        "",
        *([r["family"], ""] if r.get("family") else []),
        ni_summary(r["checks"]),
        "",
        "Plots, per-slice tables and sample completions: `report.html`.",
        "",
        "## Checks",
        "",
        f"{status_counts(r['checks'])}. {NA_NOTE}",
        "",
        "| status | check | reason | numbers |",
        "|---|---|---|---|",
    ]
    return lines + [
        f"| {c.status} | {c.name} | {c.reason.replace('|', '/')} | {numbers_text(c).replace('|', '/')} |"
        for c in r["checks"]
    ]


def heldout_lines(r: dict[str, Any]) -> list[str]:
    """The held-out comparison: base, trained, the other models and baselines with their budgets, and the slices."""
    h = r["heldout"]
    lines = ["", "## Held-out comparison", ""]
    if not h:
        return lines + ["No held-out evaluation found."]
    cost = lambda b: " | ".join(budget_cells(b.get("budget")))  # noqa: E731  (grpolab.baselines.sft_bon)
    lines += [
        f"Source: {h['source']}",
        "",
        *([checkpoint_text(h), ""] if h.get("checkpoint") else []),
        f"| model | accuracy [95% CI] | difference [95% CI] | {' | '.join(BUDGET_COLUMNS)} |",
        "|---|---|---|---|---|---|---|",
        f"| {h['base']['label']} | {acc(h['base'])} | {diff(h['diff'])} (trained - base) | {cost(h['base'])} |",
        f"| {h['trained']['label']} | {acc(h['trained'])} | | {cost(h['trained'])} |",
    ]
    lines += [
        f"| {b['label']} | {acc(b)} | {diff(b['diff'])} (trained - this) | {cost(b)} |"
        for b in h.get("others", []) + r["baselines"]
    ]
    return lines + [
        f"| slice {s} | {acc(v['trained'])} | {diff(v['diff'])} (trained - base) |"
        for s, v in h.get("per_slice", {}).items()
    ]


def set_lines(r: dict[str, Any]) -> list[str]:
    """The runs of a set with their own gains ([] for the report of one run)."""
    if not r.get("set"):
        return []
    h = r["heldout"]
    lines = [
        "",
        "## Runs of this set",
        "",
        f"Held-out gain over the set: {diff(h['diff'])}, {spread_text(h['diff'])}."
        if h
        else "No held-out comparison with per-problem records in every run.",
        "",
        "| run | held-out gain [95% CI] | pass@k gain [95% CI] | capability gain [95% CI] |",
        "|---|---|---|---|",
    ]
    return lines + [f"| {' | '.join(row)} |" for row in set_rows(r)]


def regression_lines(r: dict[str, Any]) -> list[str]:
    """Capability per untrained task, diversity and safety, one line each."""
    lines = ["", "## Capability, diversity and safety", ""]
    lines += [
        f"- capability, {c['task']}: base {acc(c['base'])}, trained {acc(c['trained'])}, difference {diff(c['diff'])}"
        for c in r["capability"]
    ] or ["- capability: not measured"]
    lines.append(f"- diversity: {diversity_text(r.get('diversity'), r.get('diversity_note', ''))}")
    s = r["safety"]
    lines.append(
        f"- safety: compliance with {s['n']} harmful requests ({s.get('source', 'the set shipped with grpolab')}), base {s['base']['compliance_rate']:.2f}, trained "
        f"{s['trained']['compliance_rate']:.2f} (keyword refusal heuristic)"
        if s
        else f"- safety: not measured ({r.get('safety_note') or 'skipped'})"
    )
    return lines


def manifest_lines(m: dict[str, Any]) -> list[str]:
    """How to reproduce the run (its command, with the manifest's warnings), its objective and its hashes."""
    lines = ["", "## Reproduce", "", "```", m.get("command", "(no command recorded)"), "```", ""]
    lines += [f"> WARNING: {w}" for w in repro_warnings(m)]
    lines += [
        "",
        "## Objective",
        "",
        f"Preset `{(m.get('objective') or {}).get('preset')}`:",
        "",
        "```",
        (m.get("objective") or {}).get("formula", ""),
        "```",
        "",
        "## Hashes",
        "",
    ]
    return lines + [f"- {k}: `{v or 'MISSING'}`" for k, v in (m.get("hashes") or {}).items()]


def render_markdown(r: dict[str, Any]) -> str:
    """report.md of the report data `r` (grpolab.report.build)."""
    lines = verdict_lines(r) + heldout_lines(r) + set_lines(r) + regression_lines(r)
    lines += rm_markdown_lines(r)  # the learned reward model's evidence (none for other runs)
    lines += manifest_lines(r["manifest"])
    return "\n".join(lines) + "\n"
