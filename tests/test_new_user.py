"""What a new user meets first (issue 59, "tried as a new user would"): an error names the field to set, by its full
path (task.options.num_train, distill.teacher), before any model loads; a staleness bound at or above the steps is
refused; the objective's formula is printed the same on a console, a pipe and in the manifest; `grpolab card` prints
a run's or a config's objective card."""

from __future__ import annotations

import ast
import io
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from test_bad_input import base, cli_main, config_file
from test_cli_usage import assert_one_error

from grpolab.card import objective_card
from grpolab.cli import named_as_given
from grpolab.config import from_dict, load_config
from grpolab.errors import ConfigError
from grpolab.tasks import TASKS, make_task

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if any model or tokenizer is loaded: the refused input must be found before that."""

    import grpolab.runs  # noqa: F401  (imports the trainer first, so the names patched below are the ones it calls)

    def tripwire(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded before the input was checked")

    for target in (
        "transformers.AutoModelForCausalLM.from_pretrained",
        "transformers.AutoTokenizer.from_pretrained",
        "grpolab.training.trainer.load_policy",
        "grpolab.training.estimators.load_teacher",
    ):
        monkeypatch.setattr(target, tripwire)


# ------------------------------------------------------------------------------- task options: the full path


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "task.options.size=0"], "task.options.size: unknown option for task 'arithmetic'; accepted:"),
        (["--set", "task.options.min_terms=2"], "task.options.min_terms: unknown option for task 'arithmetic'"),
        (["--set", "task.options.num_train=0"], "task.options.num_train: expected an integer >= 1, got 0"),
        (
            ["--set", "task.name=pyfunc", "--set", "task.options.levels=7"],
            "task.options.levels: expected a comma-separated subset of 1, 2, 3, got 7",
        ),
    ],
)
def test_task_option_errors_name_the_field_to_set(
    tiny_model_dir, tmp_path, monkeypatch, capsys, no_model_loads, args, expected
):
    config = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    code, output = cli_main(monkeypatch, capsys, "train", config, *args)
    assert_one_error(code, output, expected)
    for path in re.findall(r"\btask\.[\w.]+", output):  # every field the message names is one the user can set
        assert path == "task.name" or path.startswith("task.options."), output


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_names_an_unknown_option_by_its_full_path(name):
    with pytest.raises(ConfigError, match=r"^task\.options\.no_such_option: unknown option for task"):
        make_task(name, no_such_option=1)


def _error_texts(path: Path) -> list[str]:
    """The literal text of every `...Error(...)` call's arguments in a module (f-string parts joined)."""
    texts = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Error"):
            for arg in ast.walk(node):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    texts.append(arg.value)
    return texts


def test_no_task_error_names_a_field_outside_task_options():
    """task.X is not a field (TaskConfig has name and options): a message naming it sends the user to an unknown
    field, as `task.num_train` did."""
    files = sorted((ROOT / "grpolab" / "tasks").glob("*.py")) + sorted((ROOT / "grpolab" / "agents").glob("*.py"))
    wrong = [
        (f.name, text)
        for f in files
        for text in _error_texts(f)
        if re.search(r"\btask\.(?!options\b|name\b)[a-z_{]", text)
    ]
    assert not wrong, wrong


def test_options_given_as_fields_are_named_as_fields(tmp_path):
    """grpolab.train(problems=<a datasets.Dataset>, fields={...}): task hf's errors name fields['X'], what was given."""
    datasets = pytest.importorskip("datasets")
    from grpolab.training.builders import in_memory_problems

    data = datasets.Dataset.from_dict({"prompt": ["1 + 1?"], "gold": ["2"]})
    with pytest.raises(ConfigError, match=r"^fields\['prompt_field'\]: no field 'question'"):
        in_memory_problems(from_dict({}), data, fields={"prompt_field": "question"})


# ------------------------------------------------------------------------------------------ distill.teacher


def test_a_missing_teacher_is_named_before_any_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, capsys, no_model_loads
):
    config = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    missing = tmp_path / "no-such-teacher"
    args = ["--set", "algorithm.estimator=distill", "--set", f"distill.teacher={missing}"]
    code, output = cli_main(monkeypatch, capsys, "train", config, *args)
    assert_one_error(code, output, f"distill.teacher: {missing} is not a model directory")
    assert "model.name" not in output
    assert not (tmp_path / "runs" / "bad").exists()


def test_a_teacher_run_without_checkpoints_is_named_before_any_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, capsys, no_model_loads
):
    run = tmp_path / "teacher-run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    config = config_file(tmp_path, base(tiny_model_dir, tmp_path))
    args = ["--set", "algorithm.estimator=distill", "--set", f"distill.teacher={run}"]
    code, output = cli_main(monkeypatch, capsys, "train", config, *args)
    assert_one_error(code, output, f"distill.teacher: {run}: run directory has no complete checkpoint")


# ---------------------------------------------------------------------------------------------- staleness


def test_a_staleness_bound_at_or_above_the_steps_is_refused_naming_both_fields():
    given = ["rollout.engine=grpolab_process", "algorithm.is_mode=token_truncate", "train.steps=2"]
    for bound in (1000000, 2):
        with pytest.raises(ConfigError) as e:
            load_config(None, [*given, f"rollout.max_staleness={bound}"])
        assert str(e.value).startswith("rollout.max_staleness: expected < train.steps (2) with asynchronous"), e
        assert str(e.value).split(": every batch")[0].endswith(f"got {bound}"), e
    assert load_config(None, [*given, "rollout.max_staleness=1"]).rollout.max_staleness == 1


# ------------------------------------------------------------------------------- the formula, printed whole


@pytest.mark.parametrize("preset", ["icepop", "grpo", "gmpo"])
@pytest.mark.parametrize("terminal", [False, True])
def test_the_formula_prints_as_the_manifest_stores_it(monkeypatch, preset, terminal):
    """On a narrow pipe and a narrow terminal (no colours) alike: one line, the formula's characters unchanged (its
    [token_mask] is not read as markup, no line break mid-expression)."""
    import grpolab.cli  # noqa: F401  (grpolab.cli.app is the module; the package's attribute `app` is the Typer app)

    cli_app = sys.modules["grpolab.cli.app"]
    formula = objective_card(from_dict({"algorithm": {"preset": preset}}))["formula"]
    buf = io.StringIO()
    console = Console(file=buf, width=40, force_terminal=terminal, color_system=None)
    monkeypatch.setattr(cli_app, "console", console)
    cli_app.print_plain(formula, label="objective")
    assert buf.getvalue() == f"objective {formula}\n"


def _choices(output: str) -> dict[str, str]:
    """The card's choices as printed: the lines indented by exactly two spaces."""
    return dict(x[2:].split(": ", 1) for x in output.splitlines() if x.startswith("  ") and x[2] != " " and ": " in x)


@pytest.mark.parametrize("preset, is_mode", [("icepop", "token_mask"), ("grpo", "none")])
def test_train_and_card_print_the_manifest_formula(tiny_model_dir, tmp_path, monkeypatch, capsys, preset, is_mode):
    cfg = base(tiny_model_dir, tmp_path)
    cfg["algorithm"]["preset"] = preset
    config = config_file(tmp_path, cfg)
    code, output = cli_main(monkeypatch, capsys, "train", config)
    assert code == 0, output
    run = tmp_path / "runs" / "bad"
    card = json.loads((run / "manifest.json").read_text())["objective"]
    assert f"objective {card['formula']}" in output.splitlines(), output  # stdout here is a pipe, not a terminal

    code, output = cli_main(monkeypatch, capsys, "card", run)
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == f"objective card of the run {run}"
    assert f"formula: {card['formula']}" in lines and f"latex: {card['formula_latex']}" in lines, output
    assert f"preset: {preset}" in lines, output
    assert {k: _choices(output)[k] for k in ("is_mode", "surrogate")} == {"is_mode": is_mode, "surrogate": "ppo_clip"}
    assert len(_choices(output)) > 40 and _choices(output)["staleness"].startswith("synchronous"), output
    for peer in ("trl (trl ", "verl (verl ", "openrlhf (openrlhf "):
        assert any(line.startswith(f"  {peer}") for line in lines), (peer, output)
    assert any(x.startswith("    advantage: exact  algorithm.adv_estimator=grpo") for x in lines), output

    code, output = cli_main(monkeypatch, capsys, "card", config)  # the config's card: the same formula, no run
    assert code == 0, output
    assert f"formula: {card['formula']}" in output.splitlines(), output
    code, output = cli_main(monkeypatch, capsys, "card", run, "--json")
    assert code == 0 and json.loads(output) == card, output


def test_card_of_a_config_loads_no_model(tmp_path, monkeypatch, capsys, no_model_loads):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "no/such-model"}, "algorithm": {"preset": "dapo"}}))
    code, output = cli_main(monkeypatch, capsys, "card", config, "--set", "algorithm.eps_high=0.3")
    assert code == 0, output
    expected = objective_card(load_config(config, ["algorithm.eps_high=0.3"]))["formula"]
    assert "1+0.3" in expected and f"formula: {expected}" in output.splitlines(), output
    assert "preset: dapo" in output.splitlines() and _choices(output)["eps_high"] == "0.3", output


def test_card_refuses_what_is_not_a_run_or_a_config(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nowhere"
    assert_one_error(*cli_main(monkeypatch, capsys, "card", missing), f"{missing}: no such file or directory")
    assert_one_error(*cli_main(monkeypatch, capsys, "card", tmp_path), f"{tmp_path / 'manifest.json'}: no such file")
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {}}))
    assert_one_error(
        *cli_main(monkeypatch, capsys, "card", tmp_path), f"{tmp_path / 'manifest.json'}: no objective card"
    )
    (tmp_path / "manifest.json").write_text("{not json")
    assert_one_error(*cli_main(monkeypatch, capsys, "card", tmp_path), f"{tmp_path / 'manifest.json'}: not valid JSON")
    assert_one_error(
        *cli_main(monkeypatch, capsys, "card", tmp_path, "--set", "train.steps=3"), "--set applies to a config YAML"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {stpes: 3}\n")
    assert_one_error(*cli_main(monkeypatch, capsys, "card", bad), "unknown field 'train.stpes'")


def test_eval_names_a_task_option_as_typed(tiny_model_dir, monkeypatch, capsys):
    """`grpolab eval --task-option X=...`: the error names `--task-option X`, what the user typed (task.options.X is
    the config's name for it, used when the options come from a run's config)."""
    args = ["eval", tiny_model_dir, "--task", "arithmetic", "--task-option", "size=0"]
    code, output = cli_main(monkeypatch, capsys, *args)
    assert_one_error(code, output, "--task-option size: unknown option for task 'arithmetic'")
    assert "task.options" not in output
    no_flag = named_as_given("task.options.size: unknown option", ["grpolab", "eval", "RUN"])
    assert no_flag == "task.options.size: unknown option"  # options read from a run's config keep the field's name
