"""Every command-line mistake is one clear line and exit code 2, checked before any model runs: typer's usage errors
(typer ships its own click), `--version`, eval / best-of-n / report / score / export options out of range, unknown
dtypes, reward weights that are not numbers, and outputs that cannot be written (checked before the work that fills
them). The models are never loaded for a refused command: evaluation is replaced by a tripwire."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_bad_input import cli_main

import grpolab

GRPOLAB = Path(sys.executable).with_name("grpolab")


def assert_one_error(code: int, output: str, *expected: str) -> None:
    """Exit 2, no traceback, one `error:` line (at most the usage line besides), naming what was expected."""
    assert code == 2, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert sum(line.startswith("error:") for line in lines) == 1, output
    assert len(lines) <= 2 and all(line.startswith(("error:", "Usage:")) for line in lines), output
    for text in expected:
        assert text in output, (text, output)


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fail the test if any model is evaluated or loaded: a refused command must stop before that."""

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was evaluated or loaded before the command's input was checked")

    monkeypatch.setattr("grpolab.evaluation.heldout.run_eval", tripwire)
    monkeypatch.setattr("grpolab.evaluation.heldout.evaluate_model", tripwire)
    monkeypatch.setattr("grpolab.models.load.load_causal_lm", tripwire)


# ------------------------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, expected",
    [
        (["eval", "m", "--no-such-option"], "No such option: --no-such-option"),
        (["eval"], "Missing argument"),
        (["eval", "m", "--limit", "abc"], "Invalid value for '--limit'"),
        (["train", "--seeds"], "Option '--seeds' requires an argument"),
        (["no-such-verb"], "No such command 'no-such-verb'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(monkeypatch, capsys, args, expected):
    assert_one_error(*cli_main(monkeypatch, capsys, *args), expected)


def test_version_prints_the_package_version(monkeypatch, capsys):
    code, output = cli_main(monkeypatch, capsys, "--version")
    assert (code, output.strip()) == (0, f"grpolab {grpolab.__version__}")


def test_usage_error_in_a_real_process_has_no_traceback():
    res = subprocess.run([str(GRPOLAB), "--no-such-option"], capture_output=True, text=True, timeout=120)
    assert_one_error(res.returncode, res.stdout + res.stderr, "No such option: --no-such-option")


# ------------------------------------------------------------------------------------------- eval options


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--limit", "-3", "--limit: expected an integer >= 0 (0 = all problems), got -3"),
        ("--max-new-tokens", "0", "--max-new-tokens: expected an integer >= 1, got 0"),
        ("--samples", "-1", "--samples: expected an integer >= 0 (0 = greedy only), got -1"),
        ("--temperature", "-1", "--temperature: expected a finite number > 0, got -1.0"),
        ("--temperature", "inf", "--temperature: expected a finite number > 0, got inf"),
        ("--batch-size", "0", "--batch-size: expected an integer >= 1, got 0"),
        ("--top-p", "0", "--top-p: expected a number in (0, 1], got 0.0"),
        ("--dtype", "float16", "--dtype: expected one of float32, bfloat16, got 'float16'"),
    ],
)
def test_eval_refuses_out_of_range_options(monkeypatch, capsys, no_evaluation, option, value, expected):
    assert_one_error(*cli_main(monkeypatch, capsys, "eval", "bundled:smollm2-135m-instruct", option, value), expected)


def test_best_of_n_refuses_bad_n_dtype_and_weights(monkeypatch, capsys, no_evaluation):
    args = ["baseline", "best-of-n", "m"]
    assert_one_error(*cli_main(monkeypatch, capsys, *args, "--n", "0"), "--n: expected an integer >= 1, got 0")
    assert_one_error(*cli_main(monkeypatch, capsys, *args, "--dtype", "fp8"), "--dtype: expected one of float32")
    assert_one_error(
        *cli_main(monkeypatch, capsys, *args, "--reward-weight", "correct=abc"),
        "--reward-weight correct: expected a finite number, got 'abc'",
    )


def test_report_refuses_an_unknown_dtype_before_reading_the_run(monkeypatch, capsys, tmp_path):
    assert_one_error(
        *cli_main(monkeypatch, capsys, "report", tmp_path, "--dtype", "fp8"),
        "--dtype: expected one of float32, bfloat16, got 'fp8'",
    )


def test_export_refuses_an_unknown_dtype(monkeypatch, capsys, tmp_path):
    assert_one_error(
        *cli_main(monkeypatch, capsys, "export", tmp_path, "--out", tmp_path / "x", "--dtype", "half"),
        "--dtype: expected one of float32, bfloat16, got 'half'",
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--n", "-1"], "--n: expected an integer >= 0 (0 = every problem the evaluation had), got -1"),
        (["--rollback-n", "0"], "--rollback-n: expected an integer >= 1, got 0"),
        (["--dtype", "fp16"], "--dtype: expected one of float32, bfloat16, got 'fp16'"),
    ],
)
def test_release_refuses_bad_options_before_building_the_bundle(monkeypatch, capsys, tmp_path, args, expected):
    def tripwire(*a, **k):
        raise AssertionError("the bundle was written before the options were checked")

    monkeypatch.setattr("grpolab.serving.bundle.write_release", tripwire)
    assert_one_error(*cli_main(monkeypatch, capsys, "release", tmp_path, *args), expected)


def test_score_refuses_a_weight_that_is_not_a_number(monkeypatch, capsys, tmp_path):
    from grpolab.tasks import make_task

    rows = tmp_path / "rows.jsonl"

    uid = make_task("arithmetic").problems("test")[0].uid
    rows.write_text(json.dumps({"id": uid, "completion": "\\boxed{1}"}) + "\n")
    assert_one_error(
        *cli_main(monkeypatch, capsys, "score", rows, "--reward-weight", "correct=abc"),
        "--reward-weight correct: expected a finite number, got 'abc'",
    )


def test_eval_checks_every_models_chat_template_before_evaluating_any(
    monkeypatch, capsys, tiny_model_dir, tmp_path, no_evaluation
):
    from tests.test_bad_input import no_chat_template

    bare = no_chat_template(tiny_model_dir, tmp_path)
    assert_one_error(
        *cli_main(monkeypatch, capsys, "eval", tiny_model_dir, bare, "--limit", "2"), "has no chat template"
    )


def test_api_evaluate_models_checks_its_arguments_first(no_evaluation, tmp_path):
    from grpolab.errors import OutputError

    with pytest.raises(grpolab.errors.ConfigError, match=r"^limit: expected an integer >= 0"):
        grpolab.evaluate_models(["m"], limit=-3)
    with pytest.raises(grpolab.errors.ConfigError, match=r"^dtype: expected one of float32, bfloat16, got 'float16'"):
        grpolab.evaluate_models(["m"], dtype="float16")
    with pytest.raises(OutputError, match="is a directory"):
        grpolab.evaluate_models(["m"], out=tmp_path)


# ------------------------------------------------------------------------------------------- outputs


def test_eval_out_is_checked_before_the_evaluation(monkeypatch, capsys, tmp_path, no_evaluation):
    model = "bundled:smollm2-135m-instruct"
    assert_one_error(
        *cli_main(monkeypatch, capsys, "eval", model, "--out", tmp_path),
        f"--out: {tmp_path} is a directory; expected a file path",
    )
    (tmp_path / "file").write_text("x")
    assert_one_error(
        *cli_main(monkeypatch, capsys, "eval", model, "--out", tmp_path / "file" / "r.json"),
        f"--out: {tmp_path / 'file'} is a file; expected a directory",
    )


def read_only_filesystem(monkeypatch) -> None:
    """Every new file fails as on a read-only mount (EROFS): tests run as root, whom chmod does not stop."""

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)


def test_writable_checks(monkeypatch, tmp_path):
    from grpolab.errors import OutputError, writable_dir, writable_file

    target = writable_file(tmp_path / "new" / "deeper" / "r.json", "--out")
    assert target.parent.is_dir() and not target.exists()  # parents created, nothing written
    assert writable_dir(tmp_path / "d", "x") == tmp_path / "d" and list((tmp_path / "d").iterdir()) == []
    read_only_filesystem(monkeypatch)
    with pytest.raises(OutputError, match=r"^--out: cannot write into .* \(Read-only file system\)$"):
        writable_file(tmp_path / "r.json", "--out")


def test_eval_into_a_read_only_place_fails_before_evaluating(monkeypatch, capsys, tmp_path, no_evaluation):
    read_only_filesystem(monkeypatch)
    assert_one_error(
        *cli_main(monkeypatch, capsys, "eval", "bundled:smollm2-135m-instruct", "--out", tmp_path / "r.json"),
        "--out: cannot write into",
        "Read-only file system",
    )


def test_train_resume_report_export_into_a_read_only_place(monkeypatch, capsys, tmp_path, tiny_model_dir):
    from tests.test_bad_input import base, config_file

    cfg = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    read_only_filesystem(monkeypatch)
    assert_one_error(*cli_main(monkeypatch, capsys, "train", cfg), "run.output_dir: cannot write into")
    assert_one_error(*cli_main(monkeypatch, capsys, "train", "--resume", run), "--resume: cannot write into")
    assert_one_error(*cli_main(monkeypatch, capsys, "report", run), f"report {run}: cannot write into")
    assert_one_error(
        *cli_main(monkeypatch, capsys, "export", run, "--out", tmp_path / "exported"), "--out: cannot write into"
    )


def test_api_train_and_report_into_a_read_only_place(monkeypatch, tmp_path, tiny_model_dir, no_evaluation):
    from grpolab.errors import OutputError
    from tests.test_bad_input import base

    run = tmp_path / "run"
    run.mkdir()
    read_only_filesystem(monkeypatch)
    with pytest.raises(OutputError, match="^run.output_dir: cannot write into .*Read-only file system"):
        grpolab.train(base(tiny_model_dir, tmp_path), verbose=False)
    with pytest.raises(OutputError, match="^run_dir: cannot write into .*Read-only file system"):
        grpolab.release_report(run, verbose=False)
    with pytest.raises(grpolab.errors.ConfigError, match=r"^dtype: expected one of float32, bfloat16, got 'fp8'"):
        grpolab.release_report(run, dtype="fp8", verbose=False)
