"""Reading a run directory into the plain dicts the checks, plots and renderers use.

Held-out comparisons come from ``RUN_DIR/eval/*.json`` files written by ``grpolab eval --out`` (the first model
is the base; the trained model is the row whose path lies inside RUN_DIR, else the last row). Differences are
paired intervals over the problems both models answered (``diff_vs_first`` when it applies, else
evaluation.intervals.paired_score_interval, as `grpolab eval` computes them); when no items can be paired, an
unpaired normal approximation from the two intervals is used and marked as such.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GrpolabError
from ..manifest import read_manifest
from ..training.metrics import read_jsonl
from .periodic import ITEMS_LOG, periodic_heldout, periodic_point  # noqa: F401  (periodic_point: re-exported)

PRIMARY_EVAL = "base_vs_trained.json"
SERVING_FILE, SERVING_GGUF_FILE, ROLLBACK_FILE = "serving.json", "serving_gguf.json", "rollback.json"


@dataclass
class RunEvidence:
    run_dir: Path
    manifest: dict[str, Any]
    metrics: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    evals: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (file name, eval JSON)
    periodic_items: list[dict[str, Any]] = field(default_factory=list)  # eval_items.jsonl: right/wrong per problem

    @property
    def train_task(self) -> str:
        return ((self.manifest.get("config") or {}).get("task") or {}).get("name", "")

    @property
    def config(self) -> dict[str, Any]:
        """The run's resolved config (manifest["config"]); an older manifest may lack fields (unknown)."""
        return self.manifest.get("config") or {}


def is_eval_json(data: Any) -> bool:
    """The shape `grpolab eval --out` writes: a task and a list of model rows with an accuracy."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("task"), str)
        and isinstance(data.get("models"), list)
        and bool(data["models"])
        and all(isinstance(m, dict) and "accuracy" in m for m in data["models"])
    )


def load_evals(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted((Path(run_dir) / "eval").glob("*.json")):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if is_eval_json(data):
            out.append((p.name, data))
    return out


def load_run(run_dir: Path) -> RunEvidence:
    run_dir = Path(run_dir)
    if not (run_dir / "manifest.json").is_file():
        raise GrpolabError(f"{run_dir}: not a run directory (no manifest.json)")
    return RunEvidence(
        run_dir,
        read_manifest(run_dir),
        read_jsonl(run_dir / "metrics.jsonl"),
        read_jsonl(run_dir / "samples.jsonl"),
        load_evals(run_dir),
        read_jsonl(run_dir / ITEMS_LOG),
    )


# ---------------------------------------------------------------- intervals


def summary(row: dict[str, Any], label: str | None = None) -> dict[str, Any]:
    from ..baselines.sft_bon import entry_budget  # completions sampled, optimizer steps, wall time, peak memory

    return {
        "label": label or row.get("model", "?"),
        "accuracy": row["accuracy"],
        "ci_low": row.get("ci_low", math.nan),
        "ci_high": row.get("ci_high", math.nan),
        "n": row.get("n"),
        "budget": entry_budget(row),
    }


def unpaired_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b - a with a normal-approximation 95% interval from the two intervals' half-widths (independent samples).

    >>> d = unpaired_diff({"accuracy": .5, "ci_low": .4, "ci_high": .6}, {"accuracy": .7, "ci_low": .6, "ci_high": .8})
    >>> round(d["mean"], 3), round(d["ci_low"], 3), round(d["ci_high"], 3)
    (0.2, 0.059, 0.341)

    An older eval file without an interval (no ``ci_low`` / ``ci_high``) gives NaN bounds, which every check reads
    as N/A "not established" (gate.heldout.not_a_number), never a KeyError.

    >>> math.isnan(unpaired_diff({"accuracy": .5}, {"accuracy": .7})["ci_low"])
    True
    """
    get = lambda row, k: float(row[k]) if _finite(row.get(k)) else math.nan  # noqa: E731
    half = math.hypot((get(a, "ci_high") - get(a, "ci_low")) / 2, (get(b, "ci_high") - get(b, "ci_low")) / 2)
    mean = get(b, "accuracy") - get(a, "accuracy")
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "paired": False}


def paired_diff(
    a_items: list[dict[str, Any]], b_items: list[dict[str, Any]], slice_: str | None = None
) -> dict[str, Any] | None:
    """b - a accuracy over the uids both answered (optionally one slice: evaluation.heldout.in_slice, so MATH-500's
    ``subject=`` slices pair too), with the paired interval `grpolab eval` uses (evaluation.intervals.
    paired_evidence_interval: t over problems for right/wrong scores, exact when every difference is equal), n,
    method, degenerate, and ``signs`` (the items
    that got worse and better: the exact test of a FAIL rule); None if no uid is shared."""
    from ..evaluation.heldout import in_slice
    from ..evaluation.intervals import paired_evidence_interval
    from ..gate.stats import change_signs

    a = {it["uid"]: it for it in a_items if slice_ is None or in_slice(it, slice_)}
    b = {it["uid"]: it for it in b_items if slice_ is None or in_slice(it, slice_)}
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    base, trained = [float(a[u]["correct"]) for u in shared], [float(b[u]["correct"]) for u in shared]
    r = paired_evidence_interval(base, trained)
    return {
        "mean": r["mean"],
        "ci_low": r["ci_low"],
        "ci_high": r["ci_high"],
        "paired": True,
        "n": len(shared),
        "method": r.get("method"),
        "degenerate": r.get("degenerate"),
        "signs": change_signs(base, trained),
    }


def compare(a: dict[str, Any], b: dict[str, Any], b_is_later_row_of_same_eval: bool = False) -> dict[str, Any]:
    """b - a overall and per slice (rows of eval JSONs)."""
    if b_is_later_row_of_same_eval and b.get("diff_vs_first"):
        diff = {**b["diff_vs_first"], "paired": True, "n": b.get("n")}
        items = paired_diff(a.get("items") or [], b.get("items") or [])
        if items is not None and items["n"] == diff["n"]:  # the same problems: their counts of worse / better
            diff["signs"] = items["signs"]
            if diff.get("ci_low") == diff.get("ci_high"):  # an older file's zero-width t: the exact interval instead
                diff = {**items, "paired": True}
    else:
        diff = paired_diff(a.get("items") or [], b.get("items") or []) or unpaired_diff(a, b)
    per_slice = {}
    a_slices, b_slices = a.get("per_slice") or {}, b.get("per_slice") or {}
    for s in sorted(set(a_slices) & set(b_slices)):
        d = paired_diff(a.get("items") or [], b.get("items") or [], s) or unpaired_diff(a_slices[s], b_slices[s])
        per_slice[s] = {"base": a_slices[s], "trained": b_slices[s], "diff": d}
    return {"diff": diff, "per_slice": per_slice}


# ---------------------------------------------------------------- which rows


def path_inside(path: str | None, run_dir: Path) -> bool:
    """Whether `path` is RUN_DIR or lies inside it (False for None or an unreadable path)."""
    if not path:
        return False
    try:
        p, r = Path(path).resolve(), run_dir.resolve()
    except OSError:
        return False
    return p == r or r in p.parents


def trained_index(data: dict[str, Any], run_dir: Path) -> int:
    """Row of the trained model: the one whose model/path lies inside RUN_DIR, else the last row."""
    for i, m in enumerate(data["models"]):
        if i and (path_inside(m.get("path"), run_dir) or path_inside(m.get("model"), run_dir)):
            return i
    return len(data["models"]) - 1


def primary_eval(ev: RunEvidence) -> tuple[str, dict[str, Any]] | None:
    """The held-out eval on the training task with at least two models (base_vs_trained.json preferred)."""
    same = [
        (n, d)
        for n, d in ev.evals
        if d["task"] == ev.train_task and not d.get("capability") and not d.get("diversity") and len(d["models"]) >= 2
    ]
    same.sort(key=lambda nd: (nd[0] != PRIMARY_EVAL, nd[0]))
    return same[0] if same else None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def judged_checkpoint(run_dir: Path, trained_row: dict[str, Any] | None, last_eval_step: int | None) -> dict[str, Any]:
    """Which weights the held-out comparison judges and why, beside the run's best checkpoint by held-out accuracy
    (checkpoints/best.json, grpolab.models.checkpoint): {"judged", "why", "best" (the record or None), "is_best"}.

    An eval JSON's trained row judges the checkpoint its recorded path names (a run directory resolves to its
    newest checkpoint, RUN:best to the best one); the periodic comparison judges the weights at its last eval step."""
    from ..models.checkpoint import best_record

    try:
        best = best_record(run_dir)
    except GrpolabError:
        best = None
    if trained_row is not None:
        path = str(trained_row.get("path") or trained_row.get("model") or "")
        step = re.search(r"step-(\d+)/?$", path)
        judged = f"step-{step.group(1)}" if step else path
        why = (
            f"the trained model of the held-out eval file: {trained_row.get('model')}, loaded from {path} when it "
            f"was evaluated (a run directory means its newest checkpoint, RUN:best its best one)"
        )
        is_best = bool(best and step and int(step.group(1)) == best["step"])
    else:
        judged = f"the weights at step {last_eval_step}"
        why = "the last periodic held-out eval of training (no eval file on the training task in RUN_DIR/eval)"
        is_best = bool(best and best["step"] == last_eval_step)
    return {"judged": judged, "why": why, "best": best, "is_best": is_best}


def heldout_comparison(ev: RunEvidence) -> dict[str, Any] | None:
    """Trained vs base on the training task's held-out split (eval JSON, else periodic evals), with the checkpoint it
    judges (judged_checkpoint)."""
    found = primary_eval(ev)
    if found is None:
        n = (ev.config.get("eval") or {}).get("num_problems")
        periodic = periodic_heldout(ev.metrics, n if _finite(n) else None, ev.periodic_items)
        return periodic and {**periodic, "checkpoint": judged_checkpoint(ev.run_dir, None, periodic["trained_step"])}
    name, data = found
    ti = trained_index(data, ev.run_dir)
    base, trained = data["models"][0], data["models"][ti]
    cmp = compare(base, trained, b_is_later_row_of_same_eval=True)
    return {
        "source": f"eval/{name}",
        "task": data["task"],
        "split": data.get("split"),
        "n": data.get("n"),
        "checkpoint": judged_checkpoint(ev.run_dir, trained, None),
        "task_options": data.get("task_options"),
        "data_hash": data.get("data_hash"),
        "decoding": data.get("decoding"),
        "max_new_tokens": data.get("max_new_tokens"),  # a set compares them
        "base": summary(base, f"base ({base.get('model')})"),
        "trained": summary(trained, f"trained ({trained.get('model')})"),
        **cmp,
        "base_row": base,
        "trained_row": trained,
        "others": [
            summary(m) | {"compare": compare(m, trained)} for i, m in enumerate(data["models"]) if i not in (0, ti)
        ],
    }


def baseline_comparisons(ev: RunEvidence, heldout: dict[str, Any] | None, baselines: list[str]) -> list[dict[str, Any]]:
    """Each --baseline (an eval JSON, or a run directory with eval JSONs) on the training task vs the trained model.

    'base' names the base model already in the primary comparison. Rows: summary + trained - baseline.
    """
    if not heldout or heldout.get("trained_row") is None:
        return []
    trained = heldout["trained_row"]
    out = []
    for spec in baselines:
        if spec == "base":
            continue
        p = Path(spec)
        if p.is_dir() and (p / "manifest.json").is_file():
            sources = [(f"{p.name}/{n}", d, trained_index(d, p)) for n, d in load_evals(p)]
            rows = [(f"{p.name} ({d['models'][i].get('model')})", d, d["models"][i]) for n, d, i in sources]
        elif p.is_file():
            try:
                data = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise GrpolabError(f"--baseline {spec}: cannot read it as JSON ({e})") from None
            if not is_eval_json(data):
                raise GrpolabError(f"--baseline {spec}: not an eval JSON written by `grpolab eval --out`")
            rows = [(f"{m.get('model')} ({p.name})", data, m) for m in data["models"]]
        else:
            raise GrpolabError(f"--baseline {spec}: expected 'base', an eval JSON file or a run directory")
        for label, data, row in rows:
            if data["task"] != (heldout.get("task") or ev.train_task):
                continue
            if row.get("path") and row.get("path") == trained.get("path"):
                continue  # the trained model itself
            out.append({**summary(row, label), **compare(row, trained)})
    return out


def capability_comparisons(ev: RunEvidence) -> list[dict[str, Any]]:
    """Evals in RUN_DIR/eval/ on a task other than the training task (or marked `capability` by the report): trained
    vs base there (rows kept as ``base_row`` / ``trained_row`` for the evidence of a set of runs)."""
    out = []
    for name, data in ev.evals:
        if (
            (data["task"] == ev.train_task and not data.get("capability"))
            or len(data["models"]) < 2
            or data.get("diversity")
        ):
            continue
        ti = trained_index(data, ev.run_dir)
        base, trained = data["models"][0], data["models"][ti]
        cmp = compare(base, trained, b_is_later_row_of_same_eval=True)
        out.append(
            {
                "task": data["task"],
                "source": f"eval/{name}",
                "n": data.get("n"),
                "base": summary(base),
                "trained": summary(trained),
                **cmp,
                "base_row": base,
                "trained_row": trained,
                **{k: data.get(k) for k in ("decoding", "max_new_tokens", "data_hash", "split", "task_options")},
            }
        )
    return out


# ---------------------------------------------------------------- samples


def changed_answers(
    base_row: dict[str, Any] | None, trained_row: dict[str, Any] | None, limit: int = 8
) -> list[dict[str, Any]]:
    """Held-out problems whose extracted final answer changed between base and trained model.

    Fixed (wrong -> right) first, then broken (right -> wrong), then other changes.
    """
    if not base_row or not trained_row:
        return []
    from ..evaluation.scoring import extract_final

    base = {it["uid"]: it for it in base_row.get("items") or []}
    out = []
    for it in trained_row.get("items") or []:
        b = base.get(it["uid"])
        if b is None:
            continue
        ab, at = extract_final(b.get("completion", "")), extract_final(it.get("completion", ""))
        if ab == at and b.get("correct") == it.get("correct"):
            continue
        was, now = bool(b.get("correct")), bool(it.get("correct"))
        kind = "fixed" if now and not was else "broken" if was and not now else "changed"
        out.append(
            {
                "uid": it["uid"],
                "slice": it.get("slice"),
                "gold": it.get("gold"),
                "kind": kind,
                "base_answer": ab,
                "trained_answer": at,
                "base_completion": b.get("completion", ""),
                "trained_completion": it.get("completion", ""),
                "base_correct": b.get("correct"),
                "trained_correct": it.get("correct"),
            }
        )
    order = {"fixed": 0, "broken": 1, "changed": 2}
    out.sort(key=lambda r: order[r["kind"]])
    return out[:limit]


def change_counts(base_row: dict[str, Any] | None, trained_row: dict[str, Any] | None) -> dict[str, int]:
    if not base_row or not trained_row:
        return {}
    base = {it["uid"]: bool(it.get("correct")) for it in base_row.get("items") or []}
    pairs = [(base[it["uid"]], bool(it.get("correct"))) for it in trained_row.get("items") or [] if it["uid"] in base]
    return {
        "fixed": sum(1 for b, t in pairs if t and not b),
        "broken": sum(1 for b, t in pairs if b and not t),
        "paired": len(pairs),
    }


def best_worst(samples: list[dict[str, Any]], k: int = 3) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Highest- and lowest-reward training samples from the last quarter of logged steps."""
    scored = [s for s in samples if isinstance(s.get("reward"), (int, float))]
    if not scored:
        return [], []
    steps = sorted({s.get("step", 0) for s in scored})
    recent = set(steps[-max(1, math.ceil(len(steps) / 4)) :])
    pool = [s for s in scored if s.get("step", 0) in recent]
    ranked = sorted(pool, key=lambda s: (s["reward"], -len(s.get("completion", ""))))
    best = ranked[::-1][:k]
    return best, [s for s in ranked[:k] if not any(s is b for b in best)]


def load_release_evidence(run_dir: Path) -> dict[str, Any]:
    """{"serving": serving.json, "serving_gguf": serving_gguf.json, "rollback": rollback.json} of RUN/release/,
    None for each file missing."""
    out: dict[str, Any] = {}
    for key, name in (("serving", SERVING_FILE), ("serving_gguf", SERVING_GGUF_FILE), ("rollback", ROLLBACK_FILE)):
        path = Path(run_dir) / "release" / name
        try:
            out[key] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[key] = None
    return out
