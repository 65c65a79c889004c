"""Bounded multi-turn agent tasks with tools (docs/agents.md).

- ``env``: the Environment interface (reset / step / reward, plus tools), the registry of built-in environments,
  user environments loaded from ``path/file.py:Class``, and the ``agent`` task whose problems are initial states;
- ``tools``: tool-call parsing, the safe calculator, and the killable tool worker process;
- ``calc``, ``guess``, ``lookup``: the built-in environments (``lookup`` needs several tool calls in sequence);
  ``answer_env``: their shared end (the first turn without a tool call is the answer, scored by the correctness rule);
- ``episode``: the token-in / token-out episode runner (one token sequence per episode, ``loss_mask`` on the model's
  tokens only); ``turns``: one turn of many episodes that continues each episode's KV cache;
- ``expert``: episodes played by an environment's scripted solver, rendered as sampled episodes are (warm starts);
- ``verifiers_env``: verifiers environments (task ``verifiers``): loading, a single-turn taskset's rows as problems and
  its rubric as rewards (the optional verifiers library, imported when used); ``verifiers_episodes``: a multi-turn
  verifiers Env played as agent episodes; ``verifiers_task``: the ``verifiers`` task over both (registered there);
- ``openenv_env``: OpenEnv servers (task ``openenv``): episodes through the library's client to a server the run starts
  on 127.0.0.1 or is pointed at (the optional openenv-core library, imported when used);
- ``openai_agent``: task ``openai_agent``, an agent written against the ``openai`` package played through the run's
  OpenAI-compatible endpoint (``openai_server``: routes, keys, errors; ``openai_sessions``: token-in / token-out
  sessions; ``chat_tools``: tool schemas, the model's tool-call formats, grpolab's ChatML template with tools).
The training-batch collector that runs episodes is grpolab.training.agent_batch; held-out episode success is
grpolab.evaluation.episodes.

Importing the package registers the built-in environments (``calc``, ``guess``, ``lookup``: ``env.register_environment``) and
the ``agent``, ``verifiers``, ``openenv`` and ``openai_agent`` tasks (``grpolab.tasks.register_task``); the base class
never imports its subclasses. docs/environments.md: the verifiers and OpenEnv adapters.

May import: grpolab.errors, tasks, rewards, rollout, models. Imported by: training, evaluation, cli.
"""

from . import calc, env, guess, lookup, openai_agent, openenv_env, verifiers_task  # noqa: F401 -- each registers itself
