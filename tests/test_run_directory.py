"""One writer per run directory (a lock a dead process never leaves behind), a resume that verifies the newest
checkpoint and offers the newest intact one, and a resume that records where it ran and downgrades the
bitwise-reproducibility claim when that changed (docs/robustness.md, "Run directories and checkpoints")."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path

import earnable
import pytest

from grpolab import manifest as mf
from grpolab import runs
from grpolab.config import from_dict, to_dict
from grpolab.errors import GrpolabError
from grpolab.models import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(model_dir: str, out: Path, name: str) -> dict:
    """A 2-step run of the tiny model, checkpointed at every step, no held-out eval (the cheapest real run)."""
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 4}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=2),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 2,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 1,
            "save_every": 1,
            "keep_last": 3,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


class LockHolder:
    """A forked child that takes RUN_DIR's writer lock through grpolab.runs and then waits; `kill` is a crash."""

    def __init__(self, run_dir: Path):
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: only fcntl and os calls, no torch
            try:
                held = runs.lock_run_dir(run_dir)  # noqa: F841 - held while it is referenced
                os.write(write, b"locked")
                time.sleep(120)
            except BaseException as e:  # noqa: BLE001 - reported to the parent through the pipe
                os.write(write, f"error {e}".encode()[:500])
            finally:
                os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 60)
        said = os.read(read, 600).decode() if ready else "nothing within 60 s"
        os.close(read)
        if said != "locked":
            self.kill()
            raise AssertionError(f"the lock holder said: {said}")

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def test_a_second_writer_is_refused_with_the_holders_pid_and_a_killed_holder_frees_the_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = LockHolder(run)
    try:
        with pytest.raises(GrpolabError) as refused:
            runs.lock_run_dir(run)
        assert str(refused.value).startswith(f"{run}: process {holder.pid} is already writing this run directory")
        with pytest.raises(GrpolabError, match="already writing"):
            runs.claim_new_run_dir(run)  # a second `grpolab train` of the same name, after the first made the dir
    finally:
        holder.kill()  # like kill -9: no cleanup runs in the holder
    lock = runs.lock_run_dir(run)  # the kernel released it with the process
    assert lock.held and (run / runs.LOCK_FILE).read_text().strip() == str(os.getpid())
    assert runs.lock_run_dir(run) is lock, "one process shares its own lock (the API may resume a run it built)"
    lock.release()
    holder = LockHolder(run)  # released: another process may take it now
    holder.kill()


def test_a_new_run_refuses_a_directory_another_run_filled_meanwhile(tmp_path):
    """Two runs of one name started together both find the directory free while they load their models; the
    one that gets there second is refused instead of writing into the first one's directory."""
    run = tmp_path / "run"
    first = runs.claim_new_run_dir(run)
    (run / "manifest.json").write_text("{}")  # the first run's manifest
    del first  # (even with the first one's lock released, the directory is taken)
    with pytest.raises(GrpolabError, match=r"run.name: .* already exists and is not empty"):
        runs.claim_new_run_dir(run)
    empty = tmp_path / "empty"
    runs.claim_new_run_dir(empty).release()  # a lock file alone (a run that died before its manifest) is empty
    cfg = from_dict({"run": {"output_dir": str(tmp_path), "name": "empty"}})
    assert runs.plan_run_dir(cfg) == empty


def test_a_read_only_run_directory_is_one_clear_error(tmp_path):
    run = tmp_path / "ro"
    run.mkdir()
    run.chmod(0o555)
    try:
        if os.access(run, os.W_OK):
            pytest.skip("running as a user that writes anywhere (root): no read-only directory to test")
        with pytest.raises(GrpolabError, match=r"ro: cannot create its lock file \.grpolab\.lock .*must be writable"):
            runs.lock_run_dir(run)
    finally:
        run.chmod(0o755)


def test_resumed_reproducibility_is_kept_or_downgraded_by_hand():
    claim = {"bitwise": True, "threads": 2, "holds_for": "the same machine"}
    machine = {"platform": "Linux-6", "cpu_model": "AMD EPYC", "cpus": 2}
    assert runs.resumed_reproducibility(claim, machine, dict(machine), 2, 5) is claim
    assert runs.resumed_reproducibility(claim, {"cpus": 2}, {**machine, "cpus": 2}, 2, 5) is claim  # fields both have
    moved = runs.resumed_reproducibility(claim, machine, {**machine, "cpu_model": "Intel Xeon"}, 2, 5)
    assert moved == {
        "bitwise": False,
        "original": claim,
        "changes": ["step 5: machine.cpu_model 'AMD EPYC' -> 'Intel Xeon'"],
        "why": "resumed on another machine, thread count or speed switch (step 5: machine.cpu_model 'AMD EPYC' -> "
        "'Intel Xeon'); the original claim held only for the same machine",
    }
    again = runs.resumed_reproducibility(moved, machine, machine, 1, 9)  # back on the machine, one thread
    assert again["bitwise"] is False and again["original"] == claim
    assert again["changes"] == [*moved["changes"], "step 9: torch threads 2 -> 1"]
    assert runs.resumed_reproducibility(moved, machine, machine, 2, 9) is moved, "a downgrade is never undone"


def test_resume_verifies_the_newest_checkpoint_offers_the_intact_one_and_records_where_it_ran(
    tiny_model_dir, tmp_path, monkeypatch
):
    cfg = from_dict(tiny(tiny_model_dir, tmp_path, "r"))
    trainer, manifest = runs.start_run(cfg)
    assert trainer.run_lock.held
    trainer.fit()
    run = tmp_path / "r"
    assert [p.name for p in ckpt.checkpoints(run)] == ["step-1", "step-2"]
    weights = run / "checkpoints" / "step-2" / "model.safetensors"
    pristine = weights.read_bytes()
    before = sorted(p.name for p in (run / "checkpoints").iterdir())

    with open(weights, "r+b") as f:  # 4 KiB of 0xff inside the tensors
        f.seek(len(pristine) // 2)
        f.write(b"\xff" * 4096)
    for damage in ("ff", "truncated"):
        if damage == "truncated":
            weights.write_bytes(pristine[: len(pristine) // 3])
        with pytest.raises(GrpolabError) as refused:
            runs.resume_run(run, [], allow_changes=False)
        message = str(refused.value)
        assert message.startswith(f"--resume {run}: checkpoint step-2 is corrupt (model.safetensors "), message
        assert ("has CRC-32" if damage == "ff" else "bytes, not the") in message
        assert (
            f"the newest intact checkpoint is step-1: resume from it with grpolab train --resume {run} --from-intact"
            in message
        )
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before, "nothing is moved or deleted"

    recorded = json.loads((run / "manifest.json").read_text())
    elsewhere = {**recorded["machine"], "cpu_model": "Another CPU"}
    monkeypatch.setattr(mf, "machine", lambda: dict(elsewhere))
    resumed, path = runs.resume_run(run, [], allow_changes=False, from_intact=True)
    assert path.name == "step-1" and resumed.step == 1
    assert (run / "checkpoints" / "corrupt-step-2" / "model.safetensors").stat().st_size == len(pristine) // 3
    after = json.loads((run / "manifest.json").read_text())
    (entry,) = after["resumes"]
    assert entry["machine"] == elsewhere and entry["threads"] == 1 and entry["checkpoint"] == "step-1"
    assert entry["corrupt_set_aside"] == [
        {"checkpoint": "corrupt-step-2", "problem": entry["corrupt_set_aside"][0]["problem"]}
    ]
    assert entry["corrupt_set_aside"][0]["problem"].startswith("model.safetensors is ")
    assert (
        after["reproducibility"]["bitwise"] is False
        and after["reproducibility"]["original"] == manifest["reproducibility"]
    )
    assert after["reproducibility"]["changes"] == [
        f"step 1: machine.cpu_model {recorded['machine']['cpu_model']!r} -> 'Another CPU'"
    ]
    assert after["machine"] == recorded["machine"], "the run's own machine stays the original one"
    resumed.fit()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert ckpt.verify_checkpoint(run / "checkpoints" / "step-2") is None


def test_a_resume_accepts_a_speed_switch_records_it_and_ends_the_bitwise_claim(tiny_model_dir, tmp_path):
    """A speed switch keeps the objective: no --allow-changes needed, but the change is recorded and the bitwise
    claim downgraded (it may sum in another order); a training field beside it is still refused."""
    cfg = from_dict(tiny(tiny_model_dir, tmp_path, "s"))
    trainer, manifest = runs.start_run(cfg)
    trainer.fit()
    trainer.close()
    run = tmp_path / "s"
    with pytest.raises(GrpolabError, match=r"1 difference: config.train.lr") as refused:
        runs.resume_run(run, ["speed.share_prompt=false", "train.lr=0.5"], allow_changes=False)
    assert "share_prompt" not in str(refused.value)
    resumed, _ = runs.resume_run(run, ["speed.share_prompt=false"], allow_changes=False)
    resumed.close()
    after = json.loads((run / "manifest.json").read_text())
    (entry,) = after["resumes"]
    assert entry["differences"] == []
    assert entry["speed_changes"] == [{"field": "config.speed.share_prompt", "recorded": True, "now": False}]
    assert after["config"]["speed"]["share_prompt"] is False, "the next resume compares against the run as it is"
    assert after["reproducibility"]["bitwise"] is False
    assert after["reproducibility"]["changes"] == ["step 2: config.speed.share_prompt True -> False"]
    assert after["reproducibility"]["original"] == manifest["reproducibility"]


def test_a_run_recorded_before_a_field_existed_resumes_as_it_began(tiny_model_dir, tmp_path):
    """A manifest written before algorithm.clip_cov_select and ref_reset_optimizer existed (and before the card
    listed them) resumes without --allow-changes, with the earlier behaviour (largest-first selection, optimizer
    kept), not today's defaults; a recorded value that differs from today's still refuses."""
    raw = tiny(tiny_model_dir, tmp_path, "old")
    raw["algorithm"].update(surrogate="clip_cov", clip_cov_select="largest", ref_reset_optimizer=False)
    trainer, _ = runs.start_run(from_dict(raw))
    trainer.fit()
    trainer.close()
    path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(path.read_text())
    for name in ("clip_cov_select", "ref_reset_optimizer"):
        del manifest["config"]["algorithm"][name]
        del manifest["objective"]["choices"][name]
    path.write_text(json.dumps(manifest))
    resumed, _ = runs.resume_run(tmp_path / "old", [], allow_changes=False)
    assert resumed.cfg.algorithm.clip_cov_select.value == "largest"
    assert resumed.cfg.algorithm.ref_reset_optimizer is False
    resumed.close()
    after = json.loads(path.read_text())
    assert after["resumes"][0]["differences"] == []
    manifest["objective"]["choices"]["cov_ratio"] = 0.5  # a recorded entry that differs is a difference
    path.write_text(json.dumps(manifest))
    with pytest.raises(GrpolabError, match=r"1 difference: objective.choices.cov_ratio"):
        runs.resume_run(tmp_path / "old", [], allow_changes=False)


def test_a_resume_is_refused_while_another_process_writes_the_run(tiny_model_dir, tmp_path):
    """The lock is taken before the model is loaded: the refusal is immediate and writes nothing."""
    run = tmp_path / "busy"
    run.mkdir()
    (run / "manifest.json").write_text(
        json.dumps({"config": to_dict(from_dict(tiny(tiny_model_dir, tmp_path, "busy")))})
    )
    holder = LockHolder(run)
    try:
        with pytest.raises(GrpolabError, match=f"process {holder.pid} is already writing"):
            runs.resume_run(run, [], allow_changes=False)
    finally:
        holder.kill()
    assert sorted(p.name for p in run.iterdir()) == [runs.LOCK_FILE, "manifest.json"]


def test_a_run_read_as_a_model_is_verified_first(tiny_model_dir, tmp_path):
    """`grpolab eval RUN` / `report` / RUN:best load the checkpoint only after its checksums match: a damaged one
    is one error naming the file and the newest intact checkpoint to name instead."""
    from grpolab.models.load import resolve_model_path

    trainer, _ = runs.start_run(from_dict(tiny(tiny_model_dir, tmp_path, "m")))
    trainer.fit()
    trainer.close()
    run = tmp_path / "m"
    assert resolve_model_path(str(run)) == str(run / "checkpoints" / "step-2")
    weights = run / "checkpoints" / "step-2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(GrpolabError) as refused:
        resolve_model_path(str(run))
    message = str(refused.value)
    assert message.startswith(f"{run}: checkpoint step-2 of {run} is corrupt (model.safetensors ")
    assert message.endswith(f"the newest intact one is {run / 'checkpoints' / 'step-1'}: name it instead")
    assert resolve_model_path(str(run / "checkpoints" / "step-1")) == str(run / "checkpoints" / "step-1")
