"""Reward models: Bradley-Terry training on preference pairs (`grpolab rm train`; docs/reward_models.md).

loss.py: the pairwise loss, pair accuracy and its interval; pairs.py: pairs from JSONL or from a task's samples and
verifier (training problems only); train.py: the training loop and the run directory. Scoring with a trained model
is the `model` reward (grpolab.rewards.model).

May import: evaluation, training (distributed, metrics), rewards, models, tasks. Imported by: the CLI.
"""

from .loss import bradley_terry_loss, pair_accuracy_interval, pair_outcomes
from .pairs import PreferencePair, load_pairs_jsonl
from .train import RMSettings, train_reward_model

__all__ = [
    "PreferencePair",
    "RMSettings",
    "bradley_terry_loss",
    "load_pairs_jsonl",
    "pair_accuracy_interval",
    "pair_outcomes",
    "train_reward_model",
]
