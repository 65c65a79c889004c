"""verifiers environments (``verifiers`` 0.4.0, its ``verifiers.v1`` stack) as grpolab tasks (docs/environments.md).

``task: {name: verifiers, options: {env: ID_OR_FILE, args: {...}}}`` loads an environment the way
``vf.load_environment`` does: ``ID_OR_FILE`` is an installed environment package (``my-env``, imported as ``my_env``)
or a ``path/to/file.py`` exporting its Taskset (and, multi-turn, its Env) through ``__all__``; ``args`` are its
taskset config's fields (``--env.taskset.*`` of ``vf-eval``), validated by the library.

- **Single-turn** (the library's ``SingleAgentEnv`` over a taskset without tool servers): the taskset's rows are the
  problems (the row's prompt is the question, its system prompt the instruction below it), and the rows' ``@vf.reward``
  functions (and the config-plugged ones) are the rewards. ``rubric_rewards`` gives them as grpolab reward components,
  each under its own name with the rubric's weight; ``rubric`` is one config function whose value is the rubric's
  weighted sum and whose ``extras`` log every function (``reward/verifiers/<name>``). Scoring builds the library's
  ``Trace`` of [prompt, the completion] and runs ``Task.score`` on it: the rubric code runs unchanged.
- **Multi-turn** (an ``Env`` subclass whose ``run(task, agents)`` drives ``agents.<seat>.interaction(task)``): an
  AgentEnv adapter (grpolab.agents.verifiers_episodes) plays it in grpolab's token-in / token-out episodes. The
  environment's ``run`` runs on a private event loop; each ``interaction.turn(message)`` it awaits is an observation, each model turn the reply it gets back;
  when ``run`` returns the episode is done; its reward is the trace's weighted sum (what ``run`` recorded plus the
  task's rubric), read once. A bound that ends the episode first answers the pending turn as the library does at
  its own limits (a ``terminated`` segment), so ``run`` finishes and scores.

Never used: the library's model clients, harnesses, runtimes, tool servers, judges (they call a model or a service);
an environment that needs one is refused when it loads, naming what it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from ..rewards.code import Scored
from ..tasks.base import Problem, normalise_problem_text

KIND = "verifiers"
INSTALL = "pip install 'grpolab[verifiers]' (verifiers==0.4.0)"
TEST_SHARE = 0.2  # without test_args: the share of the rows held out (those whose sha256(seed, key) is lowest)


def _vf():
    """``verifiers.v1``, or a one-line ConfigError naming the install command."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ConfigError(
            f"task.options.env: verifiers environments need the verifiers package: {INSTALL} ({e})"
        ) from None
    return vf


@dataclass(frozen=True)
class LoadedEnv:
    """One loaded environment: the library's Env, and what grpolab needs of it."""

    ref: str
    args_json: str
    env: Any
    module: str
    multi_turn: bool
    seat: str  # the Env's one agent seat (multi-turn)

    @property
    def identity(self) -> dict[str, Any]:
        """What the manifest records: the library and its version, the environment, its file's hash and args."""
        import verifiers

        mod = sys.modules.get(self.module)
        path = getattr(mod, "__file__", None)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
        version = getattr(mod, "__version__", None)
        if version is None:
            with contextlib.suppress(Exception):
                from importlib import metadata

                version = metadata.version(self.module.replace("_", "-"))
        return {
            "library": "verifiers",
            "library_version": verifiers.__version__,
            "env": self.ref,
            "env_id": self.env.config.env_id,
            "env_version": version,
            "env_source_sha256": digest,
            "args": json.loads(self.args_json),
            "multi_turn": self.multi_turn,
        }


def _module_name(ref: str, field: str) -> str:
    """The importable module of `ref`: a .py file is imported under its stem (the library imports by name)."""
    if not ref.endswith(".py"):
        return ref.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    path = Path(ref)
    if not path.is_file():
        raise ConfigError(f"{field}: file not found: {ref}")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() != path.resolve():
            raise ConfigError(f"{field}: {ref} would shadow the already imported module {name!r}; rename the file")
        return name
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"{field}: importing {ref} failed ({type(e).__name__}: {e})") from None
    return name


@functools.lru_cache(maxsize=32)
def _load(ref: str, args_json: str) -> LoadedEnv:
    vf = _vf()
    from verifiers.v1.envs.single_agent import SingleAgentEnv

    module = _module_name(ref, "task.options.env")
    try:
        cfg = vf.resolve_env_config({"taskset": {"id": module, **json.loads(args_json)}})
        env = vf.load_environment(cfg)
    except (ModuleNotFoundError, TypeError, AttributeError) as e:
        raise ConfigError(f"task.options.env: cannot load the verifiers environment {ref!r}: {e}") from None
    except ValueError as e:  # pydantic's ValidationError is a ValueError: the args
        raise ConfigError(f"task.options.args: rejected by the environment {ref!r}: {e}") from None
    taskset, task_cls = env.taskset, type(env.taskset).task_type()
    needs = []
    if taskset.config.task.judges:
        needs.append("judges (an LLM judge calls a model)")
    if type(taskset).toolsets(taskset.config) or task_cls.toolsets(taskset.config.task):
        needs.append("tool servers (MCP toolsets)")
    if task_cls.NEEDS_CONTAINER:
        needs.append("a container runtime")
    multi_turn = type(env) is not SingleAgentEnv
    seats = list(env._agent_specs)
    if multi_turn and len(seats) != 1:
        needs.append(f"{len(seats)} agent seats {seats} (grpolab plays one: the policy)")
    if needs:
        raise ConfigError(
            f"task.options.env: {ref} needs {', '.join(needs)}, which grpolab does not run (docs/environments.md)"
        )
    return LoadedEnv(ref, args_json, env, module, multi_turn, seats[0])


def load(ref: str, args: dict[str, Any] | None = None) -> LoadedEnv:
    """The environment `ref` with its taskset options `args` (cached per process); ConfigError naming the field."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(
            f"task.options.env: expected an installed verifiers environment or 'path/to/file.py', got {ref!r}"
        )
    if args is not None and not isinstance(args, dict):
        raise ConfigError(f"task.options.args: expected a mapping of the environment's options, got {args!r}")
    return _load(ref, json.dumps(args or {}, sort_keys=True))


# ------------------------------------------------------------------------------------------------ rows as problems


def row_text(task: Any, field: str) -> str:
    prompt = task.data.prompt
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    if len(prompt) == 1 and getattr(prompt[0], "role", None) == "user":
        return task.data.prompt_text
    raise ConfigError(
        f"{field}: row {task.key[:12]} has a prompt of {len(prompt)} messages; grpolab renders one user message"
    )


def _problem(loaded: LoadedEnv, task: Any, args: dict[str, Any]) -> Problem:
    data = task.data
    return Problem(
        uid=f"verifiers/{loaded.module}/{task.key[:16]}",
        question=row_text(task, "task.options.env"),
        answer=str(getattr(data, "answer", "") or ""),
        data={"kind": KIND, "vf_env": loaded.ref, "args": args, "row": data.model_dump(mode="json")},
        instruction=data.system_prompt or "",
    )


def _rows(loaded: LoadedEnv, limit: int) -> list[Any]:
    taskset = loaded.env.taskset
    return list(taskset.take(limit) if not taskset.bounded else taskset)[:limit]


def split_rows(
    ref: str, args: dict[str, Any], test_args: dict[str, Any] | None, split: str, n: int, seed: int, max_rows: int
) -> list[Problem]:
    """`n` problems of `split`. With `test_args` the held-out rows are that taskset's; otherwise the held-out rows are
    the ceil(TEST_SHARE * rows) of the (at most max_rows) rows read whose sha256(seed, key) is lowest (none of one
    row). Training rows whose question equals a held-out one (normalised) are left out: the splits share no
    question. Order: a seeded shuffle of each split."""
    loaded = load(ref, args)
    rows = _rows(loaded, max_rows)

    ranked = sorted(rows, key=lambda t: hashlib.sha256(f"{seed}:{t.key}".encode()).hexdigest())
    held_keys = {t.key for t in ranked[: math.ceil(TEST_SHARE * len(rows)) if len(rows) > 1 else 0]}

    def held(task) -> bool:
        return task.key in held_keys

    if test_args is not None:
        test_loaded = load(ref, test_args)
        test = [_problem(test_loaded, t, test_args) for t in _rows(test_loaded, max_rows)]
        train = [_problem(loaded, t, args) for t in rows]
    else:
        test = [_problem(loaded, t, args) for t in rows if held(t)]
        train = [_problem(loaded, t, args) for t in rows if not held(t)]
    if split == "train":
        held_out = {normalise_problem_text(p.question) for p in test}
        chosen = [p for p in train if normalise_problem_text(p.question) not in held_out]
    else:
        chosen = test
    seen: set[str] = set()
    unique = [p for p in chosen if not (p.uid in seen or seen.add(p.uid))]
    random.Random(f"verifiers:{seed}:{split}").shuffle(unique)
    return unique[:n]


# ------------------------------------------------------------------------------------------------ single-turn rewards


def row_task(loaded: LoadedEnv, row: dict[str, Any]) -> Any:
    taskset = loaded.env.taskset
    task_cls = type(taskset).task_type()
    return task_cls(task_cls.data_type().model_validate(row), taskset.config.task)


def make_trace(task: Any, replies: list[tuple[str, str]]) -> Any:
    """The library's Trace of a rollout of `task`: its prompt, then `replies` ((role, text) in order)."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode

    messages: list[Any] = []
    if task.data.system_prompt:
        messages.append(vf.SystemMessage(content=task.data.system_prompt))
    if task.data.prompt is not None:
        messages += (
            [vf.UserMessage(content=task.data.prompt)] if isinstance(task.data.prompt, str) else task.data.prompt
        )
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
    )
    for role, text in [(m.role, m) for m in messages] + replies:
        message = text if not isinstance(text, str) else chat_message(role, text)
        trace.nodes.append(
            MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message, sampled=role == "model")
        )
    return trace


def chat_message(role: str, text: str) -> Any:
    vf = _vf()
    return vf.AssistantMessage(content=text) if role == "model" else vf.UserMessage(content=text)


def _score(task: Any, trace: Any) -> dict[str, tuple[float, float]]:
    """Run the task's rubric on `trace` (the library's Task.score): {name: (score, weight)}; a reward that did not
    score raises."""
    asyncio.run(task.score(trace))
    missing = [name for name, r in trace.rewards.items() if r is None]
    if missing:
        raise ValueError(f"the rubric did not score {', '.join(missing)}")
    return {name: (r.score, r.weight) for name, r in trace.rewards.items()}


@functools.lru_cache(maxsize=4096)
def _score_completion(ref: str, args_json: str, row_json: str, completion: str) -> dict[str, tuple[float, float]]:
    loaded = _load(ref, args_json)
    task = row_task(loaded, json.loads(row_json))
    return _score(task, make_trace(task, [("model", completion)]))


def score_completion(completion: str, problem: Problem) -> dict[str, tuple[float, float]]:
    """{rubric function: (score, weight)} of `completion` to the verifiers problem `problem`."""
    data = problem.data
    if data.get("kind") != KIND:
        raise TypeError(f"{problem.uid} is not a verifiers problem")
    args_json = json.dumps(data.get("args") or {}, sort_keys=True)
    return _score_completion(data["vf_env"], args_json, json.dumps(data["row"], sort_keys=True), completion)


def rubric(completion: str, problem: Problem) -> Scored:
    """A config reward function (``reward.functions: {rubric: grpolab.agents.verifiers_env:rubric}``): the rubric's
    weighted sum sum_k w_k * s_k, with every function's unweighted score s_k as ``verifiers/<name>`` in extras."""
    scores = score_completion(completion, problem)
    total = sum(s * w for s, w in scores.values())
    return Scored(total, extras={f"verifiers/{name}": s for name, (s, _) in scores.items()})


def rubric_rewards(ref: str, args: dict[str, Any] | None = None) -> tuple[dict[str, float], dict[str, Callable]]:
    """(weights, callables): every rubric function of the environment as its own grpolab reward component, under its
    name with the rubric's weight -- ``grpolab.train(cfg, rewards=callables)`` with ``reward.weights: weights``.
    The names come from the first row's rubric (plugged config rewards included)."""
    loaded = load(ref, args)
    rows = _rows(loaded, 1)
    if not rows:
        raise ConfigError(f"task.options.env: {ref} has no rows")
    hooks = rows[0].hooks("reward")
    weights = {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in hooks}

    def component(name: str) -> Callable[[str, Problem], float]:
        def reward(completion: str, problem: Problem) -> float:
            scores = score_completion(completion, problem)
            if name not in scores:
                raise KeyError(f"the rubric has no {name!r} for {problem.uid} (it scored {sorted(scores)})")
            return scores[name][0]

        reward.__name__ = reward.__qualname__ = f"verifiers_{name}"
        return reward

    return weights, {name: component(name) for name in weights}


# ------------------------------------------------------------------------------------------------ the task


class VerifiersTask:
    """Task ``verifiers`` of a single-turn environment: the taskset's rows (see split_rows)."""

    name = KIND

    def __init__(self, loaded: LoadedEnv, args, test_args, seed: int, sizes: dict[str, int], max_rows: int):
        self.loaded, self.args, self.test_args = loaded, args, test_args
        self.seed, self.sizes, self.max_rows = seed, sizes, max_rows
        self.source = loaded.identity

    def rewards(self) -> tuple[dict[str, float], dict[str, Callable]]:
        """(weights, callables) of the rubric (rubric_rewards): what a trainer that takes a task's own rewards uses."""
        return rubric_rewards(self.loaded.ref, self.args)

    def problems(self, split: str) -> list[Problem]:
        if split not in self.sizes:
            raise ConfigError(f"task verifiers: unknown split {split!r}; expected train or test")
        return split_rows(
            self.loaded.ref, self.args, self.test_args, split, self.sizes[split], self.seed, self.max_rows
        )
