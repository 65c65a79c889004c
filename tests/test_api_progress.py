"""The Python API is not silent on long work: by default grpolab.train prints the trainer's phases and one line per
step (reward, loss, entropy, step time) to stderr, and evaluate_models one line per batch; verbose=False prints
nothing. stdout stays the caller's."""

from __future__ import annotations

import json

import pytest

import grpolab
from tests.test_bad_input import base

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def no_library_bars():
    """transformers' own "Loading weights" bars (tqdm, stderr) are not grpolab's output."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    yield
    if was_on:
        logging.enable_progress_bar()


def test_train_prints_phases_and_step_lines_to_stderr_by_default(tiny_model_dir, tmp_path, capsys):
    cfg = base(tiny_model_dir, tmp_path)
    cfg["train"]["steps"] = 2
    result = grpolab.train(cfg, run_dir=tmp_path / "runs" / "loud")
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    steps = [line for line in lines if line.startswith("step ") and "s/step" in line]
    assert [line.split("  ")[0] for line in steps] == ["step 1/2", "step 2/2"], out.err
    history = result.history()
    for line, m in zip(steps, history):
        assert f"reward {m['reward/mean']:.3f}" in line and f"loss {m['loss/total']:+.4f}" in line, line
    first_step = lines.index(steps[0])
    assert first_step >= 1, "a phase line (the model load) comes before the first step line: " + out.err


def test_train_and_evaluate_are_silent_with_verbose_false(tiny_model_dir, tmp_path, capsys, caplog):
    """Silent includes the libraries' own bars (transformers' "Loading weights"): turned off for the call and back
    on after it."""
    from transformers.utils import logging

    logging.enable_progress_bar()
    result = grpolab.train(base(tiny_model_dir, tmp_path), run_dir=tmp_path / "runs" / "quiet", verbose=False)
    grpolab.evaluate_models(
        [tiny_model_dir], options={"num_train": 20, "num_test": 10}, limit=2, max_new_tokens=2, verbose=False
    )
    out = capsys.readouterr()
    # only a warning about the run may show (the tiny model cuts every completion at 3 tokens): the "grpolab"
    # logger's, which verbose does not govern (where it shows is logging's configuration: pytest's or the CLI's)
    assert out.out == "" and all(line.startswith("warning: step 1") for line in out.err.splitlines()), out.err
    assert [r.getMessage()[:7] for r in caplog.records if r.name == "grpolab"] == ["step 1:"]
    assert result.steps == 1
    assert logging.is_progress_bar_enabled(), "the caller's setting is restored"
    grpolab.evaluate_models([tiny_model_dir], options={"num_train": 20, "num_test": 10}, limit=2, max_new_tokens=2)
    assert "Loading weights" in capsys.readouterr().err, "with the bars on, the load shows one (the test can fail)"


def test_evaluate_models_prints_one_line_per_batch_and_writes_into_new_folders(tiny_model_dir, tmp_path, capsys):
    out_path = tmp_path / "new" / "folder" / "e.json"
    grpolab.evaluate_models(
        [tiny_model_dir],
        options={"num_train": 20, "num_test": 10},
        limit=4,
        max_new_tokens=2,
        batch_size=2,
        out=out_path,
    )
    err = capsys.readouterr().err.splitlines()
    assert err == [f"eval {tiny_model_dir} greedy: {n}/4 problems" for n in (2, 4)]
    assert json.loads(out_path.read_text())["n"] == 4
