"""The diversity evidence of `grpolab report`: held-out pass@k of base and trained model, sampled at the training
temperature (the harm an entropy collapse predicts; docs/report.md, "Diversity").

``run_diversity`` evaluates both models on the first ``n_problems`` problems of the training task's held-out split
(the run's ``task`` and ``eval.split``) with ``samples`` samples each at the run's ``rollout.temperature`` /
``top_p`` / ``max_new_tokens`` (grpolab.evaluation.heldout.run_eval; the held-out integrity check applies), and caches the
eval JSON in ``RUN_DIR/eval/diversity.json`` (marked ``"diversity"``, so it is neither the held-out comparison nor
capability evidence), reused while the settings and the trained checkpoint match. ``diversity_comparison`` turns it
into the check's evidence: per problem, with c correct of n samples, pass@k = 1 - C(n - c, k) / C(n, k)
(grpolab.evaluation.scoring.pass_at_k; with n = k it is "any of the k samples correct"), and the paired interval over
problems of trained - base (grpolab.evaluation.intervals.paired_score_interval).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import GrpolabError
from ..evaluation.intervals import is_binary, paired_score_interval, score_interval
from ..evaluation.scoring import pass_at_k
from ..gate.agent import is_agent_run
from ..manifest import write_json_atomic

CACHE_NAME = "diversity.json"


@dataclass(frozen=True)
class DiversitySettings:
    """What the diversity eval samples: `samples` (n) per problem on the first `n_problems` held-out problems, pass@k."""

    n_problems: int = 64
    samples: int = 8
    k: int = 8
    batch_size: int = 64  # sequences per generate call (samples per problem x prompts)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.samples:
            raise GrpolabError(
                f"--diversity-samples {self.samples}: expected at least k = {self.k} samples per problem"
            )
        if self.n_problems < 1:
            raise GrpolabError(f"--diversity-n {self.n_problems}: expected at least 1 problem")


def problem_pass_at_k(item: dict[str, Any], k: int) -> float:
    """pass@k of one eval item from its samples (c correct of n): 1 - C(n - c, k) / C(n, k).

    >>> round(problem_pass_at_k({"samples": [{"correct": True}, {"correct": False}, {"correct": False}]}, 2), 12)
    0.666666666667
    """
    samples = item.get("samples") or []
    if len(samples) < k:
        raise GrpolabError(f"eval item {item.get('uid')}: {len(samples)} samples, pass@{k} needs at least {k}")
    return pass_at_k(len(samples), sum(bool(s["correct"]) for s in samples), k)


def pass_at_k_by_uid(row: dict[str, Any], k: int) -> dict[str, float]:
    """{uid: pass@k} of one model row of an eval JSON sampled with at least k samples per problem."""
    return {it["uid"]: problem_pass_at_k(it, k) for it in row.get("items") or []}


def diversity_comparison(data: dict[str, Any], trained_row: int, k: int, source: str = "") -> dict[str, Any]:
    """The check's evidence from a sampled eval JSON: base (first row) and trained (row `trained_row`) pass@k with
    95% intervals (evaluation.intervals.score_interval: t for 0/1 values, the studentised bootstrap for graded pass@k
    with samples > k), the paired difference (paired_score_interval; and that of pass@1, which reward_vs_heldout
    compares with the training correctness: gate.hacking.transfer_comparison), and the per-problem values by uid
    (``by_uid`` and ``pass1_by_uid``: uid -> (base, trained), for the interval of a set of runs). The difference carries
    ``signs``, the problems whose pass@k fell and rose (stats.change_signs), for the exact test of its FAIL rule --
    only when every pass@k is 0 or 1 (samples = k): on graded pass@k the sign test would test the median change, not
    the mean, so the FAIL rule's p then comes from the interval (stats.harm_p_value)."""
    from ..gate.stats import change_signs

    base, trained = pass_at_k_by_uid(data["models"][0], k), pass_at_k_by_uid(data["models"][trained_row], k)
    uids = [u for u in base if u in trained]
    if not uids:
        raise GrpolabError(f"{source or 'diversity eval'}: base and trained model share no sampled problem")
    b, t = [base[u] for u in uids], [trained[u] for u in uids]
    b1 = pass_at_k_by_uid(data["models"][0], 1)
    t1 = pass_at_k_by_uid(data["models"][trained_row], 1)
    keep = ("mean", "ci_low", "ci_high", "n", "method", "degenerate")
    ci = lambda r: {key: r.get(key) for key in keep}  # noqa: E731
    dec = data.get("decoding") or {}
    return {
        "k": k,
        "samples": dec.get("samples"),
        "temperature": dec.get("temperature"),
        "n": len(uids),
        "source": source,
        "base": ci(score_interval(b)),
        "trained": ci(score_interval(t)),
        "diff": {
            **ci(paired_score_interval(b, t)),
            "paired": True,
            **({"signs": change_signs(b, t)} if is_binary(b) and is_binary(t) else {}),
        },
        "pass1": ci(paired_score_interval([b1[u] for u in uids], [t1[u] for u in uids])),
        "by_uid": {u: (base[u], trained[u]) for u in uids},
        "pass1_by_uid": {u: (b1[u], t1[u]) for u in uids},
    }


def eval_settings(config: dict[str, Any], s: DiversitySettings, dtype: str, checkpoint: str) -> dict[str, Any]:
    """The settings a cached diversity eval must match: task, split, problems, decoding, dtype, checkpoint."""
    task, rollout = config.get("task") or {}, config.get("rollout") or {}
    if not task.get("name") or "temperature" not in rollout or "max_new_tokens" not in rollout:
        raise GrpolabError(
            "manifest.json: config.task.name, config.rollout.temperature and "
            "config.rollout.max_new_tokens are needed to sample at the training temperature"
        )
    return {
        **asdict(s),
        "task": task["name"],
        "task_options": task.get("options") or {},
        "split": (config.get("eval") or {}).get("split", "test"),
        "temperature": rollout["temperature"],
        "top_p": rollout.get("top_p", 1.0),
        "max_new_tokens": rollout["max_new_tokens"],
        "dtype": dtype,
        "checkpoint": checkpoint,
    }


def run_diversity(
    run_dir: Path,
    ckpt: Path | None,
    config: dict[str, Any],
    base_model: str,
    s: DiversitySettings,
    dtype: str,
    log: Callable[[str], None],
) -> tuple[dict[str, Any] | None, str]:
    """(evidence or None, why not): sample base and the trained checkpoint `ckpt` (cached in
    RUN_DIR/eval/diversity.json)."""
    from ..evaluation.heldout import run_eval
    from .evidence import trained_index
    from .progress import Heartbeat

    if is_agent_run(config):
        return None, "agent tasks are evaluated with one greedy episode per problem (no samples to count pass@k on)"
    if ckpt is None:
        return None, "the run directory has no complete checkpoint to sample"
    key = eval_settings(config, s, dtype, ckpt.name)
    out = Path(run_dir) / "eval" / CACHE_NAME
    data = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    if data.get("diversity") == key:
        log(f"diversity: reusing {out}")
    else:
        log(
            f"diversity: base and trained model sample {s.samples} completions at T={key['temperature']:g} on "
            f"{s.n_problems} held-out problems (cached in eval/{CACHE_NAME})"
        )
        with Heartbeat(log, "diversity") as beat:  # a line every 20 s with the problems sampled so far
            data = run_eval(
                [base_model, str(ckpt)],
                key["task"],
                key["task_options"],
                key["split"],
                s.n_problems,
                key["max_new_tokens"],
                s.batch_size,
                dtype,
                samples=s.samples,
                temperature=key["temperature"],
                top_p=key["top_p"],
                seed=s.seed,
                progress=beat.progress,
            )
        data["diversity"] = key
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, data)
    return diversity_comparison(data, trained_index(data, Path(run_dir)), s.k, f"eval/{CACHE_NAME}"), ""
