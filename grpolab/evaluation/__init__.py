"""Held-out evaluation: the evidence that does not come from the training reward (docs/design.md §3, docs/eval.md).

- ``heldout``: greedy / sampled evaluation of models on held-out problems (``grpolab eval``), paired differences;
- ``episodes``: the same for agent tasks (one greedy episode per held-out initial state);
- ``scoring``: math-verify answer equivalence, code judged in the sandbox, bootstrap intervals;
- ``result``: EvalSettings, EvalResult and its summary with intervals; writing result JSONs;
- ``overlap``: the refusal to evaluate a run on its own training problems;
- ``sets``: evidence over several runs (seeds) -- hierarchical bootstrap over runs, then problems.

May import: errors, manifest, tasks, models, rollout, sandbox, agents. Never the training rewards (grpolab.rewards)
or the training loop: scoring, result, overlap and sets not even indirectly (contracts in pyproject.toml).
"""
