"""The built-in rewards by name (config ``reward.weights``) and the names other packages ask about.

The reward model, the LLM judge and a user's functions are not entries here: ``RewardSet``
(grpolab.rewards.reward_set) adds them when the config weights them.
"""

from __future__ import annotations

from grpolab.rewards.code import code_reward_specs
from grpolab.rewards.math import format_reward, task_correctness_reward
from grpolab.rewards.spec import RewardSpec, env_reward

REWARD_FUNCTIONS: dict[str, RewardSpec] = {
    "correct": RewardSpec(
        task_correctness_reward,
        "the task's own checker on the extracted answer where it has one (reasoning-gym: its score_answer), else 1.0 "
        "if the last boxed answer (or last number) equals the gold answer",
        takes_problem=True,
    ),
    "format": RewardSpec(format_reward, "1.0 if the completion contains \\boxed{"),
    "env": RewardSpec(
        env_reward, "an agent environment's reward() at the end of the episode (grpolab.agents)", takes_problem=True
    ),
    **{name: RewardSpec(**kwargs) for name, kwargs in code_reward_specs().items()},
}
CODE_REWARDS = ("pass_fraction", "all_pass")
# The component that says whether a completion is right, in order of preference: dynamic sampling judges a group's
# signal by it (grpolab.training.batch) and the report's hacking checks compare bonuses and length against it. `env` is an
# agent environment's verdict on the episode's end state, the one component an agent task allows.
CORRECTNESS_REWARDS = ("correct", "all_pass", "pass_fraction", "env")
