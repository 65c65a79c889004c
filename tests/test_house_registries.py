"""The choice points of the house as registries and declared interfaces (docs/design.md section 3): the advantage
estimator's registry, the renamed worker timeouts of earlier configs, and an OpenEnv task stopping its own server."""

from __future__ import annotations

import pytest

import grpolab.runs  # noqa: F401 -- registers gae (grpolab.baselines.ppo), as every run does
from grpolab.agents import openenv_env
from grpolab.agents.openenv_env import OpenEnvEpisodes, OpenEnvTask
from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.training import estimators


def test_an_estimator_nobody_registered_is_a_config_error_naming_the_field(monkeypatch):
    cfg = from_dict({"algorithm": {"estimator": "gae"}})
    assert estimators.estimator_spec(cfg) is estimators.ESTIMATORS["gae"]  # grpolab.baselines.ppo registered it
    monkeypatch.delitem(estimators.ESTIMATORS, "gae")
    with pytest.raises(
        ConfigError, match=r"algorithm.estimator: expected one of \['distill', 'gdpo', 'group', 'maxrl', 'pass_at_k'\]"
    ):
        estimators.estimator_spec(cfg)


def test_the_worker_timeouts_load_from_their_earlier_names():
    cfg = from_dict({"rollout": {"vllm_start_timeout_s": 12.0, "vllm_call_timeout_s": 34.0}})
    assert (cfg.rollout.worker_start_timeout_s, cfg.rollout.worker_call_timeout_s) == (12.0, 34.0)
    with pytest.raises(ConfigError, match=r"rollout.vllm_start_timeout_s and rollout.worker_start_timeout_s"):
        from_dict({"rollout": {"vllm_start_timeout_s": 12.0, "worker_start_timeout_s": 13.0}})


class FakeServer:
    def __init__(self):
        self.stopped = 0

    def stop(self):
        self.stopped += 1


def test_an_openenv_task_stops_its_own_server_and_no_other(monkeypatch):
    mine, other = FakeServer(), FakeServer()
    monkeypatch.setattr(openenv_env, "_SERVERS", {"mine": mine, "other": other})
    started = type("Env", (OpenEnvEpisodes,), {"command": "serve --port {port}", "server_key": "mine"})
    pointed = type("Env", (OpenEnvEpisodes,), {"url": "http://127.0.0.1:1", "server_key": "other"})
    for env_cls in (started, pointed):
        task = object.__new__(OpenEnvTask)
        task.env_cls = env_cls
        task.close()
    assert (mine.stopped, other.stopped) == (1, 0), "a server the task was pointed at is not the task's to stop"
    assert list(openenv_env._SERVERS) == ["other"]
