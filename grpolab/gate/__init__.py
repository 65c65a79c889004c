"""The release gate: the checks and the verdict, pure functions over evidence records (no file, no model, no plot).

Modules: base (statuses incl. N/A, CheckResult, helpers on metric rows and on the resolved config), thresholds
(Thresholds, ``--threshold``), stats (interval grade, one-sided p-values of harm, what a comparison can establish),
evidence (the records judged), training (learning-signal and dynamics checks), hacking (reward-hacking checks),
code, agent, judge and reward_model (the checks of such runs), heldout (held-out improvement), regression
(capability, pass@k, safety), noninferiority (the margins ship needs on every harm dimension, the power
calculation, the user's waivers), release (serving and rollback), family (Holm's control of the FAIL rules),
verdict (every check of a run or set, and the verdict).

May import: evaluation (intervals), rewards (names of the correctness rewards), errors. Imported by: report (which
gathers the evidence and renders it), the CLI and the Python API. It never imports the rendering (import-linter).
"""
