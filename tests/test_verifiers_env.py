"""verifiers environments as grpolab tasks (grpolab.agents.verifiers_env, docs/environments.md): the rows, system
prompt and rubric reach grpolab unchanged (hand-checked rewards on known completions), a multi-turn Env is played
turn by turn, bad input is refused naming the field, and two tiny-model training steps run on each kind.

Fixtures: tests/fixtures/vf_newlines.py (single-turn) and tests/fixtures/vf_dialogue.py (multi-turn), written the way
the library documents environments; imported by name, as installed environments are. Nothing reaches the network:
the library's model clients are never built.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="pip install 'grpolab[verifiers]'")

import earnable  # noqa: E402

from grpolab.agents import verifiers_env as V  # noqa: E402
from grpolab.agents.env import load_env  # noqa: E402
from grpolab.errors import ConfigError  # noqa: E402
from grpolab.rewards import RewardSet  # noqa: E402
from grpolab.tasks import make_task  # noqa: E402
from grpolab.tasks.base import normalise_problem_text  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fixture_envs(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


def test_rows_system_prompt_and_args_reach_the_problems():
    task = make_task("verifiers", env="vf_newlines", args={"count": 40, "offset": 100})
    train, test = task.problems("train"), task.problems("test")
    assert len(train) + len(test) == 40 and test  # every row in exactly one split
    assert {p.answer for p in train + test} == {str(i) for i in range(100, 140)}  # args reached the taskset
    p = train[0]
    assert p.question == f"Write newlines, then box {p.answer}." and p.instruction == "Answer in \\boxed{}."
    assert not {normalise_problem_text(q.question) for q in train} & {normalise_problem_text(q.question) for q in test}
    assert task.problems("train") == train  # deterministic
    assert task.source["library"] == "verifiers" and task.source["library_version"] == "0.4.0"
    assert task.source["env"] == "vf_newlines" and task.source["args"] == {"count": 40, "offset": 100}
    assert len(task.source["env_source_sha256"]) == 64 and task.source["multi_turn"] is False


def test_test_args_give_the_held_out_rows_and_overlapping_questions_leave_training():
    task = make_task("verifiers", env="vf_newlines", args={"count": 10}, test_args={"count": 3, "offset": 8})
    test = task.problems("test")
    assert sorted(p.answer for p in test) == ["10", "8", "9"]
    assert sorted(int(p.answer) for p in task.problems("train")) == list(range(8))  # rows 8, 9 are held out


def test_a_file_path_environment_loads_like_an_installed_one(tmp_path):
    src = (FIXTURES / "vf_newlines.py").read_text()
    (tmp_path / "vf_newlines_copy.py").write_text(src)
    task = make_task("verifiers", env=str(tmp_path / "vf_newlines_copy.py"), args={"count": 5})
    assert len(task.problems("train")) + len(task.problems("test")) == 5


def test_each_rubric_function_is_a_named_component_with_its_weight_hand_checked():
    task = make_task("verifiers", env="vf_newlines", args={"count": 40})
    p = task.problems("train")[0]
    weights, fns = V.rubric_rewards("vf_newlines", {"count": 40})
    assert weights == {"boxed_answer": 0.5, "newline_share": 1.0} and task.rewards()[0] == weights
    cases = [  # completion, newline_share = min(1, newlines / 6), boxed_answer
        ("\n\n\nok \\boxed{%s}" % p.answer, 0.5, 1.0),
        ("\\boxed{%s}" % p.answer, 0.0, 1.0),
        ("\n" * 9 + "\\boxed{-1}", 1.0, 0.0),
        ("", 0.0, 0.0),
    ]
    rewards = RewardSet(weights, callables=fns)
    for completion, newlines, boxed in cases:
        r = rewards.score(completion, p)
        assert not r.invalid and r.components == {"boxed_answer": boxed, "newline_share": newlines}
        assert r.total == pytest.approx(1.0 * newlines + 0.5 * boxed)
        scored = V.rubric(completion, p)  # the one-function form a config names
        assert scored.value == pytest.approx(r.total)
        assert scored.extras == {"verifiers/boxed_answer": boxed, "verifiers/newline_share": newlines}
    configured = RewardSet({"rubric": 1.0}, {"rubric": "grpolab.agents.verifiers_env:rubric"})
    r = configured.score(cases[0][0], p)
    assert r.total == pytest.approx(1.0) and r.extras["verifiers/newline_share"] == 0.5


def test_a_raising_rubric_makes_only_that_sample_invalid_with_the_reason(tmp_path):
    (tmp_path / "vf_raising.py").write_text(
        (FIXTURES / "vf_newlines.py")
        .read_text()
        .replace(
            "return float(vf.extract_boxed_answer",
            "if 'boom' in trace.last_reply:\n            raise ValueError('boom')\n        return float(vf.extract_boxed_answer",
        )
    )
    ref = str(tmp_path / "vf_raising.py")
    p = make_task("verifiers", env=ref, args={"count": 30}).problems("train")[0]
    weights, fns = V.rubric_rewards(ref, {"count": 30})
    good, bad = RewardSet(weights, callables=fns).score_many(["\n", "boom"], [p, p])
    assert not good.invalid and bad.invalid and "ValueError: boom" in bad.error


def test_the_multi_turn_environment_is_played_turn_by_turn_hand_checked():
    task = make_task("verifiers", env="vf_dialogue", args={"rounds": 3}, max_turns=5, max_total_tokens=200)
    assert task.name == "agent" and task.source["multi_turn"] is True
    p = task.problems("train")[0]
    env = load_env(p.data["env"])()
    assert env.reset(p, random.Random(0)) == f"Say something ({p.data['row']['id'].split('-')[1]})."
    assert env.step("a\nb") == ("Again (1).", False)
    assert env.step("c\n\n") == ("Again (2).", False)
    assert env.step("x") == ("", True)
    # newlines: 3 / (6 * 3) with weight 1; replied (the task's @vf.reward): 3 / 3 with weight 0.25
    assert env.reward() == pytest.approx(3 / 18 + 0.25)
    cut = load_env(p.data["env"])()
    cut.reset(p, random.Random(0))
    assert cut.step("\n\n\n") == ("Again (1).", False)
    assert cut.reward() == pytest.approx(3 / 18 + 0.25 / 3)  # a bound ended it: the pending turn is terminated


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"env": "vf_no_such_env"}, "task.options.env: cannot load the verifiers environment 'vf_no_such_env'"),
        (
            {"env": "vf_newlines", "args": {"count": "many"}},
            "task.options.args: rejected by the environment 'vf_newlines'",
        ),
        ({"env": "vf_newlines", "args": ["count"]}, "task.options.args: expected a mapping"),
        ({"env": "vf_newlines", "num_train": 0}, "task.options.num_train: expected an integer > 0"),
        ({"env": "missing/file.py"}, "task.options.env: file not found: missing/file.py"),
    ],
)
def test_bad_input_is_refused_naming_the_field(options, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(")):
        make_task("verifiers", **options)


def test_an_environment_with_two_seats_is_refused_naming_what_it_needs(tmp_path):
    src = (
        (FIXTURES / "vf_dialogue.py")
        .read_text()
        .replace(
            "    player: vf.AgentConfig = vf.AgentConfig()\n",
            "    player: vf.AgentConfig = vf.AgentConfig()\n    judge: vf.AgentConfig = vf.AgentConfig()\n",
        )
    )
    (tmp_path / "vf_two_seats.py").write_text(src)
    with pytest.raises(ConfigError, match=r"needs 2 agent seats \['player', 'judge'\]"):
        make_task("verifiers", env=str(tmp_path / "vf_two_seats.py"))


# ------------------------------------------------------------------------------------------------ training


def _config(model_dir: str, tmp_path: Path, task: dict, reward: dict, **rollout) -> dict:
    return {
        "model": {"name": model_dir},
        "task": task,
        "reward": reward,
        "rollout": earnable.rollout_config(group_size=4, **rollout),
        "algorithm": {"beta": 0.0},
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 5e-3, "precision": "fp32"},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "vf"},
    }


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_training_steps_on_a_single_turn_environment_with_its_rubric(tiny_model_dir, tmp_path):
    from grpolab.config import from_dict
    from grpolab.runs import start_run

    weights, fns = V.rubric_rewards("vf_newlines", {"count": 40})
    task = {"name": "verifiers", "options": {"env": "vf_newlines", "args": {"count": 40}}}
    trainer, _ = start_run(from_dict(_config(tiny_model_dir, tmp_path, task, {"weights": weights})), rewards=fns)
    trainer.fit()
    rows = _metrics(trainer.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/invalid_frac"] == 0.0 for r in rows)
    assert {"reward/newline_share/mean", "reward/boxed_answer/mean"} <= set(rows[0])
    assert any(r["reward/std"] > 0 for r in rows)  # the tiny model earns newline_share: a real signal
    manifest = json.loads((trainer.run_dir / "manifest.json").read_text())
    assert manifest["data"]["source"]["library"] == "verifiers"
    assert manifest["data"]["source"]["env_id"] == "vf_newlines"
    assert manifest["objective"]["environment"] == manifest["data"]["source"], "identity and version on the card"
    assert_eval_runs_unchanged(trainer.run_dir, tiny_model_dir, task)


def assert_eval_runs_unchanged(run_dir: Path, base: str, task: dict) -> None:
    """`grpolab eval BASE RUN` on the environment's held-out split, through the API's own code: both models scored
    on the same problems, the run's training set checked disjoint from them."""
    import grpolab

    report = grpolab.evaluate_models(
        [base, str(run_dir)], task=task["name"], options=task["options"], limit=2, max_new_tokens=6, verbose=False
    )
    rows = report.data["models"]
    assert report.data["n"] == 2 and len(rows) == 2 and all(len(r["items"]) == 2 for r in rows)
    assert [it["uid"] for it in rows[0]["items"]] == [it["uid"] for it in rows[1]["items"]]
    assert rows[1]["held_out"]["checked"] and rows[1]["held_out"]["overlap"] == 0, rows[1]["held_out"]


def test_two_training_steps_on_a_multi_turn_environment(tiny_model_dir, tmp_path, monkeypatch):
    from grpolab.agents.episode import EpisodeRunner
    from grpolab.config import from_dict
    from grpolab.runs import start_run

    # turns that end on their own: tokens with id % 7 == 0 stop a turn too (as tests/test_agent_episode.py does)
    monkeypatch.setattr(
        EpisodeRunner,
        "from_engine",
        classmethod(
            lambda cls, engine: EpisodeRunner(
                engine.model, engine.tokenizer, sorted(set(engine.stop_ids) | set(range(0, len(engine.tokenizer), 7)))
            )
        ),
    )
    options = {"env": "vf_dialogue", "args": {"rounds": 2}, "max_turns": 3, "max_turn_tokens": 6}
    options["max_total_tokens"] = 60
    cfg = _config(tiny_model_dir, tmp_path, {"name": "verifiers", "options": options}, {"weights": {"env": 1.0}})
    trainer, _ = start_run(from_dict(cfg))
    trainer.fit()
    rows = _metrics(trainer.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["agent/ended_by/invalid_frac"] == 0.0 for r in rows)
    assert any(r["agent/turns_mean"] > 1 for r in rows)  # the environment's second turn was played
    assert any(r["reward/std"] > 0 for r in rows)
    assert json.loads((trainer.run_dir / "manifest.json").read_text())["data"]["source"]["multi_turn"] is True
    assert_eval_runs_unchanged(trainer.run_dir, tiny_model_dir, {"name": "verifiers", "options": options})
