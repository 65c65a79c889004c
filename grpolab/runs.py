"""Creating a run directory and its manifest, and resuming one (docs/design.md section 6).

A resume reads the config from RUN_DIR/manifest.json (plus any --set overrides), rebuilds the trainer and a
fresh manifest, and refuses -- naming every difference -- when the resolved config, objective, model weights,
tokenizer, chat template, reward code, data or package versions differ from the recorded ones, unless the
user passes --allow-changes. Every resume is recorded in the manifest's "resumes" list (time, checkpoint step,
accepted differences, git state of the resuming code); accepted changes also update the manifest's own sections, so the next resume compares
against what the run now is.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import manifest as mf
from .training import reproducibility
from .card import objective_card
from .config import Config, from_dict, parse_override, set_path, to_dict
from .training.distributed import barrier, gather_objects, init_world, resolve_device
from .errors import GrpolabError
from .rewards.model import reward_model_hashes, reward_model_manifest
from .rewards.user import source_hashes
from .tasks.base import Problem

if TYPE_CHECKING:
    from .training.trainer import Trainer


def plan_run_dir(cfg: Config) -> Path:
    """The run directory a new run will use; refuses one that already holds something (nothing is created)."""
    name = cfg.run.name or f"{cfg.task.name}-{cfg.algorithm.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(cfg.run.output_dir) / name
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise GrpolabError(f"run.name: {path} already exists and is not empty; choose another name, "
                           f"or continue it with: grpolab train --resume {path}")
    return path


def build_manifest(cfg: Config, model_path: str, tokenizer, train: list[Problem], held_out: list[Problem],
                   data_summary: dict[str, Any] | None = None, world_size: int = 1,
                   callable_hashes: dict[str, str | None] | None = None,
                   precision: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a run (docs/design.md section 6). ``hashes.reward_functions`` holds the source hash of every
    user reward: the file of each config reference, the own source of each Python callable passed in
    (``callable_hashes``; their names are listed under ``python_rewards``). A data summary with a ``source`` (the hf
    task, in-memory data sets) puts its ``fingerprint`` into ``hashes.dataset_fingerprint`` and the whole source
    into ``data.source``. ``precision``: the trainer's resolution of train.precision / rollout.dtype
    (grpolab.training.precision.resolve: setting, choice, source, probe numbers), stored under ``precision`` and shown in
    the objective card; a resume passes it back to the trainer."""
    hashes = mf.hash_model_dir(model_path)
    reward_hashes = {**source_hashes(cfg.reward.functions), **(callable_hashes or {})}
    fingerprint = ((data_summary or {}).get("source") or {}).get("fingerprint")
    rm = reward_model_manifest(cfg)  # the learned reward's model (grpolab.rewards.model), None without one
    return {
        "grpolab_manifest": 1,
        "command": " ".join(["grpolab", *sys.argv[1:]]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": to_dict(cfg),
        "objective": objective_card(cfg, precision),
        **({"precision": precision} if precision else {}),
        "hashes": {
            "model_weights": hashes["weights"],
            "tokenizer": hashes["tokenizer"],
            "chat_template": mf.sha256_bytes((tokenizer.chat_template or "").encode()),
            "reward_code": mf.reward_code_hash(),
            **({"reward_functions": dict(sorted(reward_hashes.items()))} if reward_hashes else {}),
            "train_data": mf.data_hash(train),
            "held_out_data": mf.data_hash(held_out),
            **({"dataset_fingerprint": fingerprint} if fingerprint else {}),
            **reward_model_hashes(rm),
        },
        **({"python_rewards": sorted(callable_hashes)} if callable_hashes else {}),
        **({"reward_model": rm} if rm else {}),
        "data": data_summary or {"train_problems": len(train), "held_out_problems": len(held_out)},
        "model_path": model_path,
        "train_problem_hashes": mf.problem_hashes(train),
        "versions": mf.versions(),
        "git": mf.git_state(),
        "seed": cfg.train.seed,
        "reproducibility": reproducibility.record(cfg.train.deterministic, resolve_device(cfg.train.device)),
        "world_size": world_size,
        "machine": mf.machine(),
    }


def trainer_manifest(trainer: "Trainer") -> dict[str, Any]:
    """The manifest of a built trainer, as it reads back from JSON (tuples as lists), so it compares equal."""
    built = build_manifest(trainer.config_given, trainer.model_path, trainer.tokenizer, trainer.train_problems,
                           trainer.eval_problems, trainer.data_summary, trainer.world.size,
                           trainer.rewards.callable_hashes(), trainer.precision)
    return json.loads(json.dumps(built))


def start_run(cfg: Config, rewards: dict[str, Any] | None = None,
              problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None = None) -> tuple["Trainer", dict[str, Any]]:
    """A new run: check the directory is free, build the trainer (bad input fails here, before anything is
    written), then create the directory and write its manifest. Over several ranks, rank 0 names and writes the
    directory (its name, with a timestamp, is the one every rank uses). ``rewards`` and ``problems``: Python
    callables and in-memory problems (grpolab.api, Trainer)."""
    from .baselines.ppo import trainer_class  # the GRPO Trainer, or PPO's for algorithm.estimator = gae

    world = init_world(resolve_device(cfg.train.device))
    run_dir = gather_objects(plan_run_dir(cfg) if world.main else None, world)[0]
    trainer = trainer_class(cfg)(cfg, run_dir, world, rewards=rewards, problems=problems)
    manifest = trainer_manifest(trainer)
    if world.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        mf.write_json_atomic(run_dir / "manifest.json", manifest)
    barrier(world)
    return trainer, manifest


def resume_config(run_dir: Path, overrides: list[str] | dict[str, Any]) -> tuple[Config, dict[str, Any]]:
    """(config recorded in RUN_DIR/manifest.json with overrides applied, the manifest); overrides are --set strings,
    or a mapping of dotted keys to values (grpolab.api)."""
    run_dir = Path(run_dir)
    if not (run_dir / "manifest.json").is_file():
        raise GrpolabError(f"--resume {run_dir}: not a run directory (no manifest.json); start a new run instead")
    try:
        manifest = mf.read_manifest(run_dir)
        raw = copy.deepcopy(manifest["config"])
    except (ValueError, KeyError, OSError) as e:
        raise GrpolabError(f"--resume {run_dir}: unreadable manifest.json ({type(e).__name__}: {e})") from None
    (raw.get("rollout") or {}).pop("engine", None)  # retired: it had one value and nothing read it
    for key, value in overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides):
        set_path(raw, key, value)
    return from_dict(raw), manifest


# What a resume must match. The git state is recorded with each resume but does not block it: a commit that
# touches nothing the run uses (docs, tests) is not a reason to refuse, and what does matter is hashed here.
RESUME_GUARDED = ("config", "objective", "hashes", "versions")


def check_resume(recorded: dict[str, Any], current: dict[str, Any], run_dir: Path, allow_changes: bool) -> list[tuple[str, Any, Any]]:
    """The differences between the recorded and the current manifest; refuses any unless allow_changes."""
    guarded = lambda m: {k: m.get(k) for k in RESUME_GUARDED}  # noqa: E731
    diffs = mf.diff_manifests(guarded(recorded), guarded(current))
    if diffs and not allow_changes:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs)
        raise GrpolabError(f"--resume {run_dir}: the run no longer matches its manifest ({len(diffs)} difference"
                           f"{'s' if len(diffs) > 1 else ''}: {listed}); pass --allow-changes to continue anyway "
                           f"(the differences are recorded in the manifest)")
    return diffs


def resume_run(run_dir: Path, overrides: list[str] | dict[str, Any], allow_changes: bool, rewards: dict[str, Any] | None = None,
               problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None = None) -> tuple["Trainer", Path | None]:
    """Rebuild the trainer of RUN_DIR, check it against the manifest, restore the newest complete checkpoint
    (step 0 when there is none) and record the resume. Returns (trainer, checkpoint resumed from). A run started
    with Python rewards or in-memory problems (grpolab.api) is resumed with the same ``rewards`` / ``problems``."""
    from .baselines.ppo import trainer_class  # the GRPO Trainer, or PPO's for algorithm.estimator = gae

    run_dir = Path(run_dir)
    cfg, recorded = resume_config(run_dir, overrides)
    trainer = trainer_class(cfg)(cfg, run_dir, init_world(resolve_device(cfg.train.device)), rewards=rewards, problems=problems,
                      precision=recorded.get("precision"))  # an "auto" keeps its recorded choice: no new probe
    current = trainer_manifest(trainer)
    diffs = check_resume(recorded, current, run_dir, allow_changes)
    path = trainer.resume()
    if not trainer.world.main:
        return trainer, path
    updated = dict(recorded, precision=current["precision"])  # the recorded one unless an override changed it
    if diffs:
        updated.update({k: current[k] for k in RESUME_GUARDED})
    updated["resumes"] = [*recorded.get("resumes", []), {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": trainer.step,
        "checkpoint": path.name if path else None, "command": " ".join(["grpolab", *sys.argv[1:]]),
        "allow_changes": allow_changes, "differences": [{"field": k, "recorded": a, "now": b} for k, a, b in diffs],
        "git": current.get("git"),
    }]
    mf.write_json_atomic(run_dir / "manifest.json", updated)
    return trainer, path
