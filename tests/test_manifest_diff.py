"""`grpolab manifest diff`: every semantic difference between two runs shows up, nothing else does.

Manifests are built with the real build_manifest (tiny model dir, bundled tokenizer, arithmetic problems); the
git state is stubbed so no git process runs in tests.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpolab import manifest as mf
from grpolab.config import SPEED_FIELDS_MOVED, from_dict
from grpolab.errors import ConfigError
from grpolab.manifest import diff_manifests, hash_model_dir, speed_differences
from grpolab.runs import build_manifest
from grpolab.tasks import make_task

GIT = {"commit": "0" * 40, "dirty": False}


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
    monkeypatch.setattr(mf, "git_state", lambda: dict(GIT))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def raw_config(model_dir: str, **sections) -> dict:
    raw = {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 10}},
        "run": {"output_dir": "runs", "name": "a"},
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return raw


def manifest(model_dir: str, tokenizer, train=None, held_out=None, **sections) -> dict:
    cfg = from_dict(raw_config(model_dir, **sections))
    task = make_task(cfg.task.name, **cfg.task.options)
    train = task.problems("train") if train is None else train
    held_out = task.problems("test") if held_out is None else held_out
    return json.loads(json.dumps(build_manifest(cfg, model_dir, tokenizer, train, held_out)))  # as stored on disk


def keys(diffs) -> set[str]:
    return {k for k, _, _ in diffs}


@pytest.fixture(scope="module")
def base(tiny_model_dir, tokenizer):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mf, "git_state", lambda: dict(GIT))
        return manifest(tiny_model_dir, tokenizer)


# --------------------------------------------------------------------------------------------- no difference


def test_manifest_has_the_hashes(base):
    h = base["hashes"]
    for k in ("model_weights", "tokenizer", "chat_template", "reward_code", "train_data", "held_out_data"):
        assert isinstance(h[k], str) and len(h[k]) == 64, k
    assert base["config"]["algorithm"]["eps_high"] == 0.2  # expanded fields, not just the preset name
    assert base["objective"]["formula"].startswith("L = -")


def test_identical_manifests_give_no_difference(tiny_model_dir, tokenizer, base):
    again = manifest(tiny_model_dir, tokenizer)  # built a second time: other timestamp, same identity
    assert diff_manifests(base, again) == []
    assert diff_manifests(base, copy.deepcopy(base)) == []


def test_where_a_run_is_written_and_watched_does_not_count(tiny_model_dir, tokenizer, base):
    run = {
        "name": "b",
        "output_dir": "/elsewhere",
        "report_to": ["tensorboard"],
        "mlflow_tracking_uri": "sqlite:///x",
        "table_every_steps": 5,
        "table_groups": 2,
    }
    other = manifest(tiny_model_dir, tokenizer, run=run)
    assert {k: other["config"]["run"][k] for k in run} == run
    assert diff_manifests(base, other) == []


def test_speed_switches_are_listed_apart_from_what_is_trained(base):
    """A speed switch (config.SpeedConfig) never changes the objective: diff_manifests leaves it out and
    speed_differences lists it; a run recorded before a switch existed, or before the switches moved to `speed:`,
    compares as the same run. A training setting still counts."""
    other, older, moved = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    other["config"]["speed"]["keep_freed_memory"] = not base["config"]["speed"]["keep_freed_memory"]
    del older["config"]["speed"]["checkpoint_direct_io"]
    for name, section in SPEED_FIELDS_MOVED.items():  # the layout before `speed:`
        moved["config"][section][name] = moved["config"]["speed"].pop(name)
    del moved["config"]["speed"]
    assert diff_manifests(base, other) == [] and diff_manifests(older, base) == []
    assert speed_differences(base, other) == [("config.speed.keep_freed_memory", True, False)]
    assert speed_differences(older, base) == [("config.speed.checkpoint_direct_io", None, True)]
    assert diff_manifests(moved, base) == [] and speed_differences(moved, base) == []
    other["config"]["train"]["lr"] = 2 * base["config"]["train"]["lr"]
    assert [k for k, _, _ in diff_manifests(base, other)] == ["config.train.lr"]


def test_a_speed_switch_at_its_old_place_is_read_there_with_a_warning(caplog):
    cfg = from_dict({"train": {"share_prompt": False}, "rollout": {"cpu_fast_paths": False}})
    assert (cfg.speed.share_prompt, cfg.speed.cpu_fast_paths, cfg.speed.pack_completions) == (False, False, True)
    assert "train.share_prompt moved to speed.share_prompt" in caplog.text
    assert not hasattr(cfg.train, "share_prompt") and not hasattr(cfg.rollout, "cpu_fast_paths")
    with pytest.raises(ConfigError, match="train.share_prompt and speed.share_prompt are both set"):
        from_dict({"train": {"share_prompt": False}, "speed": {"share_prompt": True}})
    with pytest.raises(ConfigError, match="unknown field 'speed.share_prompts'; did you mean 'speed.share_prompt'"):
        from_dict({"speed": {"share_prompts": False}})


def test_bookkeeping_fields_do_not_count(base):
    other = copy.deepcopy(base)
    other.update(
        created="1999-01-01T00:00:00",
        command="grpolab train x.yaml",
        machine={"cpus": 999},
        model_path="/somewhere/else",
    )
    assert diff_manifests(base, other) == []


# --------------------------------------------------------------------------------------------- differences


def test_algorithm_preset_difference(tiny_model_dir, tokenizer, base):
    dapo = manifest(tiny_model_dir, tokenizer, algorithm={"preset": "dapo"})
    d = diff_manifests(base, dapo)
    assert ("config.algorithm.preset", "grpo", "dapo") in d
    assert ("config.algorithm.eps_high", 0.2, 0.28) in d
    assert ("config.algorithm.aggregation", "seq_mean_token_mean", "token_mean") in d
    assert ("config.algorithm.beta", 0.04, 0.0) in d
    assert ("config.algorithm.dynamic_sampling", False, True) in d
    assert {
        "objective.formula",
        "objective.formula_latex",
        "objective.choices.eps_high",
        "objective.equivalents.trl.aggregation.settings.loss_type",
    } <= keys(d)
    assert not any(k.startswith(("hashes.", "config.rollout.", "config.run.")) for k in keys(d))


def test_single_algorithm_field_difference(tiny_model_dir, tokenizer, base):
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer, algorithm={"std_kind": "population"}))
    assert ("config.algorithm.std_kind", "sample", "population") in d
    assert ("objective.choices.std_kind", "sample", "population") in d
    assert {k.split(".")[0] for k in keys(d)} == {"config", "objective"}


def test_sampler_temperature_difference(tiny_model_dir, tokenizer, base):
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer, rollout={"temperature": 0.7}))
    assert d == [("config.rollout.temperature", 1.0, 0.7)]


def test_reward_weights_difference(tiny_model_dir, tokenizer, base):
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer, reward={"weights": {"correct": 1.0, "format": 0.0}}))
    assert d == [("config.reward.weights.format", 0.1, 0.0)]


def test_reward_code_hash_difference(tiny_model_dir, tokenizer, base, monkeypatch):
    monkeypatch.setattr(mf, "reward_code_hash", lambda: "f" * 64)
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer))
    assert d == [("hashes.reward_code", base["hashes"]["reward_code"], "f" * 64)]


def test_reward_code_hash_covers_the_reward_sources():
    root = Path(mf.__file__).parent / "rewards"
    assert mf.reward_code_hash() == mf.hash_files(root.glob("*.py"))
    assert mf.reward_code_hash() == mf.reward_code_hash()


def test_data_hash_difference(tiny_model_dir, tokenizer, base):
    task = make_task("arithmetic", num_train=20, num_test=10)
    train = task.problems("train")
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer, train=train[:-1]))
    assert keys(d) == {"hashes.train_data"}
    d = diff_manifests(base, manifest(tiny_model_dir, tokenizer, held_out=task.problems("test")[::-1]))
    assert keys(d) == {"hashes.held_out_data"}  # order is part of the data identity


def test_task_options_difference(tiny_model_dir, tokenizer, base):
    d = diff_manifests(
        base, manifest(tiny_model_dir, tokenizer, task={"options": {"num_train": 20, "num_test": 10, "seed": 1}})
    )
    assert {"config.task.options.seed", "hashes.train_data", "hashes.held_out_data"} == keys(d)


def _copy_model(src: str, dst: Path) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_model_weights_hash_difference(tiny_model_dir, tokenizer, tmp_path):
    path = _copy_model(tiny_model_dir, tmp_path / "m")
    a = manifest(path, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    model.save_pretrained(path)
    b = manifest(path, tokenizer)
    d = diff_manifests(a, b)
    assert keys(d) == {"hashes.model_weights"}


def test_tokenizer_hash_difference(tiny_model_dir, tokenizer, tmp_path):
    path = _copy_model(tiny_model_dir, tmp_path / "m")
    a = manifest(path, tokenizer)
    cfg_file = Path(path) / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_file.read_text())
    tok_cfg["model_max_length"] = 123
    cfg_file.write_text(json.dumps(tok_cfg))
    d = diff_manifests(a, manifest(path, tokenizer))
    assert keys(d) == {"hashes.tokenizer"}


def test_hash_model_dir_separates_weights_and_tokenizer(tiny_model_dir, tmp_path):
    h = hash_model_dir(tiny_model_dir)
    assert h["weights"] and h["tokenizer"] and h["weights"] != h["tokenizer"]
    assert hash_model_dir(str(tmp_path / "not-a-dir")) == {"weights": None, "tokenizer": None}


def test_chat_template_hash_difference(tiny_model_dir, tokenizer, base):
    other = AutoTokenizer.from_pretrained(tiny_model_dir)
    other.chat_template = (tokenizer.chat_template or "") + "{# changed #}"
    d = diff_manifests(base, manifest(tiny_model_dir, other))
    assert keys(d) == {"hashes.chat_template"}


def test_model_name_difference(base):
    other = copy.deepcopy(base)
    other["config"]["model"]["name"] = "Qwen/Qwen2.5-0.5B-Instruct"
    other["hashes"]["model_weights"] = None
    d = diff_manifests(base, other)
    assert keys(d) == {"config.model.name", "hashes.model_weights"}
    assert ("hashes.model_weights", base["hashes"]["model_weights"], None) in d


def test_versions_difference(base):
    other = copy.deepcopy(base)
    other["versions"]["torch"] = "0.0.1"
    assert diff_manifests(base, other) == [("versions.torch", base["versions"]["torch"], "0.0.1")]


def test_a_library_an_older_manifest_did_not_record_is_not_a_difference(base):
    """A run written before grpolab recorded reasoning-gym's version resumes and compares as before; a library
    recorded as not installed (None) against an installed version still differs."""
    older, uninstalled = copy.deepcopy(base), copy.deepcopy(base)
    del older["versions"]["reasoning-gym"]
    uninstalled["versions"]["reasoning-gym"] = None
    assert diff_manifests(older, base) == [] and diff_manifests(base, older) == []
    assert diff_manifests(uninstalled, base) == [("versions.reasoning-gym", None, base["versions"]["reasoning-gym"])]


def test_missing_section_and_field_show_as_none(base):
    other = copy.deepcopy(base)
    del other["objective"]
    del other["config"]["rollout"]["top_k"]
    d = diff_manifests(base, other)
    assert ("config.rollout.top_k", 0, None) in d
    assert ("objective.formula", base["objective"]["formula"], None) in d
    assert all(b is None for _, _, b in d)


def test_diff_is_sorted_and_symmetric(tiny_model_dir, tokenizer, base):
    other = manifest(tiny_model_dir, tokenizer, algorithm={"preset": "rloo"}, rollout={"temperature": 0.5})
    ab, ba = diff_manifests(base, other), diff_manifests(other, base)
    assert [k for k, _, _ in ab] == sorted(k for k, _, _ in ab)
    assert ab == [(k, b, a) for k, a, b in ba]


# --------------------------------------------------------------------------------------------- CLI


def _grpolab() -> str:
    exe = Path(sys.executable).parent / "grpolab"
    return str(exe) if exe.is_file() else (shutil.which("grpolab") or "grpolab")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([_grpolab(), *args], capture_output=True, text=True, timeout=120, env=env)


def _write_run(d: Path, m: dict) -> Path:
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_cli_manifest_diff(tiny_model_dir, tokenizer, base, tmp_path):
    other = manifest(
        tiny_model_dir, tokenizer, rollout={"temperature": 0.7}, algorithm={"beta": 0.0}, run={"name": "b"}
    )
    a, b = _write_run(tmp_path / "a", base), _write_run(tmp_path / "b", other)
    out = _cli("manifest", "diff", str(a), str(b))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    temp = [line for line in lines if "config.rollout.temperature" in line]
    assert len(temp) == 1 and "1.0" in temp[0] and "0.7" in temp[0]
    beta = [line for line in lines if "config.algorithm.beta" in line]
    assert len(beta) == 1 and "0.04" in beta[0] and "0.0" in beta[0]
    assert "config.run.name" not in out.stdout
    assert "hashes." not in out.stdout


def test_cli_manifest_diff_identical(base, tmp_path):
    a, b = _write_run(tmp_path / "a", base), _write_run(tmp_path / "b", copy.deepcopy(base))
    out = _cli("manifest", "diff", str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert "no semantic differences" in out.stdout


# --------------------------------------------------------------------------------------------- once-bugs (regressions)


def test_cli_manifest_diff_missing_manifest_is_a_clean_error(base, tmp_path):
    a = _write_run(tmp_path / "a", base)
    (tmp_path / "empty").mkdir()
    out = _cli("manifest", "diff", str(a), str(tmp_path / "empty"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert "manifest.json" in out.stdout + out.stderr


def test_git_commit_difference_shows(base):
    other = copy.deepcopy(base)
    other["git"] = {"commit": "1" * 40, "dirty": True}
    assert {"git.commit", "git.dirty"} <= keys(diff_manifests(base, other))
