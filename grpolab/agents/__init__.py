"""Bounded multi-turn agent tasks with tools (docs/agents.md).

- ``env``: the Environment interface (reset / step / reward, plus tools), the registry of built-in environments,
  user environments loaded from ``path/file.py:Class``, and the ``agent`` task whose problems are initial states;
- ``tools``: tool-call parsing, the safe calculator, and the killable tool worker process;
- ``calc``, ``guess``, ``lookup``: the built-in environments (``lookup`` needs several tool calls in sequence);
  ``answer_env``: their shared end (the first turn without a tool call is the answer, scored by the correctness rule);
- ``episode``: the token-in / token-out episode runner (one token sequence per episode, ``loss_mask`` on the model's
  tokens only); ``turns``: one turn of many episodes that continues each episode's KV cache;
- ``expert``: episodes played by an environment's scripted solver, rendered as sampled episodes are (warm starts).
The training-batch collector that runs episodes is grpolab.training.agent_batch; held-out episode success is
grpolab.evaluation.episodes.

Importing the package registers the built-in environments (``calc``, ``guess``, ``lookup``: ``env.register_environment``) and
the ``agent`` task (``grpolab.tasks.register_task``); the base class never imports its subclasses.

May import: grpolab.errors, tasks, rewards, rollout, models. Imported by: training, evaluation, cli.
"""

from . import calc, env, guess, lookup  # noqa: F401 -- each registers itself
