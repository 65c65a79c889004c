"""Task ``verifiers`` (docs/environments.md): a verifiers environment as a grpolab task -- a single-turn
environment's rows (grpolab.agents.verifiers_env.VerifiersTask) or a multi-turn one's episodes (the ``agent`` task
over grpolab.agents.verifiers_episodes' adapter). Registered here, above both modules, so that neither imports the
other back."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..tasks import register_task
from .env import AgentTask
from .verifiers_env import KIND, VerifiersTask, load
from .verifiers_episodes import make_agent_env


class VerifiersAgentTask(AgentTask):
    """The ``agent`` task of a multi-turn environment, with the environment's identity as its ``source``."""

    source: dict[str, Any] = {}


def verifiers_task(
    env: str,
    args: dict[str, Any] | None = None,
    test_args: dict[str, Any] | None = None,
    seed: int = 0,
    num_train: int = 2000,
    num_test: int = 200,
    max_rows: int = 10_000,
    max_turns: int = 4,
    max_turn_tokens: int = 64,
    max_total_tokens: int = 256,
    time_limit_s: float = 5.0,
):
    """Task ``verifiers``: a single-turn environment's rows (VerifiersTask), or a multi-turn one's episodes (the
    ``agent`` task over its VerifiersEpisodes adapter, with the episode bounds)."""
    for field, value in (("num_train", num_train), ("num_test", num_test), ("max_rows", max_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"task.options.{field}: expected an integer > 0, got {value!r}")
    if test_args is not None and not isinstance(test_args, dict):
        raise ConfigError(
            f"task.options.test_args: expected a mapping of the held-out taskset's options, got {test_args!r}"
        )
    loaded = load(env, args)
    args = dict(args or {})
    if test_args is not None:
        load(env, test_args)  # its options checked now
    if not loaded.multi_turn:
        return VerifiersTask(loaded, args, test_args, seed, {"train": num_train, "test": num_test}, max_rows)
    name = make_agent_env(env, args, test_args, max_rows)
    task = VerifiersAgentTask(
        name, seed, num_train, num_test, 1, max_turns, max_turn_tokens, max_total_tokens, time_limit_s
    )
    task.source = loaded.identity
    return task


register_task(KIND, verifiers_task)
