"""The rollback check: the rollback target -- the run's base model or a previous release bundle -- has its weights
hashed against the hash recorded when it was measured, is served by plain transformers in its own process
(grpolab.serving.check) on a sample of the problems it was measured on, and its served accuracy is compared, paired,
with its recorded answers' scores. The result goes to RUN/release/rollback.json, which the report grades
(grpolab.gate.release.check_rollback_ready).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import GrpolabError
from ..evaluation.heldout import load_eval_problems
from ..manifest import hash_model_dir, read_manifest, write_json_atomic
from .bundle import HELDOUT_FILE, held_out_eval, heldout_record, read_release
from .check import Log, paired_change, release_dir, score_answers, serve_requests, serve_with_transformers

ROLLBACK_FILE = "rollback.json"


def rollback_target(run_dir: Path, target: str | None) -> dict[str, Any]:
    """Name, directory, recorded weight hash and recorded held-out answers of the rollback target: a previous
    release bundle (a directory with release.json), or the run's base model (its row of the held-out evaluation)."""
    from ..models.load import resolve_model_path

    if target:
        release = read_release(Path(target))
        heldout = json.loads((Path(target) / HELDOUT_FILE).read_text(encoding="utf-8"))
        return {
            "kind": "release bundle",
            "name": str(Path(target).resolve()),
            "path": str(Path(target).resolve()),
            "recorded_weights": release["hashes"]["weights"],
            "record": heldout,
        }
    manifest = read_manifest(run_dir)
    config = manifest.get("config") or {}
    file, data, base_row, _ = held_out_eval(run_dir, (config.get("task") or {}).get("name", ""))
    name = (config.get("model") or {}).get("name") or base_row["model"]
    return {
        "kind": "base model",
        "name": name,
        "path": resolve_model_path(name),
        "recorded_weights": (manifest.get("hashes") or {}).get("model_weights"),
        "record": heldout_record(file, data, base_row, name),
    }


def run_rollback_check(
    run_dir: Path, target: str | None = None, n: int = 32, threads: int = 0, log: Log = lambda s: None
) -> dict[str, Any]:
    """Check that the rollback target is what it was (weight hash), loads in the serving stack and reproduces its
    recorded held-out score on the first n problems it was measured on; write RUN/release/rollback.json."""
    run_dir = Path(run_dir)
    t = rollback_target(run_dir, target)
    record = t["record"]
    start = time.perf_counter()
    weights_now = hash_model_dir(t["path"])["weights"]
    recorded = {it["uid"]: it for it in record["items"]}
    problems = [
        p for p in load_eval_problems(record["task"], record["task_options"], record["split"], 0) if p.uid in recorded
    ][: n or None]
    result: dict[str, Any] = {
        "grpolab_rollback": 1,
        "kind": t["kind"],
        "target": t["name"],
        "path": t["path"],
        "weights": {"recorded": t["recorded_weights"], "now": weights_now},
        "n": len(problems),
        "recorded": {k: record[k] for k in ("source", "accuracy", "ci_low", "ci_high", "n", "max_new_tokens", "dtype")},
        "command": f"transformers serve {t['path']}",
    }
    log(f"rollback check: serving the {t['kind']} {t['name']} on {len(problems)} of its held-out problems")
    try:
        served = serve_with_transformers(Path(t["path"]), serve_requests(problems), record["max_new_tokens"], threads)
    except GrpolabError as e:
        result.update({"loads": False, "error": str(e), "seconds": time.perf_counter() - start})
    else:
        rows = served["rows"]
        scores = score_answers(
            problems,
            [r["text"] for r in rows],
            [len(r["completion_ids"]) for r in rows],
            [not r["stopped"] for r in rows],
            record["task"],
        )
        before = [recorded[p.uid]["accuracy"] for p in problems]
        result.update(
            {
                "loads": True,
                "dtype": served["dtype"],
                "served_accuracy": sum(scores) / len(scores),
                "recorded_accuracy_on_sample": sum(before) / len(before),
                "diff": paired_change(before, scores),
                "identical_answers": sum(r["text"] == recorded[p.uid]["completion"] for p, r in zip(problems, rows))
                / len(rows),
                "seconds": time.perf_counter() - start,
            }
        )
    release_dir(run_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(release_dir(run_dir) / ROLLBACK_FILE, result)
    return result
