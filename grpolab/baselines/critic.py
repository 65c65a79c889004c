"""The value model of PPO (algorithm.estimator = gae): a scalar head on a transformer backbone, its optimizer, its
update and its checkpoint state.

- **backbone**: by default a copy of the policy's backbone (the base model's decoder, loaded again from the model
  path: the same weights the policy starts from, no LM head), trained by its own AdamW -- what TRL's old
  PPOTrainer, verl and OpenRLHF do by default (a separate critic model initialised from the policy or a reward
  model). ``critic.share_backbone: true`` puts the head on the policy's own decoder: no second copy of the
  weights; the value loss then also moves the shared backbone, through the critic's own AdamW state.
- **head**: Linear(hidden, 1), initialised to zero, so V = 0 before the first update (the first advantages are the
  discounted returns).
- **values**: V_t for completion token t is the head applied to the hidden state of the position that predicts
  token t (the position whose logits give log pi(o_t)), as TRL and verl take values[:, -L-1:-1].
- **update**: train.mu passes x train.minibatches optimizer steps per batch (the policy's schedule), token-mean
  clipped value loss (grpolab.algo.gae.clipped_value_loss) over each whole minibatch, gradient clipping at
  critic.grad_clip, constant learning rate critic.lr.

The value passes are plain padded forwards (no shared prompt / packing): the critic does not reuse the policy's
training-pass levers, which is part of what benchmarks/ppo_vs_grpo.py measures.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from ..algo.aggregation import Aggregation, batch_counts, token_weights
from ..algo.gae import clipped_value_loss, explained_variance
from ..config import Config
from ..models.load import eval_mode, load_causal_lm
from ..rollout.base import Rollout
from ..training.distributed import World, all_reduce_gradients, all_reduce_sum
from ..training.forward import _trim, autocast


class ValueModel(torch.nn.Module):
    """backbone (a decoder returning last_hidden_state) + Linear(hidden, 1) head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, keep: int) -> torch.Tensor:
        """[b, keep] values of the last `keep` positions' hidden states."""
        h = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return self.head(h[:, -keep:]).squeeze(-1).float()


def completion_values(
    model: ValueModel, rollout: Rollout, rows: torch.Tensor, precision: str
) -> tuple[torch.Tensor, slice]:
    """([b, Lc'] V_t of the completion tokens of `rows`, the completion columns they cover): one padded pass of
    [left-padded prompt | completion]; the value of token t is read at the position that predicts it."""
    first, lc = _trim(rollout, rows)
    pmask, cmask = rollout.prompt_mask[rows, first:], rollout.completion_mask[rows, :lc]
    input_ids = torch.cat([rollout.prompt_ids[rows, first:], rollout.completion_ids[rows, :lc]], dim=1)
    attn = torch.cat([pmask, torch.ones_like(cmask)], dim=1)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with autocast(precision, input_ids.device):
        v = model(input_ids[:, :-1], attn[:, :-1], position_ids[:, :-1], lc)
    return v, slice(0, lc)


class Critic:
    """The value model, its AdamW, and its update (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        policy: torch.nn.Module,
        model_path: str,
        device: torch.device,
        world: World = World(),
        precision: str | None = None,
    ):
        """``precision``: the update's resolved precision ("fp32"/"bf16"; the trainer resolves train.precision's auto),
        else cfg.train.precision."""
        self.cfg, self.world = cfg, world
        self.precision = precision or cfg.train.precision
        c = cfg.critic
        if c.share_backbone:
            backbone = policy.get_decoder()
        else:
            backbone = load_causal_lm(model_path, cfg.model.dtype).get_decoder()
        hidden = policy.config.hidden_size if hasattr(policy, "config") else backbone.config.hidden_size
        self.model = ValueModel(backbone, hidden).to(device)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=c.lr, weight_decay=0.0, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2)
        )

    @torch.no_grad()
    def values(self, rollout: Rollout) -> torch.Tensor:
        """[N, Lc] float32 V_t of every completion token (micro-batched, eval mode)."""
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32, device=rollout.completion_ids.device)
        with eval_mode(self.model):
            for rows in torch.arange(len(rollout)).split(self.cfg.train.micro_batch_size):
                v, cols = completion_values(self.model, rollout, rows, self.precision)
                out[rows, cols] = v
        return out

    def update(
        self,
        rollout: Rollout,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        minibatches: list[list[torch.Tensor]],
    ) -> dict[str, float]:
        """train.mu x train.minibatches steps on the clipped value loss; ``minibatches``: for each pass, the rows of
        each minibatch (the policy's, grpolab.training.update.minibatch_groups). Returns value/* metrics of the whole batch
        (summed over the ranks; value/grad_norm is of the all-reduced gradient)."""
        t = self.cfg.train
        sums = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "grad_norm": 0.0, "steps": 0.0}
        for passes in minibatches:
            for mb in passes:
                counts = all_reduce_sum(batch_counts(mask[mb]), self.world)
                weights = token_weights(mask[mb], Aggregation.TOKEN_MEAN, 1, counts)
                self.optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(mb), t.micro_batch_size):
                    rows = mb[start : start + t.micro_batch_size]
                    v, c = completion_values(self.model, rollout, rows, self.precision)
                    out = clipped_value_loss(
                        v.double(), old_values[rows][:, c].double(), returns[rows][:, c], self.cfg.critic.value_clip
                    )
                    w, m = weights[start : start + len(rows)][:, c], mask[rows][:, c].double()
                    loss = (w * out.loss).sum()
                    loss.backward()
                    sums["loss"] += loss.item()
                    sums["clipped"] += (out.clipped.double() * m).sum().item()
                    sums["tokens"] += m.sum().item()
                all_reduce_gradients(self.params, self.world)
                sums["grad_norm"] += self.step()
                sums["steps"] += 1
        # every metric is of the whole batch: each rank's loss is its share of the global token mean (the weights
        # count every rank's tokens), so the ranks' losses add up to it
        value_sum = (old_values.double() * mask).sum().item()
        total = all_reduce_sum(
            torch.tensor(
                [sums["loss"], sums["clipped"], sums["tokens"], value_sum, mask.sum().item()],
                dtype=torch.float64,
                device=mask.device,
            ),
            self.world,
        )
        steps = max(sums["steps"], 1)
        return {
            "value/loss": total[0].item() / steps,
            "value/clip_frac": (total[1] / total[2].clamp(min=1)).item(),
            "value/grad_norm": sums["grad_norm"] / steps,
            "value/explained_var": explained_variance(
                old_values, returns, mask, partial(all_reduce_sum, world=self.world)
            ),
            "value/mean": (total[3] / total[4].clamp(min=1)).item(),
        }

    def step(self) -> float:
        """Clip and step; a non-finite gradient norm skips the step (returns the norm)."""
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.critic.grad_clip or float("inf")).item()
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the head (and the backbone copy unless it is the policy's) and the optimizer."""
        weights = self.model.head.state_dict() if self.cfg.critic.share_backbone else self.model.state_dict()
        return {
            "weights": {k: v.detach().cpu().clone() for k, v in weights.items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        target = self.model.head if self.cfg.critic.share_backbone else self.model
        target.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
