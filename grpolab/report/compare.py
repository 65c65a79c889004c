"""Runs and baselines side by side (grpolab compare, grpolab.compare): rows of evaluation JSONs and run directories,
paired differences per evaluation set, seeds of one recipe summarised over runs and problems, and named sets of runs
contrasted by the difference of their means (grpolab.evaluation.sets).

Runs are only ever combined when they were evaluated alike: seed groups form within one evaluation (data hash,
method, samples and decoding settings), and a named set is refused when its runs' evaluations of a data set differ
in decoding (grpolab.evaluation.sets.check_same_evaluation) or in their problems -- unless the caller passes
align="intersect", which keeps the problems every run has. An evaluation set that not every run of a set has is
listed under ``skipped`` with the reason, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..errors import GrpolabError


def _label(row: dict[str, Any], manifest_file: Optional[Path]) -> str:
    if manifest_file is not None and manifest_file.name == "manifest.json":
        return manifest_file.parent.name + ("" if row.get("method", "greedy") == "greedy" else f" {row['method']}")
    if manifest_file is not None:
        return f"{manifest_file.parent.name} ({json.loads(manifest_file.read_text()).get('method', 'baseline')})"
    return row["model"]


def _entries_from_json(file: Path) -> list[dict[str, Any]]:
    from ..evaluation.overlap import find_manifest

    data = json.loads(file.read_text(encoding="utf-8"))
    if "models" not in data or "data_hash" not in data:
        raise GrpolabError(f"{file}: not an evaluation JSON (expected 'models' and 'data_hash')")
    out = []
    for i, row in enumerate(data["models"]):
        found = find_manifest(row["model"], row.get("path"))
        # the base it was evaluated beside
        out.append(
            {
                **row,
                "label": _label(row, found[0] if found else None),
                "source": str(file),
                "data_hash": data["data_hash"],
                "task": data["task"],
                "split": data["split"],
                "samples": data.get("decoding", {}).get("samples", 0) if isinstance(data.get("decoding"), dict) else 0,
                "evaluation": {
                    k: data.get(k) for k in ("task", "task_options", "split", "data_hash", "max_new_tokens", "decoding")
                },
                "manifest": found[1] if found else None,
                "last": i == len(data["models"]) - 1,
                "reference_row": data["models"][0] if i else None,
            }
        )
    return out


def _entries_from_run(run: Path) -> list[dict[str, Any]]:
    from ..manifest import read_manifest

    files = sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []
    from .safety import CACHE_NAME as SAFETY_CACHE

    files = [f for f in files if f.name != SAFETY_CACHE]  # the report's cache of the safety probe holds no eval rows
    if files:
        return [e for f in files for e in _entries_from_json(f)]
    manifest = read_manifest(run)
    last = None
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            last = rec if "eval/accuracy" in rec else last
    if last is None:
        raise GrpolabError(
            f"{run}: no eval/*.json and no periodic eval in metrics.jsonl; run grpolab eval {run} --out {run}/eval/NAME.json"
        )
    acc = {"mean": last["eval/accuracy"], "ci_low": last["eval/ci_low"], "ci_high": last["eval/ci_high"]}
    cfg = manifest["config"]
    return [
        {
            "label": run.name + " (periodic eval)",
            "model": str(run),
            "path": str(run),
            "method": "greedy",
            "source": str(run / "metrics.jsonl"),
            "data_hash": manifest["hashes"]["held_out_data"],
            "task": cfg["task"]["name"],
            "split": cfg["eval"]["split"],
            "samples": 0,
            "n": cfg["eval"]["num_problems"],
            "metrics": {"accuracy": acc},
            "accuracy": acc["mean"],
            "len_mean": float("nan"),
            "truncated_frac": float("nan"),
            "items": [],
            "manifest": manifest,
        }
    ]


def load_entries(sources: list[Path]) -> list[dict[str, Any]]:
    """Rows of every source, deduplicated on (path, method, samples, data_hash), in order."""
    entries, seen = [], set()
    for src in sources:
        if src.is_dir() and (src / "manifest.json").is_file():
            got = _entries_from_run(src)
        elif src.is_file():
            got = _entries_from_json(src)
        else:
            raise GrpolabError(f"{src}: expected a run directory (with manifest.json) or an evaluation JSON file")
        for e in got:
            key = (str(Path(e.get("path") or e["model"]).resolve()), e.get("method"), e["samples"], e["data_hash"])
            if key not in seen:
                seen.add(key)
                entries.append(e)
    return entries


def decoding_key(entry: dict[str, Any]) -> str:
    """The decoding settings an entry was evaluated with, as a comparable string (sampling seed excepted)."""
    from ..evaluation.sets import DECODING_KEYS

    decoding = (entry.get("evaluation") or {}).get("decoding")
    return json.dumps(
        {k: decoding.get(k) for k in DECODING_KEYS} if isinstance(decoding, dict) else decoding, sort_keys=True
    )


def seed_groups(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Groups (size >= 2) of runs on the same set, method and decoding that are seeds of one recipe
    (grpolab.evaluation.sets.recipe_groups: manifests differ only in config.train.seed and the git state)."""
    from ..evaluation.sets import recipe_groups

    by_set: dict[tuple, list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("manifest"):
            by_set.setdefault((e["data_hash"], e.get("method"), e["samples"], decoding_key(e)), []).append(e)
    return [[rows[i] for i in g] for rows in by_set.values() for g in recipe_groups([e["manifest"] for e in rows])]


def seed_summary(group: list[dict[str, Any]]) -> dict[str, Any]:
    """mean, std (ddof 1), min, max across the group's runs of every metric they all have, and ``evidence``: the
    two-part (problems, seeds) intervals (grpolab.evaluation.sets.set_evidence; {} without per-problem records)."""
    from ..evaluation.sets import set_evidence, spread

    names = [m for m in group[0]["metrics"] if all(m in e["metrics"] for e in group)]
    return {
        "runs": [e["label"] for e in group],
        "n_seeds": len(group),
        "seeds": [e["manifest"]["config"]["train"]["seed"] for e in group],
        "metrics": {m: spread([e["metrics"][m]["mean"] for e in group]) for m in names},
        "evidence": set_evidence(group, [e.get("reference_row") for e in group]),
    }


def set_members(src: Path) -> list[dict[str, Any]]:
    """The rows a source contributes to a named set: a run directory's own rows (path inside it), an eval JSON's last
    row (the trained model, as in grpolab report)."""
    from .evidence import path_inside

    if src.is_dir() and (src / "manifest.json").is_file():
        rows = [
            e for e in _entries_from_run(src) if path_inside(e.get("path"), src) or path_inside(e.get("model"), src)
        ]
    else:
        rows = [e for e in load_entries([src]) if e["last"]]
    if not rows:
        raise GrpolabError(
            f"--set: {src} has no evaluated row of its own (run grpolab eval BASE {src} --out {src}/eval/NAME.json)"
        )
    return rows


def named_sets(sets: dict[str, list[Path]], align: str = "exact") -> dict[str, Any]:
    """Each named set's evidence per evaluation set (data hash, method, samples) every member has, and every set after
    the first against the first (difference of means: grpolab.evaluation.sets.set_contrast). Runs evaluated with
    different decoding settings, or on different problems, are refused unless align="intersect" (module docstring);
    evaluation sets that not every run of a set has are listed in ``skipped``."""
    from ..evaluation.sets import check_same_evaluation, set_contrast, set_evidence

    members = {name: [e for src in srcs for e in set_members(src)] for name, srcs in sets.items()}
    runs = {name: len(srcs) for name, srcs in sets.items()}
    hashes = list(
        dict.fromkeys((e["data_hash"], e.get("method"), e["samples"]) for rows in members.values() for e in rows)
    )
    skipped = []

    def on(name: str, h: tuple) -> list[dict[str, Any]]:
        rows = [e for e in members[name] if (e["data_hash"], e.get("method"), e["samples"]) == h]
        if rows and len(rows) != runs[name]:
            skipped.append(
                {
                    "set": name,
                    "data_hash": h[0],
                    "method": h[1],
                    "samples": h[2],
                    "reason": f"{len(rows)} rows for the set's {runs[name]} runs (each run needs this evaluation exactly once)",
                }
            )
            return []
        if rows:
            check_same_evaluation([e["label"] for e in rows], [e.get("evaluation") or {} for e in rows])
        return rows

    rows_on = {(n, h): on(n, h) for n in sets for h in hashes}
    evidence = []
    for n in sets:
        eval_sets = []
        for h in hashes:
            rows = rows_on[(n, h)]
            if rows:
                metrics = set_evidence(rows, [e.get("reference_row") for e in rows], align)
                eval_sets.append(
                    {
                        "data_hash": h[0],
                        "method": h[1],
                        "task": rows[0]["task"],
                        "runs": len(rows),
                        "n": _problems(metrics),
                        "metrics": metrics,
                    }
                )
        evidence.append({"name": n, "runs": [e["label"] for e in members[n]], "eval_sets": eval_sets})
    first, *rest = list(sets)
    diffs = []
    for n in rest:
        for h in hashes:
            a, b = rows_on[(first, h)], rows_on[(n, h)]
            if a and b:
                check_same_evaluation([e["label"] for e in (*a, *b)], [e.get("evaluation") or {} for e in (*a, *b)])
                metrics = set_contrast(a, b, align)
                diffs.append(
                    {
                        "a": first,
                        "b": n,
                        "data_hash": h[0],
                        "method": h[1],
                        "task": b[0]["task"],
                        "n": _problems(metrics),
                        "metrics": metrics,
                    }
                )
    return {"sets": evidence, "set_differences": diffs, "skipped": skipped}


def _problems(metrics: dict[str, Any]) -> int | None:
    """n (problems) of a metrics dict of set_evidence or set_contrast: that of its first metric; None without one."""
    for m in metrics.values():
        return m["value"]["n"] if "value" in m else m["n"]
    return None


def compare_entries(entries: list[dict[str, Any]], baseline: str = "") -> dict[str, Any]:
    """Side-by-side rows per evaluation set, with paired differences against each set's reference."""
    from ..baselines.sft_bon import entry_budget
    from ..evaluation.heldout import paired_diffs

    sets: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        sets.setdefault(e["data_hash"], []).append(e)
    out_sets = []
    for h, rows in sets.items():
        ref = next((r for r in rows if baseline and baseline in r["label"]), rows[0])
        table = []
        for r in rows:
            diff = paired_diffs(ref["items"], r["items"]) if r is not ref and ref["items"] and r["items"] else {}
            table.append(
                {k: r.get(k) for k in ("label", "model", "method", "source", "n", "len_mean", "truncated_frac")}
                | {"metrics": r["metrics"], "diff_vs_reference": diff, "budget": entry_budget(r)}
            )
        out_sets.append(
            {
                "data_hash": h,
                "task": rows[0]["task"],
                "split": rows[0]["split"],
                "reference": ref["label"],
                "rows": table,
            }
        )
    return {"eval_sets": out_sets, "seed_groups": [seed_summary(g) for g in seed_groups(entries)]}
