"""Creating a run directory and its manifest, and resuming one (docs/design.md section 6).

A resume reads the config from RUN_DIR/manifest.json (plus any --set overrides), rebuilds the trainer and a
fresh manifest, and refuses -- naming every difference -- when the resolved config, objective, model weights,
tokenizer, chat template, reward code, data or package versions differ from the recorded ones, unless the
user passes --allow-changes. Every resume is recorded in the manifest's "resumes" list (time, checkpoint step,
accepted differences, git state of the resuming code, machine and torch thread count); accepted changes also update
the manifest's own sections, so the next resume compares against what the run now is. A resume on another machine
or thread count is accepted, but the manifest's ``reproducibility`` claim is downgraded to ``bitwise: false``
(``resumed_reproducibility``): the run's bytes then depend on where each part of it ran.

One writer per run directory: a new run and a resume hold an exclusive lock (``fcntl.flock``) on
RUN_DIR/.grpolab.lock for the life of their trainer (``trainer.run_lock``); the kernel releases it when the
process ends, however it ends, so a crashed run never leaves it stuck. A second writer is refused with the
directory and the holder's pid. Within one process the lock is shared (the Python API may build a run and then
resume it while the first trainer object still exists).

Before anything is loaded, a resume verifies the newest checkpoint against its checksums
(grpolab.models.checkpoint.verify_checkpoint). A corrupt or truncated one is an error naming the file and the
newest intact earlier step; with ``from_intact`` the corrupt ones are renamed corrupt-step-N (kept, never deleted)
and the run continues from that step.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from . import manifest as mf
from .baselines import ppo  # noqa: F401 -- registers algorithm.estimator gae (PPO's critic) with the trainer
from .card import objective_card
from .card.recorded import upgrade_manifest
from .config import Config, from_dict, parse_override, recorded_config, set_path, to_dict
from .errors import GrpolabError
from .models import checkpoint as ckpt
from .models.load import resolve_model_path
from .rewards.model import reward_model_hashes, reward_model_manifest
from .rewards.user import source_hashes
from .tasks.base import Problem
from .training import reproducibility
from .training.distributed import barrier, gather_objects, init_world, resolve_device
from .training.memory_fit import check_before_training
from .training.trainer import Trainer


def plan_run_dir(cfg: Config) -> Path:
    """The run directory a new run will use; refuses one that already holds something (nothing is created)."""
    name = cfg.run.name or f"{cfg.task.name.replace(':', '-')}-{cfg.algorithm.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(cfg.run.output_dir) / name
    if path.exists() and (not path.is_dir() or any(p.name != LOCK_FILE for p in path.iterdir())):
        raise GrpolabError(
            f"run.name: {path} already exists and is not empty; choose another name, "
            f"or continue it with: grpolab train --resume {path}"
        )
    return path


# ------------------------------------------------------------------------------------- one writer per run directory

LOCK_FILE = ".grpolab.lock"
_HELD: "weakref.WeakValueDictionary[str, RunLock]" = weakref.WeakValueDictionary()  # this process's locks


class RunLock:
    """An exclusive ``flock`` on RUN_DIR/.grpolab.lock, held while this object lives (or until ``release``); the
    file holds the holder's pid. The kernel drops the lock with the process, so a killed run leaves none."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self, _close: Callable[[int], None] = os.close) -> None:  # bound now: __del__ may run at exit
        if self._fd >= 0:
            _close(self._fd)  # closing the descriptor releases the flock
            self._fd = -1

    def __del__(self) -> None:
        self.release()

    def __copy__(self) -> "RunLock":  # a copied trainer shares the lock; a copy must never close it
        return self

    def __deepcopy__(self, memo: dict) -> "RunLock":
        return self

    def __reduce__(self):
        raise TypeError(f"the writer lock of {self.run_dir} belongs to this process; it cannot be pickled")


def lock_run_dir(run_dir: Path) -> RunLock:
    """Take RUN_DIR's writer lock (this process's own one when it already holds it); a GrpolabError naming the
    directory and the holder's pid when another process holds it, or when the lock file cannot be created."""
    run_dir = Path(run_dir)
    key = os.path.realpath(run_dir)
    held = _HELD.get(key)
    if held is not None and held.held:
        return held
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise GrpolabError(
            f"{run_dir}: cannot create its lock file {LOCK_FILE} ({e.strerror or e}); a run directory must be writable"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f"process {holder}" if holder.isdigit() else "another process"
        raise GrpolabError(
            f"{run_dir}: {who} is already writing this run directory (it holds {path}); two runs "
            f"in one directory would interleave their steps and checkpoints -- wait for it to end "
            f"or stop it, or use another run.name"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    lock = _HELD[key] = RunLock(run_dir, fd)
    return lock


def claim_new_run_dir(run_dir: Path) -> RunLock:
    """Create a new run's directory and take its lock; refuses one that another run filled in the meantime (two
    runs of one name started together: the second one sees the first one's files)."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GrpolabError(f"run.output_dir: cannot create {run_dir} ({e.strerror or e})") from None
    ours = _HELD.get(os.path.realpath(run_dir)) is None
    lock = lock_run_dir(run_dir)
    if any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        if ours:
            lock.release()
        raise GrpolabError(
            f"run.name: {run_dir} already exists and is not empty (another run of this name "
            f"started meanwhile); choose another name, or continue it with: grpolab train --resume {run_dir}"
        )
    return lock


def on_main(world, fn: Callable[[], Any]) -> Any:
    """fn() on rank 0; a GrpolabError it raises is raised on every rank (the others get its message)."""
    result, error = None, None
    if world.main:
        try:
            result = fn()
        except GrpolabError as e:
            error = e
    message = gather_objects(str(error) if error else None, world)[0]
    if error is not None:
        raise error
    if message is not None:
        raise GrpolabError(message)
    return result


def build_manifest(
    cfg: Config,
    model_path: str,
    tokenizer,
    train: list[Problem],
    held_out: list[Problem],
    data_summary: dict[str, Any] | None = None,
    world_size: int = 1,
    callable_hashes: dict[str, str | None] | None = None,
    precision: dict[str, Any] | None = None,
) -> dict[str, Any]:
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
    teacher = teacher_manifest(cfg)  # on-policy distillation's teacher, {} without one
    return {
        "grpolab_manifest": 1,
        "command": " ".join(["grpolab", *sys.argv[1:]]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": to_dict(cfg),
        "objective": {**objective_card(cfg, precision), **environment_entry(data_summary)},
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
            **teacher.get("hashes", {}),
        },
        **({"python_rewards": sorted(callable_hashes)} if callable_hashes else {}),
        **({"reward_model": rm} if rm else {}),
        "data": data_summary or {"train_problems": len(train), "held_out_problems": len(held_out)},
        "model_path": model_path,
        **teacher.get("path", {}),
        "train_problem_hashes": mf.problem_hashes(train),
        "versions": mf.versions(),
        "git": mf.git_state(),
        "seed": cfg.train.seed,
        "reproducibility": reproducibility.record(cfg.train.deterministic, resolve_device(cfg.train.device)),
        "world_size": world_size,
        "machine": mf.machine(),
    }


def environment_entry(data_summary: dict[str, Any] | None) -> dict[str, Any]:
    """The objective card's ``environment``: the identity and version of a task from another library (reasoning-gym,
    verifiers, OpenEnv: the task's ``source`` with its ``library``), {} for grpolab's own tasks."""
    source = (data_summary or {}).get("source") or {}
    return {"environment": source} if "library" in source else {}


def teacher_manifest(cfg: Config) -> dict[str, Any]:
    """With algorithm.estimator = distill: the teacher's weights and tokenizer hashes (so a resume, `manifest diff`
    and the comparison of seeds see a teacher whose run directory gained a newer checkpoint) and its resolved path."""
    if cfg.algorithm.estimator != "distill":
        return {}
    path = resolve_model_path(cfg.distill.teacher, "distill.teacher")
    hashes = mf.hash_model_dir(path)
    return {
        "hashes": {"teacher_weights": hashes["weights"], "teacher_tokenizer": hashes["tokenizer"]},
        "path": {"teacher_path": path},
    }


def trainer_manifest(trainer: "Trainer") -> dict[str, Any]:
    """The manifest of a built trainer, as it reads back from JSON (tuples as lists), so it compares equal."""
    built = build_manifest(
        trainer.config_given,
        trainer.model_path,
        trainer.tokenizer,
        trainer.train_problems,
        trainer.eval_problems,
        trainer.data_summary,
        trainer.world.size,
        trainer.rewards.callable_hashes(),
        trainer.precision,
    )
    judge = trainer.rewards.judge_record()  # the judge the trainer built (the card only describes it)
    if judge is not None:
        built["judge"] = judge
    version = trainer.engine.version  # vLLM's, from its own venv or its servers (rollout.engine: vllm, vllm_server)
    if version and trainer.cfg.rollout.engine in ("vllm", "vllm_server"):
        built["versions"] = {**built["versions"], "vllm": version}
    if trainer.cfg.rollout.engine == "vllm_server":  # each server's URL and version (not guarded on resume)
        built["rollout_servers"] = trainer.engine.record()
    return json.loads(json.dumps(built))


def start_run(
    cfg: Config,
    rewards: dict[str, Any] | None = None,
    problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple["Trainer", dict[str, Any]]:
    """A new run: check the directory is free, build the trainer (bad input fails here, before anything is
    written), then create the directory, take its writer lock (``trainer.run_lock``) and write its manifest. Over
    several ranks, rank 0 names, locks and writes the directory (its name, with a timestamp, is the one every rank
    uses). ``rewards`` and ``problems``: Python callables and in-memory problems (grpolab.api, Trainer);
    ``progress``: the trainer's progress lines (grpolab.training.trainer)."""
    world = init_world(resolve_device(cfg.train.device))
    run_dir = gather_objects(plan_run_dir(cfg) if world.main else None, world)[0]
    trainer = Trainer(cfg, run_dir, world, rewards=rewards, problems=problems, progress=progress)
    fit = check_before_training(trainer)  # a micro-batch that would not fit is refused before anything is written
    manifest = {**trainer_manifest(trainer), "memory_fit": fit}
    try:
        trainer.run_lock = on_main(world, lambda: claim_new_run_dir(run_dir))
    except GrpolabError:
        trainer.close()  # its process settings put back
        raise
    if world.main:
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
        raw = recorded_config(manifest["config"])
    except (ValueError, KeyError, OSError) as e:
        raise GrpolabError(f"--resume {run_dir}: unreadable manifest.json ({type(e).__name__}: {e})") from None
    rollout = raw.get("rollout") or {}
    if rollout.get("engine") == "hf":  # an early field with one value that nothing read (today's engine: grpolab)
        rollout.pop("engine")
    for key, value in overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides):
        set_path(raw, key, value)
    return from_dict(raw), manifest


# What a resume must match. The git state is recorded with each resume but does not block it: a commit that
# touches nothing the run uses (docs, tests) is not a reason to refuse, and what does matter is hashed here.
RESUME_GUARDED = ("config", "objective", "judge", "hashes", "versions")


def check_server_version(recorded: dict[str, Any], current: dict[str, Any], allow_changes: bool) -> None:
    """rollout.engine vllm_server: servers of another vLLM version than the run recorded are refused, naming them."""
    was, now = (recorded.get("versions") or {}).get("vllm"), (current.get("versions") or {}).get("vllm")
    urls = [s["url"] for s in current.get("rollout_servers") or []]
    if urls and was and was != now and not allow_changes:
        raise GrpolabError(
            f"rollout.servers: {', '.join(urls)} run vLLM {now}; the run was recorded with vLLM {was} (manifest "
            f"versions.vllm): serve vLLM {was}, or pass --allow-changes"
        )


def check_resume(
    recorded: dict[str, Any], current: dict[str, Any], run_dir: Path, allow_changes: bool
) -> list[tuple[str, Any, Any]]:
    """The differences between the recorded and the current manifest; refuses any unless allow_changes."""
    guarded = lambda m: {k: m.get(k) for k in RESUME_GUARDED}  # noqa: E731
    diffs = mf.diff_manifests(guarded(upgrade_manifest(recorded, current)), guarded(current))
    if diffs and not allow_changes:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs)
        raise GrpolabError(
            f"--resume {run_dir}: the run no longer matches its manifest ({len(diffs)} difference"
            f"{'s' if len(diffs) > 1 else ''}: {listed}); pass --allow-changes to continue anyway "
            f"(the differences are recorded in the manifest)"
        )
    return diffs


def resume_run(
    run_dir: Path,
    overrides: list[str] | dict[str, Any],
    allow_changes: bool,
    rewards: dict[str, Any] | None = None,
    problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
    from_intact: bool = False,
) -> tuple["Trainer", Path | None]:
    """Lock RUN_DIR, verify its newest checkpoint (``intact_checkpoints``; ``from_intact``: set corrupt newest ones
    aside and continue from the newest intact step), rebuild the trainer, check it against the manifest, restore
    the newest complete checkpoint (step 0 when there is none) and record the resume. Returns (trainer, checkpoint
    resumed from). A run started with Python rewards or in-memory problems (grpolab.api) is resumed with the same
    ``rewards`` / ``problems``."""
    run_dir = Path(run_dir)
    cfg, recorded = resume_config(run_dir, overrides)
    world = init_world(resolve_device(cfg.train.device))
    lock = on_main(world, lambda: lock_run_dir(run_dir))
    corrupt = on_main(world, lambda: intact_checkpoints(run_dir, from_intact)) or []
    trainer = Trainer(
        cfg,
        run_dir,
        world,
        rewards=rewards,
        problems=problems,
        precision=recorded.get("precision"),  # an "auto" keeps its recorded choice: no new probe
        progress=progress,
    )
    trainer.run_lock = lock
    current = trainer_manifest(trainer)
    try:
        check_server_version(recorded, current, allow_changes)
        diffs = check_resume(recorded, current, run_dir, allow_changes)
    except GrpolabError:
        trainer.close()  # its process settings put back
        raise
    fit = check_before_training(trainer)  # before the checkpoint loads: what the probe changes is put back or replaced
    set_aside = [ckpt.set_aside(p).name for p, _ in corrupt] if world.main else []
    barrier(world)  # no rank looks for the newest checkpoint before the corrupt ones are out of the way
    path = trainer.resume()
    if not trainer.world.main:
        return trainer, path
    updated = dict(recorded, precision=current["precision"])  # the recorded one unless an override changed it
    speed = mf.speed_differences(recorded, current)  # accepted without --allow-changes: the same objective
    if diffs or speed:
        updated.update({k: current[k] for k in RESUME_GUARDED if k in current})
    threads = torch.get_num_threads()
    updated["reproducibility"] = resumed_reproducibility(
        recorded.get("reproducibility") or {},
        recorded.get("machine") or {},
        current["machine"],
        threads,
        trainer.step,
        [f"{k} {a!r} -> {b!r}" for k, a, b in speed],
    )
    updated["resumes"] = [
        *recorded.get("resumes", []),
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": trainer.step,
            "checkpoint": path.name if path else None,
            "command": " ".join(["grpolab", *sys.argv[1:]]),
            "allow_changes": allow_changes,
            "differences": [{"field": k, "recorded": a, "now": b} for k, a, b in diffs],
            "speed_changes": [{"field": k, "recorded": a, "now": b} for k, a, b in speed],
            "git": current.get("git"),
            "machine": current["machine"],
            "threads": threads,
            "memory_fit": fit,
            **({"corrupt_set_aside": set_aside_records(set_aside, corrupt)} if set_aside else {}),
        },
    ]
    mf.write_json_atomic(run_dir / "manifest.json", updated)
    return trainer, path


def set_aside_records(names: list[str], corrupt: list[tuple[Path, str]]) -> list[dict[str, str]]:
    """The resume record's list of the corrupt checkpoints it set aside: their new names and what was wrong."""
    return [{"checkpoint": name, "problem": why} for name, (_, why) in zip(names, corrupt)]


def intact_checkpoints(run_dir: Path, from_intact: bool) -> list[tuple[Path, str]]:
    """Restore what an interrupted re-save moved aside (ckpt.remove_partial), then verify the newest checkpoint:
    [] when it is intact (or there is none); the corrupt newer ones, newest first, when ``from_intact`` and an
    intact earlier one exists; else a GrpolabError naming the corrupt file and the newest intact step."""
    ckpt.remove_partial(run_dir)
    intact, corrupt = ckpt.newest_intact(run_dir)
    if not corrupt:
        return []
    newest, why = corrupt[0]
    bad = f"--resume {run_dir}: checkpoint {newest.name} is corrupt ({why})"
    others = "".join(f"; {p.name} too ({w})" for p, w in corrupt[1:])
    if intact is None:
        raise GrpolabError(
            f"{bad}{others}; no earlier checkpoint is intact, so there is nothing to resume from: start "
            f"a new run (the corrupt checkpoints are left as they are)"
        )
    if not from_intact:
        raise GrpolabError(
            f"{bad}{others}; the newest intact checkpoint is {intact.name}: resume from it with "
            f"grpolab train --resume {run_dir} --from-intact (the corrupt one is kept, renamed "
            f"{ckpt.CORRUPT_PREFIX}{newest.name}; steps after {intact.name} are trained again)"
        )
    return corrupt


def resumed_reproducibility(
    claim: dict[str, Any],
    machine_then: dict[str, Any],
    machine_now: dict[str, Any],
    threads_now: int,
    step: int,
    speed_changes: list[str] = (),
) -> dict[str, Any]:
    """The manifest's ``reproducibility`` after a resume at ``step``: ``claim`` itself when the machine (every
    field both records), the torch thread count and the speed switches are the run's own; else ``bitwise: false``
    with ``why`` naming the resume and what changed, the first claim kept under ``original`` (later resumes add to
    ``changes``). A speed switch keeps the objective but may sum in another order, so it ends the bitwise claim.

    >>> claim = {"bitwise": True, "threads": 2}
    >>> resumed_reproducibility(claim, {"cpus": 2}, {"cpus": 2}, 2, 3) is claim
    True
    >>> r = resumed_reproducibility(claim, {"cpus": 2}, {"cpus": 4}, 4, 3)
    >>> r["bitwise"], r["changes"], r["original"] == claim
    (False, ['step 3: machine.cpus 2 -> 4', 'step 3: torch threads 2 -> 4'], True)
    """
    original = claim.get("original", claim)
    found = [
        f"step {step}: machine.{k} {machine_then[k]!r} -> {machine_now[k]!r}"
        for k in sorted(set(machine_then) & set(machine_now))
        if machine_then[k] != machine_now[k]
    ]
    threads_then = original.get("threads")
    if threads_then is not None and threads_then != threads_now:
        found.append(f"step {step}: torch threads {threads_then} -> {threads_now}")
    found += [f"step {step}: {change}" for change in speed_changes]
    if not found:
        return claim
    changes = [*claim.get("changes", []), *found]
    return {
        "bitwise": False,
        "original": original,
        "changes": changes,
        "why": "resumed on another machine, thread count or speed switch ("
        + "; ".join(changes)
        + "); the original claim "
        "held only for " + str(original.get("holds_for", "the same machine, thread count and versions")),
    }
