"""The advantage estimator of a run, one registry keyed by algorithm.estimator (docs/design.md section 4).

An estimator has two parts, both run by the trainer's step in this order:

- ``group`` (grpolab.training.group_rules), at collection: the sequence-level advantages of the rewards and which
  groups carry signal. ``group``, ``gae`` and ``distill`` use the group-relative family (baseline, scaling: a
  ``batch_mean`` baseline is one of its registered baselines, grpolab.algo.advantages), ``pass_at_k`` its pass@k rule;
- ``prepare(ctx)``, between collection and the policy update: what replaces or adjusts those advantages, given an
  ``AdvantageContext`` (the batch, the no-grad forward passes, the models it reads; never the Trainer). It returns
  the (reference, pi_old) log-probabilities it computed, which the update then reuses instead of computing again.

Registered here: ``group``, ``pass_at_k``, ``maxrl`` and ``gdpo`` (``GroupStep``: the KL folded into the reward
when algorithm.kl_placement is reward, advantages recomputed -- the config refuses that for the last three) and ``distill`` (``DistillStep``: the teacher's per-token
advantages, grpolab.training.distill). ``gae`` (PPO's critic and GAE) is registered by grpolab.baselines.ppo, which
the entry points (grpolab.runs, so the CLI and grpolab.api) import.

An estimator that keeps state across steps (PPO's critic) returns it from ``state_dict``; the trainer's checkpoint
holds it beside its own state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from ..algo.kl import KLPlacement, token_kl
from ..config import Config
from ..config.schema import AlgorithmConfig
from ..errors import ConfigError
from .attention import use_training_attention
from .batch import Batch
from .distill import check_distill_config, distill_advantages, distill_metrics, distill_sums, load_teacher
from .distributed import World, all_reduce_sum
from .group_rules import GDPO, GroupRelative, GroupRule, MaxRL, PassAtK
from .update import PolicyUpdater

OldLogprobs = tuple[torch.Tensor | None, torch.Tensor | None]
"""(reference log-probabilities, pi_old's) an estimator computed for the update, None where it computed none."""


@dataclass
class EstimatorModels:
    """What an estimator is built from: the config, the policy and its tokenizer, where the policy came from, the
    device, the ranks, the update's resolved precision and whether the policy's attention is the fp32-inside-bf16
    kernel (a second model scores with the same kernels)."""

    cfg: Config
    policy: torch.nn.Module
    tokenizer: Any
    model_path: str
    device: torch.device
    world: World
    precision: str
    fp32_attention: bool


@dataclass
class AdvantageContext:
    """One step's advantage step: the collected batch (its advantages, rewards and metrics are updated in place),
    the updater (its no-grad forward passes and loss mask), the policy and the reference (None without one), the
    ranks, the step index, and ``regroup``: the batch's group advantages recomputed over every rank after its
    rewards changed (BatchCollector.global_advantages)."""

    batch: Batch
    updater: PolicyUpdater
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    precision: str
    world: World
    step: int
    regroup: Callable[[Batch], torch.Tensor]

    def old_logprobs(self) -> torch.Tensor:
        """pi_old's log-probabilities of the sampled tokens (the policy before this step's update, no grad)."""
        return self.updater.logprobs_no_grad(self.policy, self.batch.rollout, self.precision)

    def loss_mask(self) -> torch.Tensor:
        """[N, T] the trained tokens of the valid rows."""
        return self.updater.loss_mask(self.batch.rollout, ~self.batch.scores.invalid)


class AdvantageStep(Protocol):
    def prepare(self, ctx: AdvantageContext) -> OldLogprobs: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator: ``group`` its collection rule from the algorithm config; ``check`` refuses the
    settings it cannot run with before anything loads; ``build`` makes its step at the end of the trainer's build."""

    group: Callable[[AlgorithmConfig], GroupRule]
    build: Callable[[EstimatorModels], AdvantageStep]
    check: Callable[[Config], None] = lambda cfg: None


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_estimator(name: str, spec: EstimatorSpec) -> None:
    ESTIMATORS[name] = spec


def estimator_spec(cfg: Config) -> EstimatorSpec:
    """The registered estimator of algorithm.estimator (ConfigError naming it when none is registered)."""
    name = cfg.algorithm.estimator
    if name not in ESTIMATORS:
        hint = " (registered by grpolab.baselines.ppo: import it, as grpolab.runs does)" if name == "gae" else ""
        raise ConfigError(f"algorithm.estimator: expected one of {sorted(ESTIMATORS)}, got {name!r}{hint}")
    return ESTIMATORS[name]


def reward_kl_penalty(kl_sum: float, rows: int, beta: float, world: World, device: torch.device | None = None) -> float:
    """reward/kl_penalty/mean: beta * the folded KL summed over every rank's rows / their number (the sums are
    reduced on `device`: the one the ranks' collectives run on)."""
    penalty = all_reduce_sum(torch.tensor([beta * kl_sum, float(rows)], dtype=torch.float64, device=device), world)
    return (penalty[0] / penalty[1].clamp(min=1)).item()


class GroupStep:
    """``group`` and ``pass_at_k``: the collected advantages stand; with the KL placed in the reward (beta > 0,
    kl_placement reward): R_i <- R_i - beta * sum_t kl(pi_old || pi_ref), the advantages recomputed over the batch."""

    def __init__(self, algorithm: AlgorithmConfig):
        self.a = algorithm

    def prepare(self, ctx: AdvantageContext) -> OldLogprobs:
        a, batch = self.a, ctx.batch
        if not (a.beta > 0 and a.kl_placement == KLPlacement.REWARD):
            return None, None
        ref = ctx.updater.logprobs_no_grad(ctx.reference, batch.rollout, "fp32")
        old = ctx.old_logprobs()
        # float64: no rounding that depends on how wide the rollout tensor is (it differs with the number of ranks)
        kl_seq = (token_kl(old, ref, a.kl_estimator).double() * batch.rollout.trained_mask()).sum(-1)
        batch.scores.rewards = batch.scores.rewards - a.beta * kl_seq.to(batch.scores.rewards.device)
        # reward/mean stays the task reward
        batch.metrics["reward/kl_penalty/mean"] = reward_kl_penalty(kl_seq.sum().item(), len(kl_seq), a.beta, ctx.world)
        batch.advantages = ctx.regroup(batch)
        return ref, old

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class DistillStep:
    """``distill``: on-policy distillation's advantage step (grpolab.training.distill). The teacher scores the
    sampled tokens; batch.advantages <- per-token log pi_T - log pi_old (+ distill.reward_weight x the group
    advantages); pi_old's log-probabilities go to the update, which uses the same ones."""

    def __init__(self, models: EstimatorModels):
        cfg = models.cfg
        self.reward_weight = cfg.distill.reward_weight
        self.teacher = load_teacher(cfg, models.tokenizer, models.model_path, models.device)
        if models.policy.config._attn_implementation != self.teacher.config._attn_implementation:
            use_training_attention(self.teacher, models.fp32_attention)  # the student's attention: the same kernels

    def prepare(self, ctx: AdvantageContext) -> OldLogprobs:
        t0, batch = time.perf_counter(), ctx.batch
        old = ctx.old_logprobs()
        teacher = ctx.updater.logprobs_no_grad(self.teacher, batch.rollout, ctx.precision)  # pi_old's numerics
        mask = ctx.loss_mask()
        group = batch.advantages.to(old.device)
        batch.advantages = distill_advantages(teacher, old, mask, group, self.reward_weight)
        sums = all_reduce_sum(distill_sums(teacher, old, mask).cpu(), ctx.world)
        batch.metrics.update({**distill_metrics(sums), "time/teacher_s": time.perf_counter() - t0})
        return None, old

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


register_estimator("group", EstimatorSpec(GroupRelative.of, lambda m: GroupStep(m.cfg.algorithm)))
register_estimator("pass_at_k", EstimatorSpec(PassAtK.of, lambda m: GroupStep(m.cfg.algorithm)))
register_estimator("maxrl", EstimatorSpec(MaxRL.of, lambda m: GroupStep(m.cfg.algorithm)))
register_estimator("gdpo", EstimatorSpec(GDPO.of, lambda m: GroupStep(m.cfg.algorithm)))
register_estimator("distill", EstimatorSpec(GroupRelative.of, DistillStep, check_distill_config))
