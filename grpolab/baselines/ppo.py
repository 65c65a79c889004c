"""PPO with a learned critic (algorithm.estimator = gae) on GRPO's code path: the same rollouts, rewards, reference,
policy update (grpolab.training.update, with per-token advantages), checkpoints and resume.

One step (docs/design.md section 2, with the advantage step replaced):

    collect (grpolab.training.batch: problems -> completions -> rewards; its group advantages are not used)
      -> old logprobs, reference logprobs (beta > 0), values V_t (critic, no grad)
      -> token rewards r_t = -beta kl_t (+ R at the last model token)        [KL in the reward: kl_placement reward]
      -> GAE(gamma, lambda) -> A_t, returns G_t -> [whiten A over the batch]  (grpolab.algo.gae)
      -> critic update: mu x minibatches steps of the clipped value loss      (grpolab.baselines.critic)
      -> policy update: the clipped surrogate with A_t per token              (grpolab.training.update)

``PPOTrainer`` is a ``Trainer`` whose ``kl_in_reward`` hook computes all of this: everything else -- logging,
evaluation, checkpoints, Ctrl-C, exact resume -- is the Trainer's, and the checkpoint's trainer state carries the
value model and its optimizer. ``trainer_class(cfg)`` picks the class, so `grpolab train` with
``--set algorithm.estimator=gae``, `grpolab train --resume` and `grpolab baseline ppo` all run this one path.
With kl_placement = loss (and beta > 0) the KL stays in the loss instead, as verl's use_kl_loss does.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from ..algo.gae import gae, masked_moments, token_rewards, whiten
from ..algo.kl import KLPlacement, token_kl
from ..config import Config
from ..errors import ConfigError
from ..models import checkpoint as ckpt
from ..training.batch import Batch
from ..training.distributed import all_reduce_sum
from ..training.trainer import Trainer
from ..training.update import minibatch_groups
from .critic import Critic


def trainer_class(cfg: Config) -> type[Trainer]:
    """The trainer of a config: PPOTrainer for algorithm.estimator = gae, else the GRPO Trainer."""
    return PPOTrainer if cfg.algorithm.estimator == "gae" else Trainer


class PPOTrainer(Trainer):
    def __init__(self, cfg: Config, run_dir: Path, *args: Any, **kwargs: Any):
        if cfg.train.strategy == "fsdp2":
            raise ConfigError(
                "algorithm.estimator: gae (PPO) runs with train.strategy ddp; fsdp2 shards only the policy"
            )
        super().__init__(cfg, run_dir, *args, **kwargs)
        try:
            self.critic = Critic(
                self.cfg, self.policy, self.model_path, self.device, self.world, precision=self.update_precision
            )
        except BaseException:
            self.close()  # put the process-wide settings back, as a failed Trainer build does
            raise

    def kl_in_reward(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The PPO advantage step (module docstring): replaces batch.advantages by per-token GAE advantages, trains
        the critic, and returns the (ref, old) logprobs it computed for the policy update."""
        a, rollout, t0 = self.cfg.algorithm, batch.rollout, time.perf_counter()
        ref = self.updater.logprobs_no_grad(self.reference, rollout, "fp32") if self.reference is not None else None
        old = self.updater.logprobs_no_grad(self.policy, rollout, self.update_precision)
        values = self.critic.values(rollout)
        t1 = time.perf_counter()
        mask = self.updater.loss_mask(rollout, ~batch.scores.invalid)
        in_reward = ref is not None and a.kl_placement == KLPlacement.REWARD
        kl = token_kl(old, ref, a.kl_estimator) if in_reward else None
        rewards = torch.nan_to_num(batch.scores.rewards, nan=0.0).to(mask.device)  # invalid rows are masked out anyway
        est = gae(token_rewards(rewards, kl, mask, a.beta), values, mask, a.gamma, a.lam)
        adv = (
            whiten(est.advantages, mask, all_reduce_sum(masked_moments(est.advantages, mask), self.world))
            if a.whiten
            else est.advantages
        )
        metrics = self.critic.update(rollout, values, est.returns, mask, self.critic_minibatches(batch))
        t2 = time.perf_counter()
        if kl is not None:
            penalty = all_reduce_sum(
                torch.tensor(
                    [a.beta * (kl.double() * mask).sum().item(), float(len(rollout))],
                    dtype=torch.float64,
                    device=mask.device,
                ),
                self.world,
            )
            metrics["reward/kl_penalty/mean"] = (penalty[0] / penalty[1].clamp(min=1)).item()
        m = mask.double()
        sums = all_reduce_sum(
            torch.stack([(est.advantages * m).sum(), (est.returns * m).sum(), m.sum()]).double(), self.world
        )  # over every rank's tokens
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

    def critic_minibatches(self, batch: Batch) -> list[list[torch.Tensor]]:
        """This rank's rows of every minibatch of every pass, in the policy update's order."""
        t, g = self.cfg.train, self.cfg.rollout.group_size
        where = {pos: i for i, pos in enumerate(batch.positions)}
        return [
            [
                torch.tensor([where[p] * g + k for p in chunk if p in where for k in range(g)], dtype=torch.long)
                for chunk in minibatch_groups(batch.num_groups, t.minibatches, t.seed, self.step, it)
            ]
            for it in range(t.mu)
        ]

    def samples(self, batch: Batch) -> list[dict[str, Any]]:
        """The Trainer's samples, with each completion's mean per-token advantage as its advantage."""
        adv = batch.advantages
        if adv.dim() == 2:
            m = batch.rollout.completion_mask.to(adv.dtype)
            adv = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
        return super().samples(dataclasses.replace(batch, advantages=adv))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "critic": self.critic.state_dict()}

    def load(self, path: Path) -> None:
        super().load(path)
        self.critic.load_state_dict(ckpt.load_state(path)["critic"])
