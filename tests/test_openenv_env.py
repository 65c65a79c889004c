"""OpenEnv servers as agent tasks (grpolab.agents.openenv_env, docs/environments.md): episodes through the library's
client to a server the run starts (or is pointed at) on 127.0.0.1, hand-checked rewards, bounded waits, a server
killed mid-episode making only that episode invalid with the reason, no process left behind, and two tiny-model
training steps.

The server is tests/fixtures/openenv_counter_server.py, written with openenv-core's server classes; every test bounds
its waits (startup_timeout_s, call_timeout_s), nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="pip install 'grpolab[openenv]'")

import earnable  # noqa: E402

from grpolab.agents import openenv_env as O  # noqa: E402
from grpolab.agents.env import load_env  # noqa: E402
from grpolab.errors import ConfigError  # noqa: E402
from grpolab.tasks import make_task  # noqa: E402

SERVER = Path(__file__).parent / "fixtures" / "openenv_counter_server.py"
COMMAND = [sys.executable, str(SERVER), "--port", "{port}"]
pytestmark = pytest.mark.usefixtures("one_thread")


def gone(pid: int) -> bool:
    """No process of the process group `pid` is left (a zombie reaped by its parent counts as gone)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def task():
    """The task over a server it starts (one per module: the server takes seconds to import its libraries)."""
    made = make_task("openenv", command=COMMAND, num_train=8, num_test=2, startup_timeout_s=120, call_timeout_s=20)
    made.problems("train")  # starts the server
    yield made
    O.stop_servers()


def test_episodes_go_through_the_server_hand_checked(task):
    problems = task.problems("train")
    assert [p.data["openenv_seed"] for p in problems] == list(range(2**19, 2**19 + 8))
    assert not {p.data["openenv_seed"] for p in problems} & {p.data["openenv_seed"] for p in task.problems("test")}
    env_cls = load_env(problems[0].data["env"])
    env = env_cls()
    assert env.reset(problems[3], random.Random(0)) == f"Round {(2**19 + 3) % 7}: reply."
    assert env.step("a\n\n\n") == ("Again (1).", False)  # reward (3 / 6) / 2 rounds
    assert env.step("\n" * 9) == ("Again (2).", True)  # reward min(1, 9 / 6) / 2
    assert env.reward() == pytest.approx(0.25 + 0.5)
    assert task.source["library"] == "openenv-core" and task.source["library_version"] == "0.3.0"
    assert task.source["server"] == {"command": COMMAND}


def test_a_server_killed_mid_episode_makes_only_that_episode_invalid_and_stop_leaves_nothing(tiny_model_dir):
    from grpolab.agents.episode import EpisodeRunner
    from grpolab.models.load import load_causal_lm, load_tokenizer

    server = O.Server([p.replace("{port}", str(port := O.free_port())) for p in COMMAND], port, os.devnull)
    server.start(120)
    pid = server.process.pid
    try:
        pointed = make_task("openenv", url=server.url, num_train=2, num_test=1, call_timeout_s=20)
        problems = pointed.problems("train")
        runner = EpisodeRunner(load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir), [0])
        done, killed = (runner.start(p, 0, 0, False)[0] for p in problems)
        runner.respond(done, "\n\n\n")  # a turn the server answers
        assert done.result.ended_by == "" and done.result.trace[-1]["observation"] == "Again (1)."
        os.killpg(pid, signal.SIGKILL)  # the server dies mid-episode
        server.process.wait(10)
        runner.respond(killed, "hello")
        assert killed.result.ended_by == "invalid" and killed.result.error.startswith("step: ConnectionClosed")
        runner.respond(done, "bye")  # the other episode: its own failure, its own reason, nothing else
        assert done.result.invalid and done.result.error.startswith("step: ")
    finally:
        server.stop()
    assert gone(pid)


def test_after_the_server_the_run_started_dies_the_next_episode_gets_a_new_one(task, tiny_model_dir):
    from grpolab.agents.episode import EpisodeRunner
    from grpolab.models.load import load_causal_lm, load_tokenizer

    problems = task.problems("train")
    runner = EpisodeRunner(load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir), [0])
    first = runner.start(problems[0], 0, 0, False)[0]
    (old,) = O._SERVERS.values()
    old_pid = old.process.pid
    os.killpg(old_pid, signal.SIGKILL)
    old.process.wait(10)
    runner.respond(first, "hello")
    assert first.result.invalid and first.result.error.startswith("step: ")  # that episode, with the reason
    second, observation = runner.start(problems[1], 0, 0, False)  # the next one: a server started again
    assert observation == f"Round {(2**19 + 1) % 7}: reply." and not second.result.invalid
    runner.respond(second, "\n")
    assert second.result.trace[-1]["observation"] == "Again (1)." and not second.result.invalid
    (new,) = O._SERVERS.values()
    assert gone(old_pid) and new.process.pid != old_pid and old.process is None  # the dead one was cleaned up


def test_a_server_that_does_not_answer_fails_the_reset_within_the_call_bound():
    with socket.socket() as silent:  # accepts TCP connections, never answers the WebSocket handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        task = make_task("openenv", url=url, num_train=1, num_test=1, call_timeout_s=0.5)
        env = load_env(task.problems("train")[0].data["env"])()
        with pytest.raises(ConnectionError):
            env.reset(task.problems("train")[0], random.Random(0))


def test_a_server_that_exits_at_startup_is_an_error_quoting_its_log():
    with pytest.raises(RuntimeError, match=r"exited with code 3 before it answered .* its log ends: no port for me"):
        O.ensure_server([sys.executable, "-c", "print('no port for me {port}'); raise SystemExit(3)"], 60, "exits")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "task.options.command: give exactly one of command"),
        ({"command": "serve --port 8000"}, r"task.options.command: expected a command with a \{port\} placeholder"),
        ({"url": "http://example.com:8000"}, "task.options.url: expected http://127.0.0.1:PORT"),
        (
            {"url": "http://127.0.0.1:1", "call_timeout_s": 0},
            "task.options.call_timeout_s: expected a number of seconds",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field(options, match):
    with pytest.raises(ConfigError, match=match):
        make_task("openenv", **options)


def test_two_training_steps_against_the_server_the_run_starts_then_none_is_left(
    task, tiny_model_dir, tmp_path, monkeypatch
):
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
    options = {"command": COMMAND, "num_train": 8, "num_test": 2, "startup_timeout_s": 120, "call_timeout_s": 20}
    options.update(max_turns=3, max_turn_tokens=6, max_total_tokens=60, time_limit_s=20)
    cfg = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "openenv", "options": options},
        "reward": {"weights": {"env": 1.0}},
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"beta": 0.0},
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 5e-3, "precision": "fp32"},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "openenv"},
    }
    trainer, _ = start_run(from_dict(cfg))
    pids = [s.process.pid for s in O._SERVERS.values()]
    assert pids  # started with the task's problems (the same command and options share one server)
    trainer.fit()
    assert not O._SERVERS and all(gone(pid) for pid in pids), "the run's end stops the servers it started"
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["agent/ended_by/invalid_frac"] == 0.0 for r in rows)
    assert any(r["agent/turns_mean"] > 1 for r in rows) and any(r["reward/std"] > 0 for r in rows)
    manifest = json.loads((trainer.run_dir / "manifest.json").read_text())
    assert manifest["data"]["source"]["library"] == "openenv-core"

    import grpolab  # `grpolab eval BASE RUN` on the server's held-out seeds: one greedy episode each, server restarted

    report = grpolab.evaluate_models(
        [tiny_model_dir, str(trainer.run_dir)], task="openenv", options=options, limit=2, verbose=False
    )
    rows = report.data["models"]
    assert report.data["n"] == 2 and all(len(r["items"]) == 2 for r in rows)
    assert rows[1]["held_out"]["checked"] and rows[1]["held_out"]["overlap"] == 0
    O.stop_servers()
