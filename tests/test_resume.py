"""Never lose a run: a kill -9 at a random moment and a resume give the same metrics and bitwise the same
weights as an uninterrupted run; checkpoint writes are atomic; a resume refuses a changed run unless allowed."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import earnable
import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpolab import cli
from grpolab.config import from_dict
from grpolab.errors import GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.models import direct_io
from grpolab.runs import resume_run, start_run

GRPOLAB = Path(sys.executable).with_name("grpolab")
VOLATILE = ("time/", "throughput/", "memory/")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(model_dir: str, out: Path, name: str, **train) -> dict:
    """A tiny run whose gradient is the policy-gradient term's alone: the random model earns the newline reward of
    tests/earnable.py (non-zero advantages), no entropy bonus, no KL. Its metrics depend on every sampled token, so
    a wrong RNG, optimizer or cursor state after a resume changes them."""
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 4,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 2,
            "save_every": 1,
            **train,
        },
        "eval": {"every_steps": 2, "num_problems": 2, "max_new_tokens": 3},
        "run": {"output_dir": str(out), "name": name},
    }


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_main(monkeypatch, *args: str) -> int:
    """grpolab.cli.main with these arguments, in this process; returns its exit code."""
    monkeypatch.setattr(sys, "argv", ["grpolab", *map(str, args)])
    try:
        cli.main()
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = rows(a / "metrics.jsonl"), rows(b / "metrics.jsonl")
    assert [r["step"] for r in rb] == [r["step"] for r in ra], "every step exactly once"
    for x, y in zip(ra, rb):
        assert stable(x) == stable(y), f"step {x['step']} differs"
    assert rows(a / "samples.jsonl") == rows(b / "samples.jsonl")
    wa = load_file(ckpt.latest_checkpoint(a) / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(b) / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k  # bitwise


def assert_policy_gradient(run: Path) -> None:
    """Every step had non-zero advantages, so the policy-gradient term (the only one) moved the weights."""
    for r in rows(run / "metrics.jsonl"):
        assert r["loss/signal_token_frac"] > 0 and r["reward/std"] > 0, f"step {r['step']}: every advantage is 0"


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> float:
    end = time.monotonic() + timeout
    while not path.is_file():
        if proc.poll() is not None:
            raise AssertionError(f"training ended (rc {proc.returncode}) before {path} appeared:\n{proc.stdout.read()}")
        if time.monotonic() > end:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.02)
    return time.monotonic()


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> tuple[dict, Path]:
    """An uninterrupted 4-step run (through the CLI entry point): (its config, its run directory)."""
    out = tmp_path_factory.mktemp("reference")
    cfg = tiny(tiny_model_dir, out, "whole")
    with pytest.MonkeyPatch.context() as mp:
        assert run_main(mp, "train", write_config(out / "whole.yaml", cfg)) == 0
    assert_policy_gradient(out / "whole")
    return cfg, out / "whole"


def test_kill9_at_a_random_moment_then_resume_equals_an_uninterrupted_run(reference, tmp_path, monkeypatch, capsys):
    cfg, whole = reference
    cfg = {**cfg, "run": {"output_dir": str(tmp_path), "name": "killed"}}
    config = write_config(tmp_path / "killed.yaml", cfg)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [str(GRPOLAB), "train", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV
    )
    try:
        t1 = wait_for(killed / "checkpoints" / "step-1" / ckpt.STATE_FILE, proc)
        t2 = wait_for(killed / "checkpoints" / "step-2" / ckpt.STATE_FILE, proc)
        delay = random.uniform(0, t2 - t1)  # somewhere in step 3, its checkpoint write, or early in step 4
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(60)
    state = f"killed {delay:.2f}s after step-2 (rc {proc.returncode}); left: {sorted(p.name for p in (killed / 'checkpoints').iterdir())}"

    capsys.readouterr()
    code = run_main(monkeypatch, "train", "--resume", killed)  # in this process: saves a second torch import
    out = capsys.readouterr()
    assert code == 0, f"{state}\n{out.out}\n{out.err}"
    assert f"resume {killed} from step-" in out.out
    assert_same_run(whole, killed)
    assert not [p for p in (killed / "checkpoints").iterdir() if p.name.startswith(".")], state
    resumes = json.loads((killed / "manifest.json").read_text())["resumes"]
    assert len(resumes) == 1 and resumes[0]["differences"] == [] and resumes[0]["step"] >= 2, state


@pytest.mark.parametrize("fail_in", ["torch.save", "direct write", "save_pretrained"])
def test_a_failed_checkpoint_write_keeps_the_previous_one(tiny_model_dir, tmp_path, monkeypatch, fail_in):
    """A write that dies midway (a full disk) leaves no step dir, no temp dir, and step-1 loadable; the run
    stops with a message naming it, and a resume from step-1 carries on without duplicating step 2's row.
    "direct write": a buffer write of the files written past the page cache (the model's safetensors first);
    "save_pretrained": the model written by transformers, as with speed.checkpoint_direct_io false."""
    raw = tiny(tiny_model_dir, tmp_path, "full", steps=2)
    raw["eval"] = {"every_steps": 0}
    raw["speed"] = {"checkpoint_direct_io": fail_in != "save_pretrained"}
    cfg = from_dict(raw)
    trainer, _ = start_run(cfg)
    calls = {"n": 0}

    def full_disk(real):
        def write(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # the checkpoint of step 2
                real(*args, **kwargs)  # part of it reaches the disk first
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)

        return write

    if fail_in == "torch.save":
        monkeypatch.setattr(ckpt.torch, "save", full_disk(torch.save))
    elif fail_in == "direct write":  # each checkpoint writes two files of one buffer each: the third write is step 2's
        calls["n"] = -1
        monkeypatch.setattr(direct_io, "_write_all", full_disk(direct_io._write_all))
    else:
        monkeypatch.setattr(trainer.policy, "save_pretrained", full_disk(trainer.policy.save_pretrained))
    with pytest.raises(GrpolabError, match=r"step 2 .*No space left.*step-1 is intact"):
        trainer.fit()
    run = tmp_path / "full"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    state = ckpt.load_state(run / "checkpoints" / "step-1")
    assert state["step"] == 1 and {"optimizer", "scheduler", "rng", "sampler", "logs"} <= set(state)
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert load_file(run / "checkpoints" / "step-1" / "model.safetensors")
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2]  # step 2 was logged before its save failed

    monkeypatch.undo()
    resumed, path = resume_run(run, [], allow_changes=False)
    assert path.name == "step-1" and resumed.step == 1
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1]  # the row written after step-1 is cut off
    resumed.fit()
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2]
    assert ckpt.latest_checkpoint(run).name == "step-2"


def test_resume_refuses_a_changed_run_unless_allowed(tiny_model_dir, tmp_path, monkeypatch, capsys):
    cfg = tiny(tiny_model_dir, tmp_path, "r", steps=1, save_every=0)
    cfg["eval"] = {"every_steps": 0}
    assert run_main(monkeypatch, "train", write_config(tmp_path / "r.yaml", cfg)) == 0
    run = tmp_path / "r"
    manifest = json.loads((run / "manifest.json").read_text())
    tampered = dict(
        manifest,
        hashes={
            **manifest["hashes"],
            **{k: "0" * 64 for k in ("model_weights", "tokenizer", "chat_template", "reward_code", "train_data")},
        },
    )
    (run / "manifest.json").write_text(json.dumps(tampered))
    capsys.readouterr()

    assert run_main(monkeypatch, "train", "--resume", run, "--set", "algorithm.beta=0.1") == 2
    err = capsys.readouterr().err
    for field in (
        "config.algorithm.beta",
        "hashes.model_weights",
        "hashes.tokenizer",
        "hashes.chat_template",
        "hashes.reward_code",
        "hashes.train_data",
        "--allow-changes",
    ):
        assert field in err, field
    assert "Traceback" not in err

    (run / "manifest.json").write_text(json.dumps(manifest))
    assert run_main(monkeypatch, "train", "--resume", run, "--set", "train.steps=2", "--allow-changes") == 0
    after = json.loads((run / "manifest.json").read_text())
    assert after["config"]["train"]["steps"] == 2  # the manifest now describes the run as it continues
    (entry,) = after["resumes"]
    assert entry["allow_changes"] and entry["step"] == 1 and entry["checkpoint"] == "step-1"
    assert entry["differences"] == [{"field": "config.train.steps", "recorded": 1, "now": 2}]
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2]
    assert ckpt.latest_checkpoint(run).name == "step-2"

    assert run_main(monkeypatch, "train", "--resume", run) == 0  # finished: nothing to do, nothing rewritten
    assert "already finished" in capsys.readouterr().out
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2]


def test_ctrl_c_during_rollout_checkpoints_the_last_step_and_resumes_exactly(reference, tmp_path, monkeypatch, capsys):
    """Ctrl-C while step 3 samples: the step is rolled back, step 2 is checkpointed, exit 130; the resumed run
    equals an uninterrupted one (the rollback restored the RNG states and the prompt cursor)."""
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    cfg, whole = reference
    cfg = {**cfg, "train": {**cfg["train"], "save_every": 0}, "run": {"output_dir": str(tmp_path), "name": "ctrl-c"}}
    real, calls = GrpolabEngine.generate, {"n": 0}

    def generate(self, prompts, params, *args, **kwargs):
        out = real(self, prompts, params, *args, **kwargs)  # draws from the RNG before the interrupt arrives
        calls["n"] += not params.greedy
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(GrpolabEngine, "generate", generate)
    assert run_main(monkeypatch, "train", write_config(tmp_path / "ctrl-c.yaml", cfg)) == 130
    err = capsys.readouterr().err
    run = tmp_path / "ctrl-c"
    # step 2 is checkpointed: here by its held-out eval, the best so far (the interrupt finds it written already)
    assert f"the newest complete one is {run / 'checkpoints' / 'step-2'}" in err and "--resume" in err
    monkeypatch.setattr(GrpolabEngine, "generate", real)
    assert run_main(monkeypatch, "train", "--resume", run) == 0
    assert_same_run(whole, run)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_during_the_update_finishes_the_step_then_checkpoints(
    tiny_model_dir, tmp_path, monkeypatch, capsys, sig
):
    """A real SIGINT (or SIGTERM, as a scheduler sends) delivered while the policy updates is deferred to the end
    of the step."""
    from grpolab.training.update import PolicyUpdater

    cfg = tiny(tiny_model_dir, tmp_path, "sigint", steps=3, save_every=0, memory_fit="off")  # no probe updates
    cfg["eval"] = {"every_steps": 0}
    real = PolicyUpdater.update

    def update(self, *args, **kwargs):
        os.kill(os.getpid(), sig)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PolicyUpdater, "update", update)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))  # SIG_IGN in a background job
    assert run_main(monkeypatch, "train", write_config(tmp_path / "sigint.yaml", cfg)) == 130
    run = tmp_path / "sigint"
    assert f"checkpoint written to {run / 'checkpoints' / 'step-1'}" in capsys.readouterr().err
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # the handlers are put back


def test_an_fp16_run_resumes_with_its_loss_scale(tiny_model_dir, tmp_path, monkeypatch):
    """fp16 update and sampler with the loss scale doubled after every good optimizer step (growth interval 1, from
    2^8: far below where this model's fp16 gradient overflows, about 2^18), so the scale differs at every checkpoint:
    resumed from step 2, the run equals the whole one, optim/loss_scale included (a resume without the scaler's
    state would log 2^9 at step 3, not 2^11)."""
    fp16 = {"precision": "fp16", "loss_scale_init": 2.0**8, "loss_scale_growth_interval": 1}
    cfg = tiny(tiny_model_dir, tmp_path, "fp16", keep_last=10, **fp16)
    cfg["rollout"] = {**cfg["rollout"], "dtype": "float16"}
    cfg["eval"] = {"every_steps": 0}
    assert run_main(monkeypatch, "train", write_config(tmp_path / "fp16.yaml", cfg)) == 0
    whole, resumed = tmp_path / "fp16", tmp_path / "resumed"
    assert [r["optim/loss_scale"] for r in rows(whole / "metrics.jsonl")] == [2.0**9, 2.0**10, 2.0**11, 2.0**12]
    state = torch.load(whole / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=False)
    assert state["faults"]["loss_scaler"] == {"scale": 2.0**10, "good_steps": 0, "overflow_steps": 0}
    shutil.copytree(whole, resumed)
    for step in (3, 4):
        shutil.rmtree(resumed / "checkpoints" / f"step-{step}")
    assert run_main(monkeypatch, "train", "--resume", resumed) == 0
    assert_same_run(whole, resumed)
