"""Bad input gets one clear message, no traceback and exit code 2, through the real `grpolab train` entry point
(a subprocess for a few cases, grpolab.cli.main in this process for the rest), and no run directory is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpolab import cli

GRPOLAB = Path(sys.executable).with_name("grpolab")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")


def base(model_dir: str, out: Path) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 10}},
        "rollout": {"group_size": 4, "max_new_tokens": 3, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0},
        "train": {"steps": 1, "prompts_per_step": 2, "micro_batch_size": 8, "samples_per_step": 1},
        "run": {"output_dir": str(out / "runs"), "name": "bad"},
    }


def config_file(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli_main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """(exit code, stdout + stderr) of grpolab.cli.main with these arguments."""
    monkeypatch.setattr(sys, "argv", ["grpolab", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_clear_failure(code: int, output: str, *expected: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    assert output.count("error:") == 1, output
    for text in expected:
        assert text in output, (text, output)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "train.stpes=3"], ["unknown field 'train.stpes'; did you mean 'train.steps'?"]),
        (["--set", "model.name=/no/such/model"], ["model.name: /no/such/model is not a model directory"]),
    ],
)
def test_subprocess(tiny_model_dir, tmp_path, args, expected):
    config = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    res = subprocess.run(
        [str(GRPOLAB), "train", str(config), *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert_clear_failure(res.returncode, res.stdout + res.stderr, *expected)
    assert not (tmp_path / "runs" / "bad").exists()


def jsonl_task(cfg: dict, path: Path) -> dict:
    return {**cfg, "task": {"name": "jsonl", "options": {"path": str(path)}}}


def gsm8k_task(cfg: dict, tmp_path: Path, bad: int, max_bad: float) -> dict:
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(10 - bad)]
    rows += [{"question": "No gold here", "answer": "forgot the marker"}] * bad
    (tmp_path / "gsm").mkdir(exist_ok=True)
    (tmp_path / "gsm" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {**cfg, "task": {"name": "gsm8k", "options": {"path": str(tmp_path / "gsm"), "max_bad_fraction": max_bad}}}


def no_chat_template(model_dir: str, tmp_path: Path) -> str:
    copy = tmp_path / "no-template"
    shutil.copytree(model_dir, copy)
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((copy / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(tc))
    return str(copy)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


CASES = {
    "group_size": (
        lambda cfg, t, m: cfg,
        ["--set", "rollout.group_size=1"],
        "rollout.group_size: expected an integer >= 2",
    ),
    "eps": (
        lambda cfg, t, m: cfg,
        ["--set", "algorithm.eps_low=-0.1"],
        "algorithm.eps_low: expected a number in [0, 1)",
    ),
    "wrong_type": (
        lambda cfg, t, m: cfg,
        ["--set", "train.steps=many"],
        "train.steps: expected an integer, got 'many'",
    ),
    "max_nonfinite": (
        lambda cfg, t, m: cfg,
        ["--set", "train.max_nonfinite_steps=0"],
        "train.max_nonfinite_steps: expected an integer >= 1, got 0",
    ),
    "missing_data": (lambda cfg, t, m: jsonl_task(cfg, t / "nope.jsonl"), [], "nope.jsonl: file not found"),
    "malformed_row": (
        lambda cfg, t, m: jsonl_task(
            cfg, write(t / "rows.jsonl", b'{"question": "1+1", "answer": "2"}\n{"question": \n')
        ),
        [],
        "rows.jsonl:2: malformed JSON",
    ),
    "unreadable_data": (
        lambda cfg, t, m: jsonl_task(cfg, write(t / "binary.jsonl", b"\xff\xfe\x00garbage\n")),
        [],
        "binary.jsonl: cannot read the task data (UnicodeDecodeError",
    ),
    "too_many_bad_rows": (
        lambda cfg, t, m: gsm8k_task(cfg, t, bad=3, max_bad=0.2),
        [],
        "3 of 10 rows have no usable gold answer",
    ),
    "no_chat_template": (
        lambda cfg, t, m: {**cfg, "model": {"name": no_chat_template(m, t)}},
        [],
        "has no chat template",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_cli_main(tiny_model_dir, tmp_path, monkeypatch, capsys, case):
    edit, args, expected = CASES[case]
    config = config_file(tmp_path, edit(base(tiny_model_dir, tmp_path), tmp_path, tiny_model_dir))
    assert_clear_failure(*cli_main(monkeypatch, capsys, "train", config, *args), expected)
    assert not (tmp_path / "runs" / "bad").exists()


def test_missing_config_file_and_misused_resume_flags(tmp_path, monkeypatch, capsys):
    assert_clear_failure(*cli_main(monkeypatch, capsys, "train", tmp_path / "nope.yaml"), "config file not found")
    assert_clear_failure(
        *cli_main(monkeypatch, capsys, "train", "--resume", tmp_path), "not a run directory (no manifest.json)"
    )
    (tmp_path / "manifest.json").write_text("{}")
    assert_clear_failure(
        *cli_main(monkeypatch, capsys, "train", tmp_path / "c.yaml", "--resume", tmp_path),
        "--resume RUN_DIR reads its config from RUN_DIR/manifest.json",
    )
    assert_clear_failure(
        *cli_main(monkeypatch, capsys, "train", "--allow-changes"), "--allow-changes only applies with --resume"
    )
    (tmp_path / "manifest.json").write_text("{not json")
    assert_clear_failure(*cli_main(monkeypatch, capsys, "train", "--resume", tmp_path), "manifest.json")


def test_rows_without_gold_are_skipped_with_a_summary(tiny_model_dir, tmp_path, monkeypatch, capsys):
    cfg = gsm8k_task(base(tiny_model_dir, tmp_path), tmp_path, bad=1, max_bad=0.2)
    code, output = cli_main(monkeypatch, capsys, "train", config_file(tmp_path, cfg))
    assert code == 0, output
    assert "train 9 problems (1 row without a usable gold answer skipped)" in output
    manifest = json.loads((tmp_path / "runs" / "bad" / "manifest.json").read_text())
    assert manifest["data"] == {"train_problems": 9, "train_skipped": 1}


def test_seeds_run_once_per_seed_and_reject_bad_lists(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """--seeds 1,2 writes one run directory per seed, each recording its seed; a malformed list is a clear error."""
    config = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    code, output = cli_main(monkeypatch, capsys, "train", config, "--seeds", "1,2")
    assert code == 0, output
    manifests = {s: json.loads((tmp_path / "runs" / f"bad-seed{s}" / "manifest.json").read_text()) for s in (1, 2)}
    assert [manifests[s]["config"]["train"]["seed"] for s in (1, 2)] == [1, 2]
    assert "grpolab compare" in output
    samples = [(tmp_path / "runs" / f"bad-seed{s}" / "samples.jsonl").read_text() for s in (1, 2)]
    assert samples[0] != samples[1], "different seeds must sample different completions"
    assert_clear_failure(*cli_main(monkeypatch, capsys, "train", config, "--seeds", "1,x"), "--seeds: expected")
