"""The Python API (grpolab.api): the same runs as the command, Python reward callables (plain and batched),
in-memory problems, evaluate / compare / report, and every bad input refused before any model is loaded."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from pathlib import Path

import earnable
import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

import grpolab
from grpolab.errors import ConfigError, DataError
from grpolab.manifest import diff_manifests, read_manifest
from grpolab.rewards import RewardSet
from grpolab.tasks.base import Problem

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/")
PROBLEM = Problem(uid="p1", question="What is 2 + 2?", answer="4")


def config(model_dir: str, **reward) -> dict:
    """Two tiny steps on the newline reward the random model can earn (tests/earnable.py), a held-out eval at the end."""
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 40, "num_test": 12}},
        "reward": reward or earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 2,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 1e-2,
            "seed": 0,
            "samples_per_step": 2,
            "save_every_minutes": 0,
        },
        "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 4},
    }


def share(completion: str, problem) -> float:
    """tests/earnable.newline_share, as a Python callable passed to grpolab.train."""
    return min(1.0, completion.count("\n") / earnable.LENGTH)


@grpolab.batched
def flipped(completions: list[str], problems: list) -> list[float]:
    """1 - share, batched: the opposite direction."""
    return [1.0 - share(c, p) for c, p in zip(completions, problems)]


def numbers(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the timing, throughput and memory numbers."""
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        out.append({k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)})
    return out


def weights(result) -> dict:
    return load_file(str(result.checkpoint / "model.safetensors"))


@pytest.fixture(scope="module")
def cli_run(tiny_model_dir, tmp_path_factory) -> Path:
    """`grpolab train config.yaml` through the command (in this process)."""
    out = tmp_path_factory.mktemp("cli")
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump({**config(tiny_model_dir), "run": {"output_dir": str(out), "name": "cli"}}))
    from grpolab.cli import app

    result = CliRunner().invoke(app, ["train", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out / "cli"


@pytest.fixture(scope="module")
def api_run(tiny_model_dir, tmp_path_factory):
    return grpolab.train(config(tiny_model_dir), run_dir=tmp_path_factory.mktemp("api") / "api")


def test_api_and_command_give_the_same_run(cli_run, api_run):
    assert api_run.steps == 2 and api_run.checkpoint.name == "step-2" and api_run.run_dir.name == "api"
    cli, api = numbers(cli_run), numbers(api_run.run_dir)
    assert len(cli) == len(api) == 2 and "eval/accuracy" in api[1] and api[0]["reward/earn/mean"] > 0
    assert cli == api
    assert api_run.metrics["reward/mean"] == api[1]["reward/mean"] and api_run.history()[0]["step"] == 1
    assert diff_manifests(read_manifest(cli_run), api_run.manifest) == []


def test_a_python_callable_reward_trains_like_its_file_and_is_hashed(tiny_model_dir, tmp_path, api_run):
    cfg = grpolab.load_config(config(tiny_model_dir), {"reward": {"weights": {"earn": 1.0}}})
    result = grpolab.train(cfg, rewards={"earn": share}, run_dir=tmp_path / "callable")
    assert numbers(result.run_dir) == numbers(api_run.run_dir)  # the same function, passed in instead of named
    manifest = read_manifest(result.run_dir)
    assert manifest["hashes"]["reward_functions"] == {
        "earn": hashlib.sha256(inspect.getsource(share).encode()).hexdigest()
    }
    assert manifest["python_rewards"] == ["earn"] and manifest["config"]["reward"]["functions"] == {}


def test_a_batched_callable_reward_drives_training(tiny_model_dir, tmp_path, api_run):
    cfg = grpolab.load_config(config(tiny_model_dir), {"reward": {"weights": {"earn": 1.0}}})
    result = grpolab.train(cfg, rewards={"earn": flipped}, run_dir=tmp_path / "flipped")
    first, base = numbers(result.run_dir)[0], numbers(api_run.run_dir)[0]
    assert first["reward/earn/mean"] == pytest.approx(1.0 - base["reward/earn/mean"])  # same samples, reward flipped
    assert first["reward/invalid_frac"] == 0.0
    moved = [name for name, w in weights(result).items() if not (w == weights(api_run)[name]).all()]
    assert moved, "the opposite reward must move the weights elsewhere"


# ------------------------------------------------------------------------------------------------ batched rewards


def test_batched_user_rewards_score_in_one_call_and_fail_per_batch():
    calls = []

    @grpolab.batched
    def lengths(completions, problems):
        calls.append(len(completions))
        return [float(len(c)) for c in completions]

    @grpolab.batched
    def slow(completions, problems):
        time.sleep(30)

    def make(fn, limit=5.0):
        return RewardSet({"correct": 1.0, "mine": 1.0}, callables={"mine": fn}, time_limit_s=limit)

    ok = make(lengths).score_many(["\\boxed{4}", "x"], [PROBLEM, PROBLEM])
    assert calls == [2] and [r.components["mine"] for r in ok] == [9.0, 1.0] and not any(r.invalid for r in ok)
    cases = [
        (slow, "mine: TimeoutError: exceeded its time limit of 0.2 s (one batched call for 2 completions)"),
        (grpolab.batched(lambda cs, ps: [1.0]), "mine: RewardShapeError: returned 1 results for 2 completions"),
        (grpolab.batched(lambda cs, ps: 1.0), "mine: RewardShapeError: returned float 1.0, expected a list"),
        (grpolab.batched(lambda cs, ps: 1 / 0), "mine: ZeroDivisionError: division by zero"),
    ]
    for fn, reason in cases:
        results = make(fn, 0.2).score_many(["\\boxed{4}", "x"], [PROBLEM, PROBLEM])
        for r in results:
            assert r.invalid and math.isnan(r.total) and r.components["correct"] in (0.0, 1.0), r
            assert r.error.startswith(reason), r.error
    mixed = make(grpolab.batched(lambda cs, ps: [1.0, "high"])).score_many(["a", "b"], [PROBLEM, PROBLEM])
    assert not mixed[0].invalid and mixed[1].invalid and mixed[1].error.startswith("mine: TypeError: returned str")


# ------------------------------------------------------------------------------------------------ in-memory problems


def sums(start: int, n: int) -> list[Problem]:
    return [Problem(uid=f"sum/{i}", question=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(start, start + n)]


def test_in_memory_dataset_trains_records_its_fingerprint_and_resumes(tiny_model_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict(
        {"prompt": [p.question for p in sums(0, 30)], "gold": [p.answer for p in sums(0, 30)]}
    )
    fields = {"prompt_field": "prompt", "answer_field": "gold", "test_fraction": 0.2}
    cfg = grpolab.load_config(
        config(tiny_model_dir), {"reward": {"weights": {"earn": 1.0}}, "train.steps": 1, "eval.every_steps": 1}
    )
    result = grpolab.train(cfg, rewards={"earn": share}, problems=data, fields=fields, run_dir=tmp_path / "mem")
    manifest = read_manifest(result.run_dir)
    assert manifest["config"]["task"] == {"name": "python", "options": fields}
    assert manifest["data"]["source"]["fingerprints"] == {"train": data._fingerprint}
    assert manifest["hashes"]["dataset_fingerprint"] == manifest["data"]["source"]["fingerprint"]
    assert manifest["data"]["train_problems"] == 24 and manifest["data"]["held_out_problems"] == 4
    with pytest.raises(ConfigError, match="trained on problems passed in memory; pass the same problems="):
        grpolab.train({"train.steps": 2}, resume=result.run_dir, rewards={"earn": share})
    again = grpolab.train(
        {"train.steps": 2},
        resume=result.run_dir,
        rewards={"earn": share},
        problems=data,
        fields=fields,
        allow_changes=True,
    )
    assert again.steps == 2 and [r["step"] for r in again.history()] == [1, 2]


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: every error below must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr("grpolab.training.trainer.resolve_model_path", refuse)


def text_reward(completion, problem):
    return "high"


def one_arg(completion):
    return 1.0


@grpolab.batched
def short(completions, problems):
    return []


@pytest.mark.parametrize(
    "case, message",
    [
        (
            {"config": {"reward.functions": {"earn": "missing.py:f"}}, "rewards": {}},
            "reward.functions.earn: file not found: missing.py",
        ),
        ({"rewards": {"earn": one_arg}}, "rewards['earn']: test_api:one_arg(completion) cannot be called as fn("),
        (
            {"rewards": {"earn": text_reward}},
            "rewards['earn']: returned str 'high', expected a float or None (called on",
        ),
        ({"rewards": {"earn": short}}, "rewards['earn']: returned 0 results for 1 completions"),
        ({"rewards": {"other": share}}, "rewards['other']: passed in but not weighted; add reward.weights.other"),
        (
            {"config": {"task": {"name": "hf", "options": {"path": "DATASET", "prompt_field": "question"}}}},
            "task.options.prompt_field: no field 'question' in split 'train' of DATASET; fields: prompt, gold",
        ),
        (
            {"problems": "DATASET_OBJECT", "fields": {"answer_field": "answer"}, "config": {"eval.every_steps": 0}},
            "fields['prompt_field']: no field 'question' in split 'train' of the data set; fields: prompt, gold",
        ),
        (
            {"problems": [{"question": "1 + 1?"}]},
            "problems[0]: expected a grpolab.Problem(uid, question, answer), got dict",
        ),
        (
            {"problems": sums(0, 8), "eval_problems": sums(6, 4)},
            "eval_problems: 2 of 4 held-out problems share a question",
        ),
        ({"problems": sums(0, 8)}, "eval_problems: eval.every_steps > 0 needs held-out problems"),
    ],
)
def test_bad_input_is_one_line_before_any_model_loads(tiny_model_dir, tmp_path, no_model, case, message):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"prompt": ["What is 1 + 1?"] * 4, "gold": ["2"] * 4})
    saved = tmp_path / "saved"
    data.save_to_disk(saved)
    raw = json.loads(json.dumps(case.get("config", {})).replace("DATASET", str(saved)))
    base = config(tiny_model_dir)
    base["reward"] = {"functions": {}, "weights": {"earn": 1.0}}  # the reward is passed in as a callable
    kwargs = {k: v for k, v in case.items() if k != "config"}
    if kwargs.get("problems") == "DATASET_OBJECT":
        kwargs["problems"] = data
    with pytest.raises((ConfigError, DataError)) as info:
        grpolab.train(
            grpolab.load_config(base, raw), run_dir=tmp_path / "run", **({"rewards": {"earn": share}} | kwargs)
        )
    text = str(info.value).replace(str(saved), "DATASET")
    assert text.startswith(message) and "\n" not in text, text
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ evaluate, compare, report


def test_evaluate_compare_and_report_match_the_command(tiny_model_dir, api_run, tmp_path):
    from grpolab.cli import app

    args = dict(task="arithmetic", options={"num_train": 40, "num_test": 12}, limit=4, max_new_tokens=4)
    got = grpolab.evaluate_models([tiny_model_dir, str(api_run.run_dir)], out=tmp_path / "api.json", **args)
    cli = CliRunner().invoke(
        app,
        [
            "eval",
            tiny_model_dir,
            str(api_run.run_dir),
            "--task",
            "arithmetic",
            "--task-option",
            "num_train=40",
            "--task-option",
            "num_test=12",
            "--limit",
            "4",
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path / "cli.json"),
        ],
        catch_exceptions=False,
    )
    assert cli.exit_code == 0, cli.output
    from_cli = json.loads((tmp_path / "cli.json").read_text())
    assert got.path == tmp_path / "api.json" and json.loads(got.path.read_text())["data_hash"] == from_cli["data_hash"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "problems_per_s")} for r in rows]  # noqa: E731
    assert strip(got.data["models"]) == strip(from_cli["models"])
    assert list(got.accuracy) == [tiny_model_dir, str(api_run.run_dir)]
    assert got.data["models"][1]["held_out"]["checked"] is True

    comparison = grpolab.compare([got.path])
    assert [r["model"] for r in comparison.data["eval_sets"][0]["rows"]] == list(got.accuracy)

    report = grpolab.release_report(api_run.run_dir, skip_safety=True, skip_diversity=True)
    assert isinstance(report.verdict, str) and report.verdict == report.data["verdict"][0]
    diversity = next(c for c in report.checks if c.name == "pass_at_k_diversity")
    assert diversity.status == "N/A" and "skip" in diversity.reason.lower()
    assert report.paths["html"].is_file() and report.paths["md"].is_file()
    assert {c.name for c in report.checks} and report.reason


def test_api_names_do_not_shadow_the_modules():
    import grpolab.evaluation.heldout as evaluation

    assert grpolab.evaluation.heldout is evaluation and not callable(
        grpolab.evaluation.heldout
    )  # the module, as before
    assert "models" in inspect.signature(grpolab.evaluate_models).parameters
    assert grpolab.load_config(None, ["train.steps=7"]).train.steps == 7


def test_release_report_passes_its_options_to_the_report(monkeypatch, tmp_path):
    """diversity_n / diversity_samples / thresholds reach ReportOptions as the CLI's flags do (a misnamed field
    would raise TypeError here), and RUN:best travels to build_report unchanged."""
    import grpolab.report as report_pkg
    from grpolab import api

    seen = {}

    def fake_build_report(run_dir, opts, log):
        seen.update(run_dir=run_dir, opts=opts)
        return {"verdict": ("ship", "why"), "checks": [], "paths": {}}

    monkeypatch.setattr(report_pkg, "build_report", fake_build_report)
    r = api.release_report(
        f"{tmp_path}:best", diversity_n=32, diversity_samples=16, thresholds={"zero_std_warn": 0.1}, waived=["safety"]
    )
    assert r.verdict == "ship" and str(seen["run_dir"]) == f"{tmp_path}:best"
    assert seen["opts"].waived == ("safety",)
    d = seen["opts"].diversity
    assert (d.n_problems, d.samples, d.k) == (32, 16, 8)
    assert seen["opts"].thresholds.zero_std_warn == 0.1
