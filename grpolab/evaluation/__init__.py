"""Held-out evaluation: the evidence that does not come from the training reward (docs/design.md §3,
docs/evaluation.md).

- ``heldout``: greedy / sampled evaluation of models on held-out problems (``grpolab eval``), paired differences;
- ``episodes``: the same for agent tasks (one greedy episode per held-out initial state);
- ``scoring``: math-verify answer equivalence, code judged in the sandbox, percentile bootstrap intervals;
- ``intervals``: the intervals evaluation reports (t over problems; studentised bootstrap for graded scores), degenerate
  samples named, the minimum numbers of problems (MIN_PROBLEMS);
- ``result``: EvalSettings, EvalResult and its summary with intervals; writing result JSONs;
- ``eval_checks``: the evaluation options (dtype, limits, sampling settings) and the models' chat templates checked
  before any model runs;
- ``overlap``: the refusal to evaluate a run on its own training problems;
- ``sets``: evidence over several runs (seeds) -- a two-part t interval (problems, seeds); runs on
  different problems or decodings refused unless aligned explicitly.

May import: errors, manifest, tasks, models, rollout, sandbox, agents. Never the training rewards (grpolab.rewards)
or the training loop: scoring, result, overlap and sets not even indirectly (contracts in pyproject.toml).
"""
