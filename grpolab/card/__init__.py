"""The objective card: the resolved objective as a formula, every choice, and the peer settings that match it.

Printed at the start of a run and stored in the manifest, so two runs that both say "GRPO" can be told apart.
For each peer the card names the version it was checked against (``PEER_VERSIONS``) and, per axis of the
objective, the peer's own settings (TRL config fields, verl Hydra overrides of ``trainer/config/ppo_trainer.yaml``,
OpenRLHF ``train_ppo_ray`` flags) with a verdict: ``exact`` (same numbers), ``nearest`` (with the difference in
one phrase) or ``none``. ``tests/test_card_peers.py`` feeds these settings to each peer's own config code and
compares numbers with the peer's own functions; ``tests/test_card_peers_grads.py`` compares the loss and its gradient
in every surrogate x IS x aggregation cell a peer's rows call exact.

"Exact" is meant on batches in which every completion keeps at least one loss token (peers count fully masked
rows differently) and ignores clamps that act only on log-ratios beyond +-20.

- ``formula``: the loss as it is optimised, plain text and LaTeX (policy_loss, formula);
- ``peers``: the peers' versions and the rows of the objective's axes (advantage, surrogate, aggregation, KL);
- ``peers_sampling``: the rows of the sampling-side axes (importance sampling, masks, entropy, overlong, batch);
- ``objective``: AXES, equivalents, peer_settings and objective_card (what the manifest stores);
- ``text``: card_lines, the card as plain text lines (what ``grpolab card`` prints);
- ``recorded``: upgrade_manifest, a recorded run's manifest in today's form (resume's comparison, ``grpolab card``).

May import: config, rewards, training, baselines. Imported by: runs, cli.
"""

from ..rewards import stop_rule
from .formula import formula, policy_loss
from .objective import AXES, code_extraction, equivalents, objective_card, peer_settings
from .peers import EXACT, NEAREST, NONE, OPENRLHF_NO_REWARD_CLIP, PEER_VERSIONS, STD_EPS, VERL_NO_DUAL_CLIP

__all__ = [
    "AXES",
    "EXACT",
    "NEAREST",
    "NONE",
    "OPENRLHF_NO_REWARD_CLIP",
    "PEER_VERSIONS",
    "STD_EPS",
    "VERL_NO_DUAL_CLIP",
    "code_extraction",
    "equivalents",
    "formula",
    "objective_card",
    "peer_settings",
    "policy_loss",
    "stop_rule",
]
