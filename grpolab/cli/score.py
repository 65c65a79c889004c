"""`grpolab score`: audit a training reward on completions of your own, before training on it.

Rules:
- COMPLETIONS.jsonl has one JSON object per line with the problem's id (``id``, ``uid`` or ``task_id``) and the
  ``completion`` text. Ids are the task's uids (``mbpp/601``, ``pyfunc/int.add:7``, ``gsm8k/test/3`` ...), looked
  up in every split the task has (or only ``--split``); a task with a ``uid_of`` also takes the ids its data set's
  own completion files carry (HumanEval's ``HumanEval/0``; MBPP's integer task_id and evalplus's ``Mbpp/601``).
- The reward is the task's training reward: the weights of ``--reward-weight NAME=W`` (repeatable), else the reward
  the run given with ``--reward-from RUN`` was trained with (its weights with its own ``reward.functions``, time
  limit, sandbox limits, reward model and judge), else ``pass_fraction`` for a code task and the default reward
  weights of the config for an answer task. Code runs in the sandbox with ``--sandbox-option KEY=VALUE`` limits.
- Printed: per row the reward, its components and the reason (why a code reward is not full marks; the error for
  an invalid one), then totals. ``--json-out`` writes ``{"task", "weights", "rows": [{"id", "reward", "components",
  "reason", "error"}, ...] (input order), "totals"}``.
- A missing file, a malformed line, a row without id/completion or an unknown id is one error naming file and line.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from ..errors import ConfigError, DataError, writable_file
from .app import app, console

ALL_SPLITS = ("train", "test", "validation", "prompt")


def _options(items: list[str]) -> dict[str, Any]:
    from ..config import parse_option

    return dict(parse_option(o) for o in items)


def problem_index(source: Any, split: Optional[str]) -> dict[str, Any]:
    """uid -> Problem over the asked split, or every split the task `source` has."""
    index: dict[str, Any] = {}
    for name in [split] if split else ALL_SPLITS:
        try:
            problems = source.problems(name)
        except ConfigError:
            if split:
                raise
            continue
        index.update({p.uid: p for p in problems})
    return index


def read_rows(path: Path, index: dict[str, Any], task: str, source: Any) -> list[tuple[Any, str, Any]]:
    """[(id as the file gives it, completion, problem)] in file order; the id is the first of the fields id, uid,
    task_id, mapped to a uid by the task's ``uid_of`` where it has one. DataError naming file and line for
    anything wrong."""
    from ..tasks.jsonl import read_jsonl

    uid_of = getattr(source, "uid_of", None)
    forms = getattr(source, "id_forms", repr(next(iter(index), "?")))
    out = []
    for lineno, row in read_jsonl(path, 'a JSONL file of {"id": ..., "completion": ...} rows'):
        given = next((row[f] for f in ("id", "uid", "task_id") if row.get(f) is not None), None)
        completion = row.get("completion")
        if not isinstance(given, (str, int)) or isinstance(given, bool) or not isinstance(completion, str):
            raise DataError(
                f"{path}:{lineno}: expected the problem id in a field 'id', 'uid' or 'task_id' (a string "
                f"or an integer; ids look like {forms}) and a string field 'completion'"
            )
        uid = (uid_of(given) if uid_of else None) or given
        if uid not in index:
            raise DataError(f"{path}:{lineno}: unknown problem id {given!r} for task {task!r} (ids look like {forms})")
        out.append((given, completion, index[uid]))
    return out


def default_weights(problems: list[Any]) -> dict[str, float]:
    """``pass_fraction`` for code problems, else the config's default reward weights."""
    from ..config import RewardConfig
    from ..tasks.code import is_code_problem

    if problems and all(is_code_problem(p) for p in problems):
        return {"pass_fraction": 1.0}
    return dict(RewardConfig().weights)


def run_reward(run_dir: Path, sandbox: dict[str, Any]) -> tuple[dict[str, float], Any]:
    """(weights, RewardSet) of the reward `run_dir` was trained with: its manifest's reward.weights with its own
    reward.functions (custom rewards, loaded again from the references the config gives), time limit, sandbox
    limits (``--sandbox-option`` on top), reward model and judge. A run trained with Python callables
    (``python_rewards``, grpolab.train(rewards=...)) cannot be rebuilt from its manifest: one clear error."""
    from ..config import from_dict
    from ..manifest import read_manifest
    from ..rewards import RewardSet

    manifest = read_manifest(run_dir)
    if manifest.get("python_rewards"):
        names = ", ".join(manifest["python_rewards"])
        raise ConfigError(
            f"--reward-from {run_dir}: the run was trained with Python reward callables ({names}) passed "
            "to grpolab.train, which its manifest cannot call again; score in Python with "
            "grpolab.rewards.RewardSet, or give --reward-weight NAME=W for the built-in ones"
        )
    reward = from_dict(manifest["config"]).reward
    weights = dict(reward.weights)
    return weights, RewardSet(
        weights,
        reward.functions,
        reward.time_limit_s,
        sandbox={**reward.sandbox, **sandbox},
        model=reward.model,
        judge=reward.judge,
    )


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n, mean reward over valid rows, invalid count, rows per reason ("none" = full marks or no reason given).

    >>> totals([{"reward": 1.0, "reason": None}, {"reward": None, "reason": None}])["invalid"]
    1
    """
    valid = [r["reward"] for r in rows if r["reward"] is not None]
    return {
        "n": len(rows),
        "mean_reward": sum(valid) / len(valid) if valid else None,
        "invalid": len(rows) - len(valid),
        "reasons": dict(Counter(r["reason"] or "none" for r in rows if r["reward"] is not None)),
    }


@app.command("score")
def score(
    completions: Annotated[Path, typer.Argument(help='JSONL rows {"id": problem id, "completion": text}')],
    task: Annotated[str, typer.Option(help="task name")] = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: Annotated[Optional[str], typer.Option(help="look ids up in this split only")] = None,
    reward_weight: Annotated[list[str], typer.Option("--reward-weight", help="reward NAME=WEIGHT")] = [],
    reward_from: Annotated[
        Optional[Path], typer.Option(help="take the reward weights from this run's manifest")
    ] = None,
    sandbox_option: Annotated[
        list[str], typer.Option("--sandbox-option", help="sandbox limit KEY=VALUE (code rewards)")
    ] = [],
    json_out: Annotated[Optional[Path], typer.Option("--json-out", help="write the per-row results here")] = None,
) -> None:
    """Score given completions with a task's training reward: per row the reward, its components and the reason."""
    from .. import agents  # noqa: F401 -- registers the agent task
    from ..rewards import RewardSet
    from ..tasks import make_task

    source = make_task(task, **_options(task_option))
    rows = read_rows(completions, problem_index(source, split), task, source)
    if json_out:
        writable_file(json_out, "--json-out")
    if reward_weight:
        from ..config import number_map

        weights = number_map("--reward-weight", _options(reward_weight), sep=" ")
        rewards = RewardSet(weights, sandbox=_options(sandbox_option))
    elif reward_from:
        weights, rewards = run_reward(reward_from, _options(sandbox_option))
    else:
        weights = default_weights([p for _, _, p in rows])
        rewards = RewardSet(weights, sandbox=_options(sandbox_option))
    results = rewards.score_many([c for _, c, _ in rows], [p for _, _, p in rows])
    out = [
        {
            "id": uid,
            "reward": None if r.invalid or math.isnan(r.total) else r.total,
            "components": {k: (None if math.isnan(v) else v) for k, v in r.components.items()},
            "reason": r.reason,
            "error": r.error,
        }
        for (uid, _, _), r in zip(rows, results)
    ]
    table = Table(title=f"{task}: {len(out)} completions, reward {weights}")
    for col in ("id", "reward", "components", "reason"):
        table.add_column(col, overflow="fold")
    for r in out:
        comps = ", ".join(f"{k}={'-' if v is None else f'{v:.3f}'}" for k, v in r["components"].items())
        table.add_row(
            str(r["id"]),
            "invalid" if r["reward"] is None else f"{r['reward']:.3f}",
            comps,
            r["error"] or r["reason"] or "-",
        )
    console.print(table)
    summary = totals(out)
    mean = "-" if summary["mean_reward"] is None else f"{summary['mean_reward']:.4f}"
    console.print(
        f"total: {summary['n']} rows, mean reward {mean}, invalid {summary['invalid']}, by reason {summary['reasons']}",
        highlight=False,
    )
    if json_out:
        json_out.write_text(
            json.dumps({"task": task, "weights": weights, "rows": out, "totals": summary}, indent=1) + "\n"
        )
        console.print(f"wrote {json_out}")
