"""`grpolab train` and `grpolab score` end to end on the tiny model: the commands `train --seeds` suggests run and
exit 0, `--resume` with `--seeds` is refused, the step line carries loss / KL / entropy, and `score --reward-from RUN`
scores with the run's own custom reward."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from grpolab.cli.train import step_line
from grpolab.config import from_dict, to_dict
from tests.test_bad_input import base, config_file
from tests.test_cli_usage import assert_one_error, cli_main

pytestmark = pytest.mark.usefixtures("one_thread")


def suggested_commands(output: str) -> list[list[str]]:
    """The `grpolab ...` commands printed after `train --seeds`, as argument lists without the program name."""
    return [shlex.split(line.split(": ", 1)[1])[1:] for line in output.splitlines() if ": grpolab " in line]


@pytest.mark.parametrize("every_steps", [0, 1])
def test_the_commands_suggested_after_seeds_work(tiny_model_dir, tmp_path, monkeypatch, capsys, every_steps):
    cfg = base(tiny_model_dir, tmp_path)
    cfg["eval"] = {"every_steps": every_steps, "num_problems": 4, "batch_size": 8}
    code, output = cli_main(monkeypatch, capsys, "train", config_file(tmp_path, cfg), "--seeds", "1,2")
    assert code == 0, output
    commands = suggested_commands(output)
    assert [c[0] for c in commands] == (["compare"] if every_steps else ["eval", "compare"]), output
    for command in commands:
        code, out = cli_main(monkeypatch, capsys, *command)
        assert code == 0, (command, out)
    if not every_steps:  # the eval covers the base and both seeds on the run's own held-out task and length
        evaluation = json.loads(Path(commands[0][commands[0].index("--out") + 1]).read_text())
        assert [row["model"] for row in evaluation["models"]] == [
            tiny_model_dir,
            *(str(tmp_path / "runs" / f"bad-seed{s}") for s in (1, 2)),
        ]
        assert (
            evaluation["n"] == 10
            and evaluation["max_new_tokens"] == 3
            and evaluation["task_options"] == cfg["task"]["options"]
        )


def test_resume_with_seeds_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "manifest.json").write_text("{}")
    assert_one_error(
        *cli_main(monkeypatch, capsys, "train", "--resume", tmp_path, "--seeds", "1,2"),
        "--seeds starts one new run per seed and cannot be combined with --resume RUN_DIR",
    )


def test_from_intact_reaches_resume_run_and_needs_resume(tmp_path, monkeypatch, capsys):
    from grpolab import runs
    from grpolab.errors import GrpolabError

    seen = {}

    def fake_resume_run(run_dir, overrides, allow_changes, **kwargs):
        seen.update(kwargs, run_dir=run_dir, allow_changes=allow_changes)
        raise GrpolabError("stop here")

    monkeypatch.setattr(runs, "resume_run", fake_resume_run)
    assert_one_error(*cli_main(monkeypatch, capsys, "train", "--resume", tmp_path, "--from-intact"), "stop here")
    assert seen["from_intact"] is True and seen["allow_changes"] is False and callable(seen["progress"])
    assert_one_error(
        *cli_main(monkeypatch, capsys, "train", "--from-intact"), "--from-intact only applies with --resume"
    )


def test_step_line_shows_loss_kl_entropy_and_time():
    m = {"reward/mean": 0.25, "loss/total": 0.0312, "policy/kl": 0.0051, "policy/entropy": 1.234, "time/step_s": 3.0}
    assert step_line(2, 10, m, None) == "step 2/10  reward 0.250  loss +0.0312  entropy 1.234  3.0s/step"
    assert (
        step_line(2, 10, m, 0.5, show_kl=True)
        == "step 2/10  reward 0.250  loss +0.0312  kl 0.0051  entropy 1.234  held-out 0.500  3.0s/step"
    )


def test_the_step_lines_of_a_real_run_carry_the_loss(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """... and the trainer's phase lines reach the console before the first step (the model load among them)."""
    import grpolab.cli.train as train_cli

    phases: list[str] = []
    shown = train_cli.show_progress
    monkeypatch.setattr(train_cli, "show_progress", lambda message: (phases.append(message), shown(message)))
    cfg = base(tiny_model_dir, tmp_path)
    cfg["algorithm"]["beta"] = 0.04
    code, output = cli_main(monkeypatch, capsys, "train", config_file(tmp_path, cfg))
    assert code == 0, output
    assert phases and all(p in output for p in phases), (phases, output)
    assert output.index(phases[0]) < output.index("step 1/1"), output
    line = next(x for x in output.splitlines() if x.startswith("step 1/1  reward"))
    metrics = json.loads((tmp_path / "runs" / "bad" / "metrics.jsonl").read_text().splitlines()[0])
    assert f"loss {metrics['loss/total']:+.4f}" in line and f"kl {metrics['policy/kl']:.4f}" in line, line
    assert f"entropy {metrics['policy/entropy']:.3f}" in line, line


def test_eval_progress_counts_each_models_own_time():
    from grpolab.cli.evaluate import model_clock

    ticks = iter([100.0, 103.0, 110.0, 111.0, 150.0, 152.0])
    seconds = model_clock(["base", "runs/a"], lambda: next(ticks))
    # base reports at 103 and 110; runs/a (loaded after base's last batch at 110) at 111, 150 and 152
    assert [
        seconds(w) for w in ("base greedy", "base greedy", "runs/a greedy", "runs/a greedy", "runs/a 4 samples")
    ] == [3.0, 10.0, 1.0, 40.0, 42.0]


# ------------------------------------------------------------------------------------------- score --reward-from


def run_with_custom_reward(tmp_path: Path, python_rewards: list[str] | None = None) -> Path:
    """A run directory whose manifest records a custom reward `shortness` from a file (only what score reads)."""
    (tmp_path / "my_rewards.py").write_text(
        "def shortness(completion, problem):\n    return 1.0 / (1 + len(completion))\n"
    )
    cfg = from_dict(
        {
            "reward": {
                "weights": {"correct": 1.0, "shortness": 0.5},
                "functions": {"shortness": f"{tmp_path / 'my_rewards.py'}:shortness"},
            }
        }
    )
    run = tmp_path / "run"
    run.mkdir()
    manifest = {"config": to_dict(cfg), **({"python_rewards": python_rewards} if python_rewards else {})}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_score_reward_from_uses_the_runs_custom_reward(tmp_path, monkeypatch, capsys):
    from grpolab.tasks import make_task

    problem = make_task("arithmetic").problems("test")[0]
    rows = tmp_path / "rows.jsonl"
    completion = f"\\boxed{{{problem.answer}}}"
    rows.write_text(json.dumps({"id": problem.uid, "completion": completion}) + "\n")
    out = tmp_path / "scores" / "s.json"
    code, output = cli_main(
        monkeypatch, capsys, "score", rows, "--reward-from", run_with_custom_reward(tmp_path), "--json-out", out
    )
    assert code == 0, output
    row = json.loads(out.read_text())["rows"][0]
    shortness = 1.0 / (1 + len(completion))
    assert row["components"] == {"correct": 1.0, "shortness": pytest.approx(shortness, abs=1e-12)}
    assert row["reward"] == pytest.approx(1.0 + 0.5 * shortness, abs=1e-12)


def test_score_reward_from_a_run_with_python_callables_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from grpolab.tasks import make_task

    problem = make_task("arithmetic").problems("test")[0]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": problem.uid, "completion": "1"}) + "\n")
    run = run_with_custom_reward(tmp_path, python_rewards=["brevity"])
    assert_one_error(
        *cli_main(monkeypatch, capsys, "score", rows, "--reward-from", run),
        "the run was trained with Python reward callables (brevity)",
    )
