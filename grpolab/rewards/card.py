"""The reward part of the objective card (grpolab.card), and the stop rule the run's rewards call for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from grpolab.rewards.code import EXTRACTION_RULE
from grpolab.rewards.registry import CODE_REWARDS, REWARD_FUNCTIONS
from grpolab.rewards.spec import RewardSpec
from grpolab.rollout.stop import resolve_stop_rule

if TYPE_CHECKING:
    from grpolab.config import Config


def reward_card(weights: Mapping[str, float], specs: Mapping[str, RewardSpec] | None = None) -> dict[str, Any]:
    """The reward part of the objective card: each weighted reward's description and weight and, with a code
    reward, the rule by which code is extracted from a completion."""
    specs = specs or REWARD_FUNCTIONS
    card: dict[str, Any] = {
        "components": {
            name: {"weight": w, "description": specs[name].description if name in specs else "user reward"}
            for name, w in weights.items()
        }
    }
    if any(name in CODE_REWARDS for name in weights):
        card["code_extraction"] = EXTRACTION_RULE
    return card


def stop_rule(cfg: "Config") -> str:
    """The run's rollout.stop_rule (grpolab.rollout.stop.resolve_stop_rule): ``auto`` is code_block when the run
    weights a code reward -- it reads the first Python block (EXTRACTION_RULE), so nothing after that block is
    sampled -- else none."""
    reads_first_code_block = any(name in CODE_REWARDS for name in cfg.reward.weights)
    return resolve_stop_rule(cfg.rollout.stop_rule, reads_first_code_block)
