"""The policy update of one rollout batch: mu passes x minibatches (one optimizer step each) x micro-batches.

Over several data-parallel ranks (grpolab.training.distributed) each rank holds its own groups of every minibatch: the
aggregation counts and loss sums are all-reduced, the gradients summed over the ranks before each optimizer step,
and a non-finite loss on any rank skips the step on all of them.

Aggregation weights are computed over each whole minibatch before it is split into micro-batches, so the
gradient does not depend on micro_batch_size. Old logprobs (pi_old: the trainer's policy at the start of this
update, whose ratio the clip bounds; the policy that sampled is the behaviour policy q, the same weights only when
training is synchronous, and enters through the IS weight pi_old / q) are the detached current logprobs when mu = 1
and minibatches = 1 -- exact, since no update has happened yet -- and otherwise come from one no-grad pass before the
first update.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, fields

import torch

from ..algo.aggregation import batch_counts, token_weights
from ..algo.importance import ISParams, RejectParams, correction, correction_stats, mismatch_stats
from ..algo.kl import KLPlacement
from ..algo.loss import ObjectiveParams, objective
from ..algo.surrogate import ClipParams, PolicyLossParams, per_token
from ..config import Config
from ..models.load import eval_mode
from ..models.lora import runnable
from ..rollout.base import Rollout
from .distributed import World, all_reduce_gradients, all_reduce_max, all_reduce_sum, gather_objects, group_seed
from .forward import completion_logprobs, weight_casts_kept
from .loss_scale import make_scaler
from .precision import fp16_note
from .sharding import loss_scale

log = logging.getLogger("grpolab")

SUMMED = (
    "loss/policy",
    "loss/kl",
    "loss/total",
    "kl_tok",
    "clip_low",
    "clip_high",
    "tokens",
    "entropy",
    "approx_kl_old",
    "signal_tokens",
    "cov_selected",
    "offpolicy_masked_seqs",
    "sequences",
)  # per-step sums, added over the ranks before they are divided


# what the first pass records per trained token (the first 7) and per sequence with tokens (the last 3)
MISMATCH_KEYS = (
    "old",
    "sampler",
    "w",
    "log_ratio",
    "truncated",
    "masked",
    "rejected",
    "seq_truncated",
    "seq_masked",
    "seq_rejected",
)


@dataclass(frozen=True)
class UpdateBatch:
    """What every micro-batch of one rollout batch's update reads: per-row tensors over the N rollout rows."""

    rollout: Rollout
    advantages: torch.Tensor  # [N] per sequence (GRPO) or [N, Lc] per token (PPO)
    mask: torch.Tensor  # [N, Lc] the tokens trained on (PolicyUpdater.loss_mask)
    ref_logp: torch.Tensor | None  # [N, Lc] reference logprobs; None without a reference (beta = 0)
    old_logp: torch.Tensor | None  # [N, Lc] pi_old; None: each micro-batch's detached current logprobs


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward of a minibatch: its rollout rows and their aggregation weights, which were computed over
    the whole minibatch (so the gradient does not depend on micro_batch_size)."""

    rows: torch.Tensor  # [b] rollout rows
    weights: torch.Tensor  # [b, Lc] the aggregation weights of these rows


class PolicyUpdater:
    """``precision``: the update's resolved train.precision, "fp32", "bf16" or "fp16" (the Trainer passes its
    resolution; None: cfg.train.precision as given, where "auto" runs as fp32, as forward.autocast does). fp16 scales
    the loss (``self.scaler``, grpolab.training.loss_scale; None otherwise)."""

    def __init__(
        self, cfg: Config, policy, reference, optimizer, scheduler, world: World = World(), precision: str | None = None
    ):
        a = cfg.algorithm
        self.world = world
        self.cfg, self.policy, self.reference = cfg, policy, reference
        self.precision = precision or ("fp32" if cfg.train.precision == "auto" else cfg.train.precision)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.params = ObjectiveParams(
            surrogate=a.surrogate,
            clip=ClipParams(a.eps_low, a.eps_high, a.dual_clip_c),
            beta=a.beta,
            kl_estimator=a.kl_estimator,
            kl_in_loss=a.kl_placement == KLPlacement.LOSS,
            entropy_coef=a.entropy_coef,
            # every parameter by its name in algorithm.* (a new one needs no line here)
            policy_loss=PolicyLossParams(**{f.name: getattr(a, f.name) for f in fields(PolicyLossParams)}),
            offpolicy_mask_delta=a.offpolicy_mask_delta,
            kl_bias_correction=a.kl_bias_correction,
        )
        self.is_params = ISParams(c_max=a.is_c_max, c_min=a.is_c_min)
        self.reject_params = RejectParams(lo=a.is_reject_lo, hi=a.is_reject_hi)
        self.temperature = cfg.rollout.temperature
        self.sharded = cfg.train.strategy == "fsdp2"  # plain training passes: one root call per micro-batch
        self.share_prompt = cfg.speed.share_prompt and not self.sharded
        self.pack = cfg.speed.pack_completions
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient, over the whole run
        self.draws = selection_draws(cfg.train.seed, 0, world.rank)  # clip_cov / kl_cov; reseeded by each update
        self.scaler = make_scaler(self.precision, cfg.train.loss_scale_init, cfg.train.loss_scale_growth_interval)
        half = self.precision == "fp16" or cfg.rollout.dtype == "float16"
        fp16 = fp16_note(self.precision, cfg.rollout.dtype, next(policy.parameters()).device) if half else None
        for note in (inert_at_one_pass(cfg), fp16):
            if note:
                log.warning(note)

    @torch.no_grad()
    def logprobs_no_grad(self, model, rollout: Rollout, precision: str) -> torch.Tensor:
        """[N, Lc] logprobs of every completion token under `model` (micro-batched, no graph), in eval mode (no
        dropout: pi_old and the reference are deterministic); each module's mode is restored afterwards. A LoRA
        reference (grpolab.models.lora.AdapterOff) runs the policy with its adapters disabled."""
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32, device=rollout.completion_ids.device)
        chunks = list(torch.arange(len(rollout)).split(self.cfg.train.micro_batch_size))
        with runnable(model) as net, eval_mode(net), self.casts_kept(precision):
            for rows in self.lockstep(chunks, model is self.policy):
                if rows is None:
                    self.idle_pass(grad=False)
                    continue
                fo = completion_logprobs(
                    net, rollout, rows, self.temperature, precision, share_prompt=self.share_prompt, pack=self.pack
                )
                out[rows, fo.cols] = fo.logp.float()
        return out

    def lockstep(self, chunks: list, sharded_model: bool = True) -> list:
        """The micro-batches to run, padded with None up to the busiest rank's count when the model is FSDP2-sharded:
        FSDP2 runs collectives in every forward and backward, so every rank must make as many calls."""
        if not (self.sharded and sharded_model):
            return chunks
        busiest = int(all_reduce_max(torch.tensor([float(len(chunks))]), self.world).item())
        return chunks + [None] * (busiest - len(chunks))

    def idle_pass(self, grad: bool) -> None:
        """A one-token pass of the sharded policy whose loss is multiplied by 0: it takes part in FSDP2's collectives
        and changes no gradient."""
        device = next(self.policy.parameters()).device
        with torch.set_grad_enabled(grad):
            logits = self.policy(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device)).logits
            if grad:
                (logits.float().sum() * 0.0).backward()

    def loss_mask(self, rollout: Rollout, valid: torch.Tensor) -> torch.Tensor:
        """The tokens trained on: the rollout's loss mask (an agent episode's model tokens, not its environment
        tokens; the completion mask otherwise), without invalid rows (and truncated ones with mask_truncated)."""
        mask = rollout.trained_mask().clone()
        mask[~valid] = 0
        if self.cfg.algorithm.mask_truncated:
            mask[rollout.truncated] = 0
        return mask

    def update(
        self,
        rollout: Rollout,
        advantages: torch.Tensor,
        valid: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        old_logp: torch.Tensor | None = None,
        positions: list[int] | None = None,
        num_groups: int | None = None,
        step: int = 0,
    ) -> dict[str, float]:
        """One rollout batch's update; ref/old logprobs are computed here unless the caller already has them.
        advantages: [N] per sequence (GRPO: broadcast over its tokens) or [N, Lc] per token (PPO: grpolab.baselines.ppo).

        positions / num_groups: where this rank's groups stand among the batch's groups over all ranks (default:
        this rank holds the whole batch). Minibatches are drawn over the global groups, so every rank takes the
        same optimizer steps on the same global minibatches, whatever its own share."""
        t, g = self.cfg.train, self.cfg.rollout.group_size
        positions = list(range(len(rollout) // g)) if positions is None else positions
        num_groups = len(positions) if num_groups is None else num_groups
        mask = self.loss_mask(rollout, valid)
        if self.reference is not None and ref_logp is None:
            ref_logp = self.logprobs_no_grad(self.reference, rollout, "fp32")
        if old_logp is None and self.cfg.algorithm.pi_old == "sampler":  # pi_old is q (verl's bypass mode)
            old_logp = rollout.sampler_logprobs
        elif old_logp is None and not (t.mu == 1 and t.minibatches == 1):  # else the detached current logprobs
            old_logp = self.logprobs_no_grad(self.policy, rollout, self.precision)
        sums: dict[str, float] = defaultdict(float)
        mismatch: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.draws = selection_draws(t.seed, step, self.world.rank)
        batch = UpdateBatch(rollout, advantages, mask, ref_logp, old_logp)
        where = {pos: i for i, pos in enumerate(positions)}
        for it in range(t.mu):
            for chunk in minibatch_groups(num_groups, t.minibatches, t.seed, step, it):
                mb = torch.tensor(
                    [where[pos] * g + k for pos in chunk if pos in where for k in range(g)], dtype=torch.long
                )
                finite = self.minibatch(batch, mb, sums, mismatch if it == 0 else None)
                bad = all_reduce_max(torch.tensor([0.0 if finite else 1.0]), self.world)
                if not self.sharded:  # fsdp2 reduce-scatters the gradients itself (grpolab.training.sharding)
                    all_reduce_gradients([q for q in self.policy.parameters() if q.requires_grad], self.world)
                sums["grad_norm"] += self.optimizer_step(bool(bad.item() == 0))
                sums["optimizer_steps"] += 1
        out = self._summarise(sums, mismatch, self.world)
        out["optim/skipped_steps"] = float(self.skipped_steps)
        out.update(self.scaler.metrics() if self.scaler is not None else {})
        a = self.cfg.algorithm
        if a.surrogate not in ("clip_cov", "kl_cov"):  # no covariance selection: a metric that is 0 by construction
            out.pop("policy/cov_selected_frac")
        if not a.offpolicy_mask_delta:  # off-policy sequence masking off
            out.pop("sampler/offpolicy_masked_seq_frac")
        return out

    def minibatch(self, batch: UpdateBatch, mb: torch.Tensor, sums: dict[str, float], mismatch: dict | None) -> bool:
        """Accumulate the gradient of this rank's rows `mb` of one minibatch, micro-batch by micro-batch, with the
        aggregation weights of the whole minibatch (its counts summed over the ranks); False when a loss is not
        finite (the step will be skipped, so no backward is run after it; the later forwards still add their
        metrics)."""
        cfg, size = self.cfg, self.cfg.train.micro_batch_size
        g = cfg.rollout.group_size
        counts = all_reduce_sum(batch_counts(batch.mask[mb], g), self.world)
        weights = token_weights(batch.mask[mb], cfg.algorithm.aggregation, cfg.l_max, counts, g)
        micro_batches = [
            MicroBatch(mb[start : start + size], weights[start : start + size]) for start in range(0, len(mb), size)
        ]
        self.optimizer.zero_grad(set_to_none=True)
        finite = True
        with self.casts_kept(self.precision):
            for micro in self.lockstep(micro_batches):
                if micro is None:  # a rank with fewer rows: an idle pass for FSDP2's collectives
                    self.idle_pass(grad=True)
                    continue
                loss = self.micro_batch(batch, micro, sums, mismatch)
                finite = finite and math.isfinite(loss.item())
                if finite:  # a NaN/Inf loss skips this optimizer step anyway: no backward needed
                    loss = loss if self.scaler is None else self.scaler.scaled(loss)  # fp16: S * loss
                    (loss * loss_scale(self.sharded, self.world.size)).backward()
        return finite

    def casts_kept(self, precision: str):
        """bf16 casts of the weights made once per optimizer step (forward.weight_casts_kept); not with FSDP2, whose
        gathered weights are not the leaves autocast caches."""
        device = next(self.policy.parameters()).device
        return weight_casts_kept("fp32" if self.sharded else precision, device)

    def micro_batch(
        self, batch: UpdateBatch, micro: MicroBatch, sums: dict[str, float], mismatch: dict | None
    ) -> torch.Tensor:
        """Forward of one micro-batch: returns its loss (a scalar with its graph; the caller runs the backward) and
        adds its loss terms and token statistics to `sums` (and its IS-mismatch tokens to `mismatch`, if given)."""
        cfg, rollout, rows = self.cfg, batch.rollout, micro.rows
        fo = completion_logprobs(
            self.policy,
            rollout,
            rows,
            self.temperature,
            self.precision,
            with_entropy=True,
            entropy_grad=cfg.algorithm.entropy_coef != 0,
            share_prompt=self.share_prompt,
            pack=self.pack,
        )
        c = fo.cols
        m = batch.mask[rows][:, c]
        old = fo.logp.detach() if batch.old_logp is None else batch.old_logp[rows][:, c]
        # the behaviour policy q_full: the sampler's untruncated softmax(logits / T), so that top_p < 1 / top_k > 0 do
        # not shift the IS weight by the kept mass (grpolab.algo.importance); the sampler's own logprobs otherwise
        sampler = rollout.untruncated_logprobs()[rows][:, c]
        a = cfg.algorithm
        corr = correction(sampler, old, m, a.is_mode, self.is_params, a.is_reject, self.reject_params)
        isw = corr.weights
        advantages = batch.advantages  # per token [N, Lc] or per sequence [N]
        adv = advantages[rows][:, c] if advantages.dim() == 2 else advantages[rows]
        terms = objective(
            fo.logp,
            old,
            None if batch.ref_logp is None else batch.ref_logp[rows][:, c],
            adv,
            micro.weights[:, c],
            isw,
            m,
            self.params,
            fo.entropy,
            behaviour_logp=sampler,
            generator=self.draws,
        )
        mf = m.float()
        for key, value in (
            ("loss/policy", terms.policy),
            ("loss/kl", terms.kl),
            ("loss/total", terms.total.item()),
            ("kl_tok", terms.kl_token_sum),
            ("clip_low", terms.clip_low_count),
            ("clip_high", terms.clip_high_count),
            ("tokens", terms.token_count),
            ("entropy", (fo.entropy * mf).sum().item()),
            ("approx_kl_old", (0.5 * (fo.logp.detach() - old) ** 2 * mf).sum().item()),
            ("signal_tokens", (mf * per_token(adv != 0, mf)).sum().item()),
            ("cov_selected", terms.cov_selected_count),
            ("offpolicy_masked_seqs", terms.offpolicy_masked_seqs),
            ("sequences", terms.sequence_count),
        ):
            sums[key] += value
        if mismatch is not None:
            self.record_mismatch(mismatch, corr, old, sampler, m)
        return terms.total

    @staticmethod
    def record_mismatch(mismatch: dict, corr, old: torch.Tensor, sampler_full: torch.Tensor, m: torch.Tensor) -> None:
        """The first pass's trained tokens (and sequences with tokens) for the sampler/* metrics: the numeric mismatch
        against the untruncated sampler (like with like), the correction's weights and flags."""
        sel = m.bool()
        rows = sel.any(-1)
        rejected = corr.rejected.unsqueeze(-1).expand_as(sel)
        for key, value in (
            ("old", old[sel]),
            ("sampler", sampler_full[sel]),  # like with like
            ("w", corr.weights[sel]),
            ("log_ratio", corr.log_ratio[sel]),
            ("truncated", corr.truncated[sel]),
            ("masked", corr.masked[sel]),
            ("rejected", rejected[sel]),
            ("seq_truncated", corr.truncated.any(-1)[rows]),
            ("seq_masked", corr.masked.any(-1)[rows]),
            ("seq_rejected", corr.rejected[rows]),
        ):
            mismatch[key].append(value.detach())

    def optimizer_step(self, finite_loss: bool = True) -> float:
        """Unscale (fp16), clip, step the optimizer and the LR schedule. A non-finite loss or gradient norm skips the
        step (returns NaN or the non-finite norm) and leaves weights, optimizer moments and the LR schedule
        untouched; it is counted in self.skipped_steps, except an fp16 gradient overflow, which halves the loss
        scale instead (counted by the scaler; grpolab.training.loss_scale)."""
        if not finite_loss:
            norm = math.nan
        else:
            if self.scaler is not None:
                self.scaler.unscale_(self.policy.parameters())
            clip = self.cfg.train.grad_clip or float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), clip).item()
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            if not (finite_loss and self.scaler is not None and self.scaler.overflowed()):
                self.skipped_steps += 1
            return norm
        self.optimizer.step()
        self.scheduler.step()
        if self.scaler is not None:
            self.scaler.stepped()
        return norm

    @staticmethod
    def _summarise(sums: dict[str, float], mismatch: dict[str, list[torch.Tensor]], world: World) -> dict[str, float]:
        """Step metrics from the sums of every rank (loss terms are already weighted by the whole batch, so their
        sum over ranks is the loss; token counts and statistics are summed, then divided)."""
        total = all_reduce_sum(torch.tensor([float(sums[k]) for k in SUMMED], dtype=torch.float64), world).tolist()
        sums = {**sums, **dict(zip(SUMMED, total))}
        steps = max(sums["optimizer_steps"], 1)
        tokens = max(sums["tokens"], 1)
        out = {
            "loss/policy": sums["loss/policy"] / steps,
            "loss/kl": sums["loss/kl"] / steps,
            "loss/total": sums["loss/total"] / steps,
            "policy/kl": sums["kl_tok"] / tokens,
            "policy/entropy": sums["entropy"] / tokens,
            "policy/clip_frac_low": sums["clip_low"] / tokens,
            "policy/clip_frac_high": sums["clip_high"] / tokens,
            "policy/approx_kl_old": sums["approx_kl_old"] / tokens,
            "loss/signal_token_frac": sums["signal_tokens"] / tokens,
            "optim/grad_norm": sums["grad_norm"] / steps,
            "policy/cov_selected_frac": sums["cov_selected"] / tokens,
            "sampler/offpolicy_masked_seq_frac": sums["offpolicy_masked_seqs"] / max(sums["sequences"], 1),
        }
        keys = MISMATCH_KEYS
        local = [torch.cat(mismatch[k]).cpu() if mismatch[k] else torch.zeros(0) for k in keys]
        parts = gather_objects(local, world)
        got = dict(zip(keys, (torch.cat([part[i] for part in parts]) for i in range(len(keys)))))
        if got["old"].numel():
            out.update(mismatch_stats(got["old"], got["sampler"], torch.ones_like(got["old"]), got["w"]))
            flags = [got[k].bool() for k in keys[4:]]
            out.update(correction_stats(got["log_ratio"], *flags))
        return out


def minibatch_groups(num_groups: int, minibatches: int, seed: int, step: int, iteration: int) -> list[list[int]]:
    """The global groups of each minibatch of one pass: one minibatch of all groups in order, or a random order
    (drawn from (seed, step, pass), the same on every rank) cut into `minibatches` chunks.

    >>> minibatch_groups(4, 1, 0, 0, 0)
    [[0, 1, 2, 3]]
    >>> sorted(sum(minibatch_groups(4, 2, 0, 0, 0), []))
    [0, 1, 2, 3]
    """
    if minibatches == 1:
        return [list(range(num_groups))]
    order = torch.randperm(num_groups, generator=torch.Generator().manual_seed(group_seed(seed, step, -1 - iteration)))
    return [c.tolist() for c in order.chunk(minibatches)]


def selection_draws(seed: int, step: int, rank: int) -> torch.Generator:
    """The stream of Clip-Cov's and KL-Cov's draws in one update (grpolab.algo.surrogate): seeded from (train.seed,
    step, rank), so a run and its resume draw the same; a stream of its own (the minibatch orders use -1 - pass)."""
    return torch.Generator().manual_seed(group_seed(seed, step, -(1 << 20) - rank))


def inert_at_one_pass(cfg: Config) -> str | None:
    """The warning for KL-Cov with train.mu = 1 and train.minibatches = 1, else None. pi_old is then the policy being
    trained (update: its detached log-probabilities), r = 1 at every token and |log r| has gradient 0 there: the
    KL-Cov term does nothing and the update is plain policy gradient -r A (no clip). Warned when the updater is built
    (once a run, before the first step), not by the config checks: those raise ConfigError only and run on every
    config load (presets, the card, manifest diff, resume), and the run is valid -- it does less than its name says,
    as the clip does at mu = 1."""
    t = cfg.train
    if cfg.algorithm.surrogate != "kl_cov" or t.mu > 1 or t.minibatches > 1:
        return None
    return (
        "algorithm.surrogate kl_cov with train.mu 1 and train.minibatches 1: the ratio r is 1 at every token and "
        "|log r| has gradient 0 there, so the KL-Cov term does nothing (the update is plain policy gradient); set "
        "train.mu >= 2 or train.minibatches >= 2 for it to act"
    )
