"""A run's recorded manifest in today's form, for a resume's comparison and for ``grpolab card RUN``.

A manifest records the config, the objective card and the judge as the version that wrote it saw them. Read today,
three things changed form, not meaning: the card once held the judge's identity and rubric sha256 and the reward
model's hashes (now the top-level ``judge`` record and ``hashes``); config fields added since are missing (built with
the value that continues the run as it began: grpolab.config.recorded_config); card entries added since describe
those fields and are missing too. A changed formula or a changed value stays a difference.
"""

from __future__ import annotations

from typing import Any

from ..config import from_dict, recorded_config, to_dict
from ..errors import ConfigError
from ..rewards.judge import judge_description

RM_CARD_KEYS = ("path", "template", "normalize", "normalization", "batch_size", "max_length")


def upgrade_manifest(m: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest ``m`` in today's form: the judge's identity and rubric hash under ``judge``, the card's judge
    and reward model entries as the config describes them, the config as a resume builds it (a config that no longer
    builds is left as recorded: the resume names its error). With ``current`` (today's manifest of the same run),
    the card entries ``m`` lacks are taken from it: they describe config fields compared in ``config``."""
    objective = dict(m.get("objective") or {})
    old_judge, old_rm = objective.get("judge"), objective.get("reward_model")
    if isinstance(old_judge, dict) and "rubric_sha256" in old_judge:
        reward = (m.get("config") or {}).get("reward") or {}
        objective["judge"] = judge_description(reward.get("judge") or {})
        m = {**m, "judge": {"identity": old_judge.get("judge"), "rubric_sha256": old_judge["rubric_sha256"]}}
    if isinstance(old_rm, dict) and "weights" in old_rm:
        objective["reward_model"] = {k: old_rm.get(k) for k in RM_CARD_KEYS}
    if isinstance(m.get("config"), dict):
        try:
            m = {**m, "config": to_dict(from_dict(recorded_config(m["config"])))}
        except ConfigError:
            pass
    choices, now = objective.get("choices"), ((current or {}).get("objective") or {}).get("choices")
    if isinstance(choices, dict) and isinstance(now, dict):
        objective["choices"] = {**{k: now[k] for k in now.keys() - choices.keys()}, **choices}
    return {**m, "objective": objective} if "objective" in m else m
