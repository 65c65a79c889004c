"""What the report shows of a run rewarded by a learned reward model (docs/reward_models.md): the reward model, its
score and the held-out accuracy at each periodic eval, the mean score of right and wrong samples, the samples with
the highest score and a wrong answer, and a figure; as data (rm_evidence) and as its report.html / report.md section.
The checks of such a run are grpolab.gate.reward_model's."""

from __future__ import annotations

from typing import Any, Sequence

from ..gate.base import values
from ..gate.reward_model import periodic_evals, rm_key, rm_weighted, scored_samples
from .markup import esc, fmt, pre, table


def rm_evidence(
    rows: Sequence[dict[str, Any]],
    samples: Sequence[dict[str, Any]],
    config: dict[str, Any] | None,
    manifest: dict[str, Any] | None = None,
    k: int = 5,
) -> dict[str, Any] | None:
    """What the report shows of a reward-model run (None for other runs): the reward model, score and held-out
    accuracy at each periodic eval, mean score of right and wrong samples, and the k samples with the highest
    score and a wrong answer."""
    if not rm_weighted(config):
        return None
    key = rm_key(rows)
    by_step = {r.get("step"): r.get(key) for r in rows}
    evals = [{**e, "rm": by_step.get(e["step"])} for e in periodic_evals(rows)]
    pool = scored_samples(samples)
    right = [s["rm"] for s in pool if s["right"] == 1.0]
    wrong = [s for s in pool if s["right"] == 0.0]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    top_wrong = sorted(wrong, key=lambda s: -s["rm"])[:k]
    return {
        "record": (manifest or {}).get("reward_model"),
        "key": key,
        "evals": evals,
        "samples": len(pool),
        "mean_rm_right": mean(right),
        "mean_rm_wrong": mean([s["rm"] for s in wrong]),
        "n_right": len(right),
        "n_wrong": len(wrong),
        "top_wrong": top_wrong,
        "figure": rm_figure(rows, key, pool),
    }


def rm_figure(rows: Sequence[dict[str, Any]], key: str, pool: Sequence[dict[str, Any]]) -> str | None:
    """Base64 PNG: reward-model score and held-out accuracy (95% intervals) over steps; score vs length of the
    samples, right and wrong apart. None without matplotlib or data."""
    from .plots import _encode, _plt

    steps = [(r["step"], float(r[key])) for r in rows if values([r], key)]
    if not steps:
        return None
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax.plot(*zip(*steps), color="tab:purple", alpha=0.8, label=f"reward-model score ({key})")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward-model score")
    ax.set_title("Reward-model score vs held-out accuracy")
    evals = periodic_evals(rows)
    if evals:
        ay = ax.twinx()
        xs = [e["step"] for e in evals]
        lo = [e["accuracy"] - e["ci_low"] if e["ci_low"] is not None else 0.0 for e in evals]  # no interval: no bar
        hi = [e["ci_high"] - e["accuracy"] if e["ci_high"] is not None else 0.0 for e in evals]
        ay.errorbar(
            xs,
            [e["accuracy"] for e in evals],
            yerr=[lo, hi],
            color="tab:green",
            marker="o",
            capsize=3,
            label="held-out accuracy (95% CI)",
        )
        ay.set_ylabel("held-out accuracy")
        ay.set_ylim(0, 1)
        ay.legend(loc="lower right")
    ax.legend(loc="upper left")
    for label, colour, right in (("right (verifier)", "tab:green", 1.0), ("wrong (verifier)", "tab:red", 0.0)):
        pts = [(s["length"], s["rm"]) for s in pool if s["right"] == right]
        if pts:
            bx.scatter(*zip(*pts), s=10, alpha=0.6, color=colour, label=label)
    bx.set_xlabel("completion length (characters)")
    bx.set_ylabel("reward-model score")
    bx.set_title("Training samples: score vs length")
    if pool:
        bx.legend()
    return _encode(fig, (0.07, 0.93, 0.9, 0.15))


def html_section(r: dict[str, Any]) -> str:
    """The report.html section of a reward-model run ("" for other runs)."""
    e = r.get("reward_model")
    if not e:
        return ""
    rec = e.get("record") or {}
    out = [
        '<section id="reward-model"><h2>Learned reward model</h2>',
        f"<p>Reward model {esc(rec.get('path', '?'))} (weights sha256 {esc(str(rec.get('weights'))[:16])}..., "
        f"normalisation: {esc(rec.get('normalization', '?'))}). Score series: {esc(e['key'])}. Training samples with a "
        f"score: {e['samples']}; mean score of right ones {esc(fmt(e['mean_rm_right']))} (n = {e['n_right']}), of wrong "
        f"ones {esc(fmt(e['mean_rm_wrong']))} (n = {e['n_wrong']}).</p>",
    ]
    if e.get("figure"):
        out.append(f'<figure><img alt="reward-model score" src="data:image/png;base64,{e["figure"]}"></figure>')
    rows = [
        (
            esc(fmt(v["step"])),
            esc(fmt(v.get("rm"))),
            esc(f"{v['accuracy']:.3f} [{fmt(v['ci_low'])}, {fmt(v['ci_high'])}]"),
        )
        for v in e["evals"]
    ]
    out += [
        "<h3>Reward-model score and held-out accuracy at each periodic eval</h3>",
        table(["step", "reward-model score", "held-out accuracy [95% CI]"], rows, raw=True)
        if rows
        else "<p>no periodic held-out eval (set eval.every_steps)</p>",
        "<h3>Highest reward-model score with a wrong answer (training samples)</h3>",
    ]
    wrong = [
        (
            esc(fmt(s.get("step"))),
            esc(s.get("uid", "")),
            esc(s.get("gold", "")),
            esc(fmt(s["rm"])),
            esc(s["length"]),
            pre(s.get("completion", "")),
        )
        for s in e["top_wrong"]
    ]
    out.append(
        table(["step", "uid", "gold", "score", "length (chars)", "completion"], wrong, raw=True)
        if wrong
        else "<p>none: no wrong training sample has a score</p>"
    )
    return "".join(out) + "</section>"


def markdown_lines(r: dict[str, Any]) -> list[str]:
    """The report.md lines of a reward-model run ([] for other runs)."""
    e = r.get("reward_model")
    if not e:
        return []
    rec = e.get("record") or {}
    f = lambda x: "—" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)  # noqa: E731
    lines = [
        "",
        "## Learned reward model",
        "",
        f"Reward model `{rec.get('path', '?')}` (weights `{rec.get('weights')}`, "
        f"normalisation: {rec.get('normalization', '?')}); score series `{e['key']}`. Mean score of right training "
        f"samples {f(e['mean_rm_right'])} (n = {e['n_right']}), of wrong ones {f(e['mean_rm_wrong'])} (n = {e['n_wrong']}).",
        "",
        "| step | reward-model score | held-out accuracy [95% CI] |",
        "|---|---|---|",
    ]
    lines += [
        f"| {v['step']} | {f(v.get('rm'))} | {v['accuracy']:.3f} [{f(v['ci_low'])}, {f(v['ci_high'])}] |"
        for v in e["evals"]
    ]
    lines += ["", "Highest reward-model score with a wrong answer:", ""]
    lines += [
        f"- step {s.get('step')}, gold {s.get('gold')}, score {s['rm']:.3f}: `{(s.get('completion') or '')[:160]!r}`"
        for s in e["top_wrong"]
    ] or ["- none"]
    return lines
