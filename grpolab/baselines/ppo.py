"""PPO with a learned critic (algorithm.estimator = gae) on GRPO's code path: the same trainer, rollouts, rewards,
reference, policy update (grpolab.training.update, with per-token advantages), checkpoints and resume.

One step (docs/design.md section 2, with the advantage step replaced):

    collect (grpolab.training.batch: problems -> completions -> rewards; its group advantages are not used)
      -> old logprobs, reference logprobs (beta > 0), values V_t (critic, no grad)
      -> token rewards r_t = -beta kl_t (+ R at the last model token)        [KL in the reward: kl_placement reward]
      -> GAE(gamma, lambda) -> A_t, returns G_t -> [whiten A over the batch]  (grpolab.algo.gae)
      -> critic update: mu x minibatches steps of the clipped value loss      (grpolab.baselines.critic)
      -> policy update: the clipped surrogate with A_t per token              (grpolab.training.update)

``GAEStep`` is the advantage step of the estimator ``gae``, registered here in the trainer's estimator registry
(grpolab.training.estimators; grpolab.runs imports this module, so `grpolab train` with
``--set algorithm.estimator=gae``, `grpolab train --resume` and `grpolab baseline ppo` all run it). Everything
else -- logging, evaluation, checkpoints, Ctrl-C, exact resume -- is the Trainer's, and the checkpoint's trainer
state carries the value model and its optimizer (``state_dict``). With kl_placement = loss (and beta > 0) the KL
stays in the loss instead, as verl's use_kl_loss does.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..algo.gae import gae, masked_moments, token_rewards, whiten
from ..algo.kl import KLPlacement, token_kl
from ..config import Config
from ..errors import ConfigError
from ..training.distributed import all_reduce_sum
from ..training.estimators import (
    AdvantageContext,
    EstimatorModels,
    EstimatorSpec,
    OldLogprobs,
    register_estimator,
    reward_kl_penalty,
)
from ..training.group_rules import GroupRelative
from ..training.update import minibatch_groups
from .critic import Critic


def check_ppo_config(cfg: Config) -> None:
    """What PPO cannot run with, refused before anything loads."""
    if cfg.train.strategy == "fsdp2":
        raise ConfigError("algorithm.estimator: gae (PPO) runs with train.strategy ddp; fsdp2 shards only the policy")


def critic_minibatches(cfg: Config, positions: list[int], num_groups: int, step: int) -> list[list[torch.Tensor]]:
    """This rank's rows of every minibatch of every pass, in the policy update's order (``positions``: each local
    group's index among the batch's global groups)."""
    t, g = cfg.train, cfg.rollout.group_size
    where = {pos: i for i, pos in enumerate(positions)}
    return [
        [
            torch.tensor([where[p] * g + k for p in chunk if p in where for k in range(g)], dtype=torch.long)
            for chunk in minibatch_groups(num_groups, t.minibatches, t.seed, step, it)
        ]
        for it in range(t.mu)
    ]


class GAEStep:
    """The PPO advantage step (module docstring): replaces batch.advantages by per-token GAE advantages, trains the
    critic, and returns the (ref, old) logprobs it computed for the policy update."""

    def __init__(self, models: EstimatorModels):
        self.cfg = models.cfg
        self.critic = Critic(
            models.cfg, models.policy, models.model_path, models.device, models.world, precision=models.precision
        )

    def prepare(self, ctx: AdvantageContext) -> OldLogprobs:
        a, batch, t0 = self.cfg.algorithm, ctx.batch, time.perf_counter()
        rollout = batch.rollout
        ref = ctx.updater.logprobs_no_grad(ctx.reference, rollout, "fp32") if ctx.reference is not None else None
        old = ctx.old_logprobs()
        values = self.critic.values(rollout)
        t1 = time.perf_counter()
        mask = ctx.loss_mask()
        in_reward = ref is not None and a.kl_placement == KLPlacement.REWARD
        kl = token_kl(old, ref, a.kl_estimator) if in_reward else None
        rewards = torch.nan_to_num(batch.scores.rewards, nan=0.0).to(mask.device)  # invalid rows are masked out anyway
        est = gae(token_rewards(rewards, kl, mask, a.beta), values, mask, a.gamma, a.lam)
        adv = (
            whiten(est.advantages, mask, all_reduce_sum(masked_moments(est.advantages, mask), ctx.world))
            if a.whiten
            else est.advantages
        )
        minibatches = critic_minibatches(self.cfg, batch.positions, batch.num_groups, ctx.step)
        metrics = self.critic.update(rollout, values, est.returns, mask, minibatches)
        t2 = time.perf_counter()
        if kl is not None:
            kl_sum = (kl.double() * mask).sum().item()
            metrics["reward/kl_penalty/mean"] = reward_kl_penalty(kl_sum, len(rollout), a.beta, ctx.world, mask.device)
        m = mask.double()
        # over every rank's tokens
        sums = all_reduce_sum(
            torch.stack([(est.advantages * m).sum(), (est.returns * m).sum(), m.sum()]).double(), ctx.world
        )
        metrics.update(
            {
                "ppo/adv_raw_mean": (sums[0] / sums[2].clamp(min=1)).item(),
                "ppo/return_mean": (sums[1] / sums[2].clamp(min=1)).item(),
                "time/values_s": t1 - t0,
                "time/critic_update_s": t2 - t1,
            }
        )
        batch.metrics.update(metrics)
        batch.advantages = adv
        return ref, old

    def state_dict(self) -> dict[str, Any]:
        """The value model and its optimizer, under the checkpoint's ``critic`` key."""
        return {"critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])


register_estimator("gae", EstimatorSpec(GroupRelative.of, GAEStep, check_ppo_config))
