"""Bounded multi-turn agent tasks with tools (docs/agents.md).

- ``env``: the Environment interface (reset / step / reward, plus tools), the registry of built-in environments,
  user environments loaded from ``path/file.py:Class``, and the ``agent`` task whose problems are initial states;
- ``tools``: tool-call parsing, the safe calculator, and the killable tool worker process;
- ``calc``, ``guess``: the built-in environments;
- ``episode``: the token-in / token-out episode runner (one token sequence per episode, ``loss_mask`` on the model's
  tokens only);
- ``collect``: the training-batch collector that runs episodes instead of single completions;
- ``evaluate``: held-out episode success with intervals, turns, tool calls and tool errors per episode.

This package's __init__ imports nothing, so grpolab.rewards and grpolab.evaluation.heldout can import its small modules
without a cycle.
"""
