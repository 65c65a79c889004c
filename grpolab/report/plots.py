"""Report figures: training curves and held-out comparisons as base64 PNG strings (matplotlib, Agg backend).

Every figure has a title, axis labels with units and a legend; a noisy series is drawn faint with its moving
average on top. A figure whose metrics are absent is skipped (None).
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..gate.base import values
from ..gate.code import REASONS

STEP = "training step"


@dataclass(frozen=True)
class Curve:
    """One training-curve figure: the metric keys to draw (label per key) and the y axis label with its unit."""

    title: str
    ylabel: str
    keys: tuple[tuple[str, str], ...]
    log_y: bool = False


def curve_specs(rows: Sequence[dict[str, Any]]) -> list[Curve]:
    """The training curves of the report, in order; reward components and slices are discovered from the rows."""
    keys = sorted({k for r in rows for k in r})
    components = [m.group(1) for k in keys if (m := re.fullmatch(r"reward/(.+)/mean", k))]
    slices = [k.rsplit("/", 1)[1] for k in keys if k.startswith("groups/frac_zero_std/")]
    return [
        Curve(
            "Training reward (total and per component)",
            "reward (mean over completions)",
            (("reward/mean", "total reward"), *((f"reward/{c}/mean", f"component: {c}") for c in components)),
        ),
        Curve(
            "Response length", "tokens per completion", (("completion/len_mean", "mean"), ("completion/len_max", "max"))
        ),
        Curve(
            "Truncation rate",
            "share of completions cut at max_new_tokens",
            (("completion/truncated_frac", "truncated"),),
        ),
        Curve("Policy entropy", "nats / token", (("policy/entropy", "entropy"),)),
        Curve(
            "Clip fractions",
            "share of completion tokens",
            (
                ("policy/clip_frac_low", "clipped low (ratio < 1-eps)"),
                ("policy/clip_frac_high", "clipped high (ratio > 1+eps)"),
            ),
        ),
        Curve(
            "KL divergence",
            "nats / token",
            (("policy/kl", "KL to reference"), ("policy/approx_kl_old", "KL to old policy")),
        ),
        Curve(
            "Zero-variance groups (no learning signal)",
            "share of groups",
            (("groups/frac_zero_std", "all groups"), *((f"groups/frac_zero_std/{s}", f"slice: {s}") for s in slices)),
        ),
        Curve(
            "Sampler vs trainer logprob difference",
            "|logp sampler - logp trainer|, nats",
            (("sampler/logp_diff_mean", "mean over tokens"), ("sampler/logp_diff_max", "max over tokens")),
            log_y=True,
        ),
        Curve("Gradient norm", "global L2 norm", (("optim/grad_norm", "grad norm"),)),
    ]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 10,
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.grid": True,
            "grid.alpha": 0.3,
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "legend.fontsize": 9,
        }
    )
    return plt


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _encode(fig, margins: tuple[float, float, float, float] = (0.13, 0.98, 0.9, 0.15)) -> str:
    """PNG bytes as base64. Fixed margins (left, right, top, bottom) instead of a tight bounding box: measured
    here, bbox_inches="tight" draws every figure twice and doubled the report's build time."""
    left, right, top, bottom = margins
    fig.subplots_adjust(left=left, right=right, top=top, bottom=bottom)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def moving_average(vals: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values.

    >>> moving_average([1, 2, 3, 4], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    out, total = [], 0.0
    for i, v in enumerate(vals):
        total += v
        if i >= window:
            total -= vals[i - window]
        out.append(total / min(i + 1, window))
    return out


def _xy(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = values([r], key)
        if v:
            xs.append(r.get("step", len(xs) + 1))
            ys.append(v[0])
    return xs, ys


def plot_curve(rows: Sequence[dict[str, Any]], spec: Curve) -> str | None:
    """One training curve figure, or None when none of its metrics were logged."""
    series = [(label, *_xy(rows, key)) for key, label in spec.keys]
    series = [s for s in series if s[1]]
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    for i, (label, xs, ys) in enumerate(series):
        color, style = f"C{i}", "-" if i == 0 else ("--", ":", "-.")[(i - 1) % 3]
        window = max(1, len(ys) // 10)
        if window > 1:
            ax.plot(xs, ys, color=color, alpha=0.3, linewidth=1)
            ax.plot(
                xs,
                moving_average(ys, window),
                color=color,
                linewidth=2.5 - 0.5 * bool(i),
                linestyle=style,
                label=f"{label} (avg of {window} steps)",
            )
        else:
            ax.plot(
                xs,
                ys,
                color=color,
                linewidth=2.5 - 0.5 * bool(i),
                linestyle=style,
                marker="o" if len(ys) < 20 else None,
                markersize=3,
                label=label,
            )
    if spec.log_y and all(y > 0 for _, _, ys in series for y in ys):
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_title(spec.title)
    _integer_steps(ax)
    ax.set_xlabel(STEP)
    ax.set_ylabel(spec.ylabel)
    ax.legend(loc="best")
    return _encode(fig)


HELDOUT_TITLE = "Held-out accuracy (periodic eval) vs training reward"


def plot_heldout_curve(rows: Sequence[dict[str, Any]]) -> str | None:
    """Periodic held-out accuracy with its 95% bootstrap interval as a band, the training reward (reward/mean) on a
    second axis over the same steps, and the best held-out step (grpolab.models.checkpoint.select_best: the rule
    that picks checkpoints/best.json) marked: a reward that rises while held-out accuracy falls shows here."""
    from ..models.checkpoint import select_best

    evals = [r for r in rows if values([r], "eval/accuracy")]
    if not evals:
        return None
    xs = [r.get("step", i + 1) for i, r in enumerate(evals)]
    acc = [float(r["eval/accuracy"]) for r in evals]
    lo = [(values([r], "eval/ci_low") or [a])[0] for r, a in zip(evals, acc)]
    hi = [(values([r], "eval/ci_high") or [a])[0] for r, a in zip(evals, acc)]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    ax.fill_between(xs, lo, hi, color="C2", alpha=0.2, label="95% bootstrap interval")
    ax.plot(xs, acc, color="C2", linewidth=2, marker="o", markersize=4, label="held-out accuracy (greedy)")
    best = select_best(list(zip(xs, acc)))
    if best:
        ax.axvline(best[0], color="C2", linestyle=":", linewidth=1.5, label=f"best held-out: step {best[0]}")
    rx, ry = _xy(rows, "reward/mean")
    if ry:
        twin = ax.twinx()
        twin.plot(rx, ry, color="C0", linewidth=1.2, alpha=0.8, label="training reward (mean)")
        twin.set_ylabel("training reward (mean)")
        handles, labels = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(handles + more[0], labels + more[1], loc="best")
    ax.set_ylim(-0.02, 1.02)
    steps = [r["step"] for r in rows if isinstance(r.get("step"), (int, float))]
    if steps and max(steps) > min(steps):
        pad = 0.03 * (max(steps) - min(steps))
        ax.set_xlim(min(steps) - pad, max(steps) + pad)
    ax.set_title(HELDOUT_TITLE)
    _integer_steps(ax)
    ax.set_xlabel(STEP)
    ax.set_ylabel("held-out accuracy (fraction correct)")
    if not ry:
        ax.legend(loc="best")
    return _encode(fig, (0.13, 0.87, 0.9, 0.15))


def plot_comparison(
    title: str, models: Sequence[dict[str, Any]], per_slice: dict[str, Sequence[dict[str, Any]]]
) -> str | None:
    """Accuracy with 95% intervals for each model (rows: overall, then each slice) as a dot-and-whisker chart.

    models: [{"label", "accuracy", "ci_low", "ci_high"}]; per_slice: {slice: [same, one per model, same order]}.
    """
    if not models:
        return None
    groups = [("overall", list(models))] + [(f"slice {s}", list(v)) for s, v in per_slice.items()]
    plt = _plt()
    rows = sum(len(g) for _, g in groups)
    height = 1.0 + 0.34 * rows + 0.2 * len(groups)
    fig, ax = plt.subplots(figsize=(10.5, height))
    y, ticks, labels = 0.0, [], []
    for name, group in groups:
        for mi, m in enumerate(group):
            err = [[max(0.0, m["accuracy"] - m["ci_low"])], [max(0.0, m["ci_high"] - m["accuracy"])]]
            ax.errorbar([m["accuracy"]], [y], xerr=err, fmt="o", color=f"C{mi}", capsize=4, markersize=6)
            ticks.append(y)
            short = m["label"] if len(m["label"]) <= 30 else m["label"][:29] + "…"
            labels.append(f"{name}: {short}  {m['accuracy']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]")
            y -= 1
        y -= 0.6
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=9)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(y + 1.0, 0.6)
    ax.set_xlabel("accuracy (fraction correct), dot = estimate, whiskers = 95% bootstrap interval")
    ax.set_title(title)
    return _encode(fig, (0.45, 0.98, 1 - 0.45 / height, 0.65 / height))


def training_figures(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) for every training curve that has data, held-out accuracy second."""
    out = []
    for i, spec in enumerate(curve_specs(rows)):
        png = plot_curve(rows, spec)
        if png:
            out.append((spec.title, png))
        if i == 0:
            held = plot_heldout_curve(rows)
            if held:
                out.append((HELDOUT_TITLE, held))
    return out


def code_figures(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of the reason shares and the shown / hidden pass rates, where the rows have them."""

    specs = [
        Curve(
            "Code: share of completions by first failing reason",
            "share of completions",
            tuple((f"reward/code/{r}_frac", r.replace("_", " ")) for r in (*REASONS, "pass")),
        ),
        Curve(
            "Code: pass rate on shown vs hidden tests",
            "share of tests passed",
            (("reward/code/shown_pass", "tests shown in the prompt"), ("reward/code/hidden_pass", "hidden tests")),
        ),
    ]
    out = []
    for spec in specs:
        if any(values(rows, key) for key, _ in spec.keys):
            png = plot_curve(rows, spec)
            if png:
                out.append((spec.title, png))
    return out
