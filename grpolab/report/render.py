"""report.html (self-contained: inline CSS, figures as data: URIs, no external reference) and report.md.

Every text taken from the run (completions, config values) is HTML-escaped, and "://" is written as
"&#58;//" so that no URL text in a completion reads as an external reference.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Sequence

from ..baselines.sft_bon import BUDGET_COLUMNS, budget_cells
from ..gate.base import NA, STATUSES, CheckResult
from ..gate.noninferiority import ni_summary
from ..gate.thresholds import Thresholds
from .markup import esc, fmt, pre, table
from .reward_model import html_section as rm_html_section

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1240px;color:#1d2433;
line-height:1.4;padding:0 12px}h1{margin-bottom:4px}h2{border-bottom:2px solid #dde3ea;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}th,td{border:1px solid #d5dbe3;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f1f4f8}code,pre{font-family:Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;border:1px solid #e1e4e8;padding:8px;white-space:pre-wrap;word-break:break-word;margin:2px 0}
.PASS{background:#1a7f37;color:#fff}.WARN{background:#d4a017;color:#000}.FAIL{background:#cf222e;color:#fff}
.NA{background:#6e7781;color:#fff}
.badge{font-weight:bold;padding:2px 8px;border-radius:4px;display:inline-block;min-width:44px;text-align:center}
.verdict{font-size:22px;font-weight:bold;padding:12px 16px;border-radius:6px;margin:12px 0}
.v-ship{background:#dafbe1;border:2px solid #1a7f37}.v-dont{background:#ffebe9;border:2px solid #cf222e}
.v-not{background:#fff8c5;border:2px solid #d4a017}.grid{display:flex;flex-wrap:wrap;gap:12px}
.grid figure{margin:0;border:1px solid #e1e4e8;padding:4px;background:#fff}.grid img{width:600px}
.note{color:#57606a;font-size:13px}.warn{background:#fff8c5;border-left:4px solid #d4a017;padding:6px 10px;margin:6px 0}
"""


def acc(d: dict[str, Any] | None) -> str:
    if not d:
        return "—"
    return f"{d['accuracy']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"


def diff(d: dict[str, Any] | None) -> str:
    if not d:
        return "—"
    tag = "" if d.get("paired", True) else " (unpaired approx.)"
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]{tag}"


def badge(status: str) -> str:
    """A coloured status label; N/A gets the CSS class "NA" (a class name cannot hold '/').

    >>> badge("N/A")
    '<span class="badge NA">N/A</span>'
    """
    return f'<span class="badge {"NA" if status == NA else status}">{esc(status)}</span>'


NA_NOTE = (
    "N/A: the check cannot fail in this run's configuration, or has too little evidence (its reason says which); "
    "it never counts as a pass, and too little evidence keeps the verdict from ship."
)


def status_counts(checks: Sequence[CheckResult]) -> str:
    """How many checks have each status, in report order; statuses no check has are left out.

    >>> status_counts([CheckResult("a", "g", "PASS", ""), CheckResult("b", "g", "N/A", "")])
    '2 checks: 1 PASS, 1 N/A'
    """
    counts = [f"{sum(c.status == s for c in checks)} {s}" for s in STATUSES if any(c.status == s for c in checks)]
    return f"{len(checks)} checks: {', '.join(counts)}"


def numbers_text(c: CheckResult) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in c.numbers.items())


# ---------------------------------------------------------------- sections


def section_verdict(r: dict[str, Any]) -> str:
    label, why = r["verdict"]
    cls = {"ship": "v-ship", "don't ship": "v-dont"}.get(label, "v-not")
    rows = [
        (badge(c.status), esc(c.name), esc(c.group), esc(c.reason), f"<code>{esc(numbers_text(c))}</code>")
        for c in r["checks"]
    ]
    family = f'<p class="note" id="family">{esc(r["family"])}</p>' if r.get("family") else ""
    family += f'<p class="note" id="noninferiority">{esc(ni_summary(r["checks"]))}</p>'
    return (
        f'<section id="verdict"><div class="verdict {cls}">Verdict: {esc(label.upper())}</div><p>{esc(why)}</p>{family}'
        f'</section><section id="checks"><h2>Checks</h2><p>{esc(status_counts(r["checks"]))}</p><p class="note">Failing '
        "checks first. Thresholds are listed at the end and can be changed with <code>--threshold name=value</code>. "
        f"{esc(NA_NOTE)}</p>" + table(["status", "check", "group", "reason", "numbers"], rows, raw=True) + "</section>"
    )


def checkpoint_text(h: dict[str, Any]) -> str:
    """Which checkpoint the held-out comparison judges and why, and the run's best one by held-out accuracy."""
    c = h.get("checkpoint")
    if not c:
        return ""
    text = f"Checkpoint judged: {c['judged']}, {c['why']}. "
    b = c["best"]
    if b is None:
        return text + (
            "No best checkpoint was kept: it is chosen only when training evaluates held-out problems "
            "periodically (eval.every_steps > 0)."
        )
    rule = (
        f"{b.get('rule', 'highest held-out accuracy; a tie keeps the earlier step')} (checkpoints/best.json). "
        f"Training reward then: {fmt(b.get('training_reward'))}"
    )
    if c["is_best"]:
        return text + f"It is the run's best checkpoint by held-out accuracy: {rule}."
    value = (
        acc(b | {"accuracy": b["value"]})
        if b.get("ci_low") is not None and b.get("ci_high") is not None
        else fmt(b["value"])
    )
    return text + (
        f"The run's best checkpoint by held-out accuracy is step-{b['step']}, {value} "
        f"on {b.get('num_problems')} problems: {rule}. To judge it, evaluate RUN:best "
        f"(grpolab eval BASE RUN:best --out RUN/eval/base_vs_trained.json) and build the report again."
    )


def section_heldout(r: dict[str, Any]) -> str:
    h = r["heldout"]
    out = ['<section id="heldout"><h2>Held-out comparison</h2>']
    if not h:
        return (
            out[0] + '<p class="warn">No held-out evaluation found (RUN_DIR/eval/*.json on the training task, or '
            "periodic eval in metrics.jsonl).</p></section>"
        )
    out.append(
        f'<p class="note">Source: {esc(h["source"])}; task {esc(h.get("task") or "training task")}, split '
        f"{esc(h.get('split') or '—')}, n = {esc(fmt(h.get('n')))}. Greedy decoding, math-verify scoring, 95% "
        "intervals (t over problems, as grpolab eval computes them); differences are paired over the same problems "
        "unless marked.</p>"
    )
    if h.get("checkpoint"):
        out.append(f'<p id="checkpoint-judged">{esc(checkpoint_text(h))}</p>')
    cost = lambda b: budget_cells(b.get("budget"))  # noqa: E731  (grpolab.baselines.sft_bon: wall, memory, completions, steps)
    rows = [
        (
            h["base"]["label"],
            acc(h["base"]),
            h["base"].get("n"),
            diff(h["diff"]) + "  (trained - base)",
            *cost(h["base"]),
        )
    ]
    rows.append((h["trained"]["label"], acc(h["trained"]), h["trained"].get("n"), "—", *cost(h["trained"])))
    for b in h.get("others", []) + r["baselines"]:
        rows.append((b["label"], acc(b), b.get("n"), diff(b["diff"]) + "  (trained - this)", *cost(b)))
    out.append(table(["model", "accuracy [95% CI]", "n", "difference [95% CI]", *BUDGET_COLUMNS], rows))
    if h.get("per_slice"):
        others = h.get("others", []) + r["baselines"]
        srows = [
            (
                s,
                acc(v["base"]),
                acc(v["trained"]),
                diff(v["diff"]),
                *(diff((b.get("per_slice") or {}).get(s, {}).get("diff")) for b in others),
            )
            for s, v in h["per_slice"].items()
        ]
        head = ["slice", "base", "trained", "trained - base", *(f"trained - {b['label']}" for b in others)]
        out.append("<h3>Per slice (95% CI)</h3>" + table(head, srows))
    counts = r.get("change_counts") or {}
    if counts:
        out.append(
            f"<p>Paired problems: {counts['paired']}; fixed by training (wrong → right): {counts['fixed']}; "
            f"broken (right → wrong): {counts['broken']}.</p>"
        )
    for title, png in r["comparison_figures"]:
        out.append(f'<figure><img alt="{esc(title)}" src="data:image/png;base64,{png}"></figure>')
    return "".join(out) + "</section>"


def section_regressions(r: dict[str, Any]) -> str:
    out = ['<section id="capability"><h2>Capability regression (untrained task)</h2>']
    if r["capability"]:
        rows = [
            (c["task"], c["source"], c.get("n"), acc(c["base"]), acc(c["trained"]), diff(c["diff"]))
            for c in r["capability"]
        ]
        out.append(table(["task", "source", "n", "base", "trained", "trained - base"], rows))
        out += [
            f'<figure><img alt="{esc(t)}" src="data:image/png;base64,{png}"></figure>'
            for t, png in r["capability_figures"]
        ]
    else:
        out.append(
            '<p class="warn">Not measured: no eval of a task other than the training task in RUN_DIR/eval/. '
            "Run <code>grpolab report RUN_DIR --capability-task gsm8k --capability-n 50</code>.</p>"
        )
    out.append('</section><section id="safety"><h2>Safety regression (harmful requests)</h2>')
    s = r["safety"]
    if not s:
        out.append(f'<p class="warn">Not measured: {esc(r.get("safety_note") or "skipped")}.</p>')
    else:
        out.append(
            f"<p>{s['n']} plainly harmful requests ({esc(s.get('source', 'the set shipped with grpolab'))}), "
            f"greedy, {s['max_new_tokens']} new tokens. Compliance: base {s['base']['compliance_rate']:.2f}, "
            f"trained {s['trained']['compliance_rate']:.2f}, trained - base {esc(diff(s['increase']))} (paired "
            f"over the prompts); newly complied {s['newly_complied']}, newly refused "
            f'{s["newly_refused"]}.</p><p class="note">Refusal is judged by a crude {esc(s["heuristic"])}. '
            "It is a regression probe between two models, not a safety evaluation.</p>"
        )
        flips = [it for it in s["items"] if it["base_refused"] != it["trained_refused"]]
        rows = [
            (
                esc(it["id"]),
                esc(it["prompt"]),
                "refused" if it["base_refused"] else "complied",
                "refused" if it["trained_refused"] else "complied",
                pre(it["trained_completion"], 300),
            )
            for it in flips
        ]
        if rows:
            head = ["id", "prompt", "base", "trained", "trained answer"]
            out.append("<h3>Prompts whose outcome changed</h3>" + table(head, rows, raw=True))
    return "".join(out) + "</section>"


def diversity_text(d: dict[str, Any] | None, note: str) -> str:
    """One line on the pass@k evidence (plain text; escaped by the HTML caller)."""
    if not d:
        return f"Not measured: {note or 'skipped'}."
    span = lambda x: f"{x['mean']:.3f} [{x['ci_low']:.3f}, {x['ci_high']:.3f}]"  # noqa: E731
    return (
        f"pass@{d['k']} on {d['n']} held-out problems, {d['samples']} samples each at the training temperature "
        f"T={d['temperature']:g} (unbiased estimator): base {span(d['base'])}, trained {span(d['trained'])}, "
        f"trained - base {diff(d['diff'])}. Source: {d['source']}."
    )


def section_diversity(r: dict[str, Any]) -> str:
    cls = "" if r.get("diversity") else ' class="warn"'
    return (
        f'<section id="diversity"><h2>Diversity (held-out pass@k)</h2><p{cls}>{esc(diversity_text(r.get("diversity"), r.get("diversity_note", "")))}</p>'
        '<p class="note">An entropy collapse predicts that the trained model finds fewer distinct right answers when it '
        "samples; this measures it. Paired interval over problems (over runs and problems for a set of runs).</p></section>"
    )


def set_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(run, held-out gain, pass@k gain, capability gains) of every run of a set."""
    rows = []
    for p in r["set"]["per_run"]:
        h, d = p.get("heldout"), p.get("diversity")
        caps = "; ".join(f"{c['task']} {diff(c['diff'])}" for c in p.get("capability") or []) or "—"
        rows.append((p["label"], diff(h["diff"]) if h else "—", diff(d["diff"]) if d else "—", caps))
    return rows


def spread_text(d: dict[str, Any] | None) -> str:
    if not d or "spread" not in d:
        return ""
    s = d["spread"]
    std = "—" if s["std"] is None else f"{s['std']:.3f}"
    return f"between runs: mean {s['mean']:+.3f}, std {std}, min {s['min']:+.3f}, max {s['max']:+.3f}"


def section_set(r: dict[str, Any]) -> str:
    """The runs of a set and each one's own gains ("" for the report of one run)."""
    if not r.get("set"):
        return ""
    h = r.get("heldout")
    lead = (
        f"Held-out gain over the set: {diff(h['diff'])}, {spread_text(h['diff'])}."
        if h
        else "No held-out comparison with per-problem records in every run."
    )
    return (
        '<section id="set"><h2>Runs of this set</h2>'
        f'<p>{esc(lead)}</p><p class="note">Every interval of this report is over the runs and the problems: a t '
        "interval with a problem part and a between-seed part, each with its own degrees of freedom "
        "(grpolab/evaluation/sets.py; its coverage: docs/evaluation.md). The checks judge the set, not one run; the training curves are the mean "
        "over runs.</p>"
        + table(["run", "held-out gain [95% CI]", "pass@k gain [95% CI]", "capability gain [95% CI]"], set_rows(r))
        + "</section>"
    )


def section_curves(r: dict[str, Any]) -> str:
    figs = "".join(
        f'<figure><img alt="{esc(t)}" src="data:image/png;base64,{png}"></figure>' for t, png in r["figures"]
    )
    if not figs:
        figs = '<p class="warn">metrics.jsonl has no rows.</p>'
    return f'<section id="curves"><h2>Training curves</h2><div class="grid">{figs}</div></section>'


def section_samples(r: dict[str, Any]) -> str:
    def sample_rows(items):
        return [
            (
                esc(fmt(s.get("step"))),
                esc(s.get("uid", "")),
                esc(s.get("gold", "")),
                esc(fmt(s.get("reward"))),
                esc(fmt(s.get("advantage"))),
                pre(s.get("completion", "")),
            )
            for s in items
        ]

    head = ["step", "uid", "gold", "reward", "advantage", "completion"]
    out = [
        '<section id="samples"><h2>Sample completions</h2><h3>Best (highest reward, late training)</h3>',
        table(head, sample_rows(r["best"]), raw=True) if r["best"] else "<p>no samples.jsonl</p>",
        "<h3>Worst (lowest reward, late training)</h3>",
        table(head, sample_rows(r["worst"]), raw=True) if r["worst"] else "<p>no samples.jsonl</p>",
        "<h3>Answers that changed between base and trained model (held-out)</h3>",
    ]
    rows = [
        (
            esc(c["kind"]),
            esc(c["uid"]),
            esc(c["gold"]),
            esc(fmt(c["base_answer"])),
            pre(c["base_completion"], 400),
            esc(fmt(c["trained_answer"])),
            pre(c["trained_completion"], 400),
        )
        for c in r["changed"]
    ]
    out.append(
        table(
            ["change", "uid", "gold", "base answer", "base completion", "trained answer", "trained completion"],
            rows,
            raw=True,
        )
        if rows
        else "<p>none (or no paired held-out items)</p>"
    )
    return "".join(out) + "</section>"


def section_objective(m: dict[str, Any]) -> str:
    obj = m.get("objective") or {}
    out = [
        '<section id="objective"><h2>Objective card</h2>',
        f"<p>Preset <b>{esc(obj.get('preset', '—'))}</b></p><pre>{esc(obj.get('formula', '—'))}</pre>",
        table(["choice", "value"], sorted((obj.get("choices") or {}).items())),
    ]
    for peer, eq in (obj.get("equivalents") or {}).items():
        out.append(
            f"<h3>Nearest {esc(peer)} settings</h3>"
            + table(["setting", "value"], [(k, json.dumps(v)) for k, v in eq.items()])
        )
    return "".join(out) + "</section>"


def repro_warnings(m: dict[str, Any]) -> list[str]:
    warns = []
    git = m.get("git") or {}
    if git.get("dirty"):
        warns.append(
            f"The working tree had uncommitted changes when this run started (commit {git.get('commit')}): "
            "the commit alone does not reproduce the code."
        )
    elif git.get("commit") is None:
        warns.append("The run was not started from a git checkout: the code version is unknown.")
    missing = [k for k, v in (m.get("hashes") or {}).items() if v is None]
    if missing:
        warns.append(f"The manifest lacks hashes for: {', '.join(missing)} (the run cannot be verified byte-for-byte).")
    return warns


def section_manifest(m: dict[str, Any]) -> str:
    out = [
        '<section id="manifest"><h2>Manifest and reproducibility</h2><p>Reproduce with:</p>',
        f"<pre>{esc(m.get('command', '— (no command recorded)'))}</pre>",
    ]
    out += [f'<p class="warn">{esc(w)}</p>' for w in repro_warnings(m)]
    git = m.get("git") or {}
    out.append(
        table(
            ["field", "value"],
            [
                ("created", m.get("created")),
                ("seed", m.get("seed")),
                ("model_path", m.get("model_path")),
                ("git commit", git.get("commit")),
                ("git dirty", git.get("dirty")),
            ],
        )
    )
    hashes = [(k, v if v else "MISSING") for k, v in (m.get("hashes") or {}).items()]
    out.append("<h3>Hashes (sha256)</h3>" + table(["what", "hash"], hashes))
    out.append("<h3>Versions</h3>" + table(["package", "version"], (m.get("versions") or {}).items()))
    out.append("<h3>Machine</h3>" + table(["field", "value"], (m.get("machine") or {}).items()))
    out.append(
        f"<details><summary>Resolved config</summary><pre>{esc(json.dumps(m.get('config'), indent=2))}</pre></details>"
    )
    return "".join(out) + "</section>"


def section_thresholds(t: Thresholds) -> str:
    default = Thresholds()
    rows = []
    for f in fields(t):
        value, dflt = getattr(t, f.name), getattr(default, f.name)
        rows.append((f.name, value, "" if value == dflt else f"changed (default {dflt})", f.metadata.get("doc", "")))
    return (
        '<section id="thresholds"><h2>Thresholds</h2><p class="note">Change with <code>--threshold name=value</code>.</p>'
        + table(["name", "value", "", "meaning"], rows)
        + "</section>"
    )


def render_html(r: dict[str, Any]) -> str:
    m = r["manifest"]
    title = f"grpolab release report — {r['run_name']}"
    body = "".join(
        [
            f"<h1>{esc(title)}</h1><p class='note'>Generated {esc(r['generated'])} from {esc(r['run_dir'])}. "
            f"Training task: {esc(r['train_task'])}; model {esc((m.get('config') or {}).get('model', {}).get('name', '—'))}.</p>",
            section_verdict(r),
            section_set(r),
            section_heldout(r),
            section_regressions(r),
            section_diversity(r),
            section_curves(r),
            section_samples(r),
            rm_html_section(r),
            section_objective(m),
            section_manifest(m),
            section_thresholds(r["thresholds"]),
        ]
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head><body>{body}</body></html>\n"
    )
