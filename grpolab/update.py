"""The policy update of one rollout batch: mu passes x minibatches (one optimizer step each) x micro-batches.

Aggregation weights are computed over each whole minibatch before it is split into micro-batches, so the
gradient does not depend on micro_batch_size. Old logprobs (pi_old, the policy that sampled) are the
detached current logprobs when mu = 1 and minibatches = 1 -- exact, since no update has happened yet --
and otherwise come from one no-grad pass before the first update.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from .algo.aggregation import token_weights
from .algo.importance import ISParams, is_weights, mismatch_stats
from .algo.kl import KLPlacement
from .algo.loss import ObjectiveParams, objective
from .algo.surrogate import ClipParams
from .config import Config
from .forward import completion_logprobs
from .rollout.base import Rollout


class PolicyUpdater:
    def __init__(self, cfg: Config, policy, reference, optimizer, scheduler):
        a = cfg.algorithm
        self.cfg, self.policy, self.reference = cfg, policy, reference
        self.optimizer, self.scheduler = optimizer, scheduler
        self.params = ObjectiveParams(
            surrogate=a.surrogate, clip=ClipParams(a.eps_low, a.eps_high, a.dual_clip_c), beta=a.beta,
            kl_estimator=a.kl_estimator, kl_in_loss=a.kl_placement == KLPlacement.LOSS, entropy_coef=a.entropy_coef,
        )
        self.is_params = ISParams(c_max=a.is_c_max, c_min=a.is_c_min)
        self.temperature = cfg.rollout.temperature
        self.share_prompt, self.pack = cfg.train.share_prompt, cfg.train.pack_completions
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient, over the whole run

    @torch.no_grad()
    def logprobs_no_grad(self, model, rollout: Rollout, precision: str) -> torch.Tensor:
        """[N, Lc] logprobs of every completion token under `model` (micro-batched, no graph)."""
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        for rows in torch.arange(len(rollout)).split(self.cfg.train.micro_batch_size):
            fo = completion_logprobs(model, rollout, rows, self.temperature, precision, share_prompt=self.share_prompt,
                                     pack=self.pack)
            out[rows, fo.cols] = fo.logp.float()
        return out

    def loss_mask(self, rollout: Rollout, valid: torch.Tensor) -> torch.Tensor:
        mask = rollout.completion_mask.clone()
        mask[~valid] = 0
        if self.cfg.algorithm.mask_truncated:
            mask[rollout.truncated] = 0
        return mask

    def update(self, rollout: Rollout, advantages: torch.Tensor, valid: torch.Tensor,
               ref_logp: torch.Tensor | None = None, old_logp: torch.Tensor | None = None) -> dict[str, float]:
        """One rollout batch's update; ref/old logprobs are computed here unless the caller already has them."""
        cfg = self.cfg
        t = cfg.train
        mask = self.loss_mask(rollout, valid)
        if self.reference is not None and ref_logp is None:
            ref_logp = self.logprobs_no_grad(self.reference, rollout, "fp32")
        reuse_old = t.mu == 1 and t.minibatches == 1 and old_logp is None
        old_all = old_logp if reuse_old or old_logp is not None else self.logprobs_no_grad(self.policy, rollout, t.precision)
        sums: dict[str, float] = defaultdict(float)
        mismatch: dict[str, list[torch.Tensor]] = defaultdict(list)
        n = len(rollout)
        for it in range(t.mu):
            order = self.group_order(rollout) if t.minibatches > 1 else torch.arange(n)
            for mb in order.chunk(t.minibatches):
                weights = token_weights(mask[mb], cfg.algorithm.aggregation, cfg.l_max)
                self.optimizer.zero_grad(set_to_none=True)
                finite = True
                for start in range(0, len(mb), t.micro_batch_size):
                    rows = mb[start : start + t.micro_batch_size]
                    fo = completion_logprobs(self.policy, rollout, rows, self.temperature, t.precision, with_entropy=True,
                                             entropy_grad=cfg.algorithm.entropy_coef != 0, share_prompt=self.share_prompt,
                                             pack=self.pack)
                    c = fo.cols
                    m = mask[rows][:, c]
                    old = fo.logp.detach() if reuse_old else old_all[rows][:, c]
                    sampler = rollout.sampler_logprobs[rows][:, c]
                    isw = is_weights(old, sampler, m, cfg.algorithm.is_mode, self.is_params)
                    terms = objective(
                        fo.logp, old, None if ref_logp is None else ref_logp[rows][:, c], advantages[rows],
                        weights[start : start + len(rows)][:, c], isw, m, self.params, fo.entropy,
                    )
                    total = terms.total.item()
                    finite = finite and math.isfinite(total)
                    if finite:  # a NaN/Inf loss skips this optimizer step anyway: no backward needed
                        terms.total.backward()
                    mf = m.float()
                    sums["loss/policy"] += terms.policy
                    sums["loss/kl"] += terms.kl
                    sums["loss/total"] += total
                    sums["kl_tok"] += terms.kl_token_sum
                    sums["clip_low"] += terms.clip_low_count
                    sums["clip_high"] += terms.clip_high_count
                    sums["tokens"] += terms.token_count
                    sums["entropy"] += (fo.entropy * mf).sum().item()
                    sums["approx_kl_old"] += (0.5 * (fo.logp.detach() - old) ** 2 * mf).sum().item()
                    sums["signal_tokens"] += (mf * (advantages[rows] != 0).unsqueeze(-1)).sum().item()
                    if it == 0:
                        sel = m.bool()
                        mismatch["old"].append(old[sel])
                        mismatch["sampler"].append(sampler[sel])
                        mismatch["w"].append(isw[sel])
                sums["grad_norm"] += self.optimizer_step(finite)
                sums["optimizer_steps"] += 1
        out = self._summarise(sums, mismatch)
        out["optim/skipped_steps"] = float(self.skipped_steps)
        return out

    def group_order(self, rollout: Rollout) -> torch.Tensor:
        """A random order of the rows that keeps each group's rows together (so prompts can be shared)."""
        g = self.cfg.rollout.group_size
        groups = torch.randperm(len(rollout) // g)
        return (groups.unsqueeze(1) * g + torch.arange(g)).flatten()

    def optimizer_step(self, finite_loss: bool = True) -> float:
        """Clip, step the optimizer and the LR schedule. A non-finite loss or gradient norm skips the step
        (counted in self.skipped_steps; returns NaN or the non-finite norm) and leaves weights, optimizer
        moments and the LR schedule untouched."""
        if not finite_loss:
            norm = math.nan
        else:
            clip = self.cfg.train.grad_clip or float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), clip).item()
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            return norm
        self.optimizer.step()
        self.scheduler.step()
        return norm

    @staticmethod
    def _summarise(sums: dict[str, float], mismatch: dict[str, list[torch.Tensor]]) -> dict[str, float]:
        steps = max(sums["optimizer_steps"], 1)
        tokens = max(sums["tokens"], 1)
        out = {
            "loss/policy": sums["loss/policy"] / steps, "loss/kl": sums["loss/kl"] / steps,
            "loss/total": sums["loss/total"] / steps, "policy/kl": sums["kl_tok"] / tokens,
            "policy/entropy": sums["entropy"] / tokens, "policy/clip_frac_low": sums["clip_low"] / tokens,
            "policy/clip_frac_high": sums["clip_high"] / tokens, "policy/approx_kl_old": sums["approx_kl_old"] / tokens,
            "loss/signal_token_frac": sums["signal_tokens"] / tokens, "optim/grad_norm": sums["grad_norm"] / steps,
        }
        if mismatch["old"]:
            old, sampler, w = (torch.cat(mismatch[k]) for k in ("old", "sampler", "w"))
            out.update(mismatch_stats(old, sampler, torch.ones_like(old), w))
        return out
