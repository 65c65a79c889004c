"""train.strategy: how the policy's weights, gradients and optimizer state live on the data-parallel ranks.

- ``ddp``: every rank holds all weights; gradients are summed over the ranks after each minibatch
  (grpolab.training.distributed.all_reduce_gradients) -- the default, and the only strategy of a single process.
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer and on the root; each rank keeps 1/W of
  the weights, gradients and AdamW state, and FSDP gathers a layer's weights for its forward/backward and
  reduce-scatters its gradients. FSDP averages gradients over the ranks; the aggregation weights are already those
  of the whole batch (grpolab.algo.aggregation), so each rank's loss is scaled by W (`loss_scale`) and the average
  is the sum, the gradient of the global loss.

Under fsdp2 the training passes run the plain path (one model call per micro-batch: the shared-prompt and packed
paths call the embedding and decoder modules directly, outside the FSDP root's forward); the sampler and the
reference keep their own full copies, synced from full tensors gathered by name; checkpoints hold the full state
(weights and optimizer, gathered to rank 0), so a run resumes under either strategy's same world size.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Strategy(StrEnum):
    DDP = "ddp"
    FSDP2 = "fsdp2"


def check_shardable(cfg, world, policy: torch.nn.Module) -> None:
    """fsdp2 needs several processes (torchrun) and a plain (non-LoRA) policy; one line naming the field otherwise."""
    from ..errors import ConfigError

    if not world.distributed:
        raise ConfigError(
            "train.strategy: fsdp2 shards over data-parallel processes; launch with torchrun "
            "--nproc-per-node N (or grpolab train --nproc N), or use ddp in one process"
        )
    if hasattr(policy, "peft_config"):
        raise ConfigError(
            "train.strategy: fsdp2 with model.lora is not supported yet; use ddp (LoRA's trainable "
            "weights are small enough to replicate)"
        )


def shard(policy: torch.nn.Module) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (embeddings, final norm and LM head -- tied weights stay in one
    unit); gradients summed, not averaged, over the ranks."""
    for layer in policy.get_decoder().layers:
        fully_shard(layer)
    fully_shard(policy)
    return policy


def loss_scale(sharded: bool, world_size: int) -> int:
    """What a rank's loss is multiplied by before backward: W under fsdp2 (FSDP's average becomes the sum), else 1.

    >>> loss_scale(True, 4), loss_scale(False, 4)
    (4, 1)
    """
    return world_size if sharded else 1


def full_model_state(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights on CPU (a collective: every rank calls it; every rank gets them)."""
    return get_model_state_dict(policy, options=FULL)


def full_optimizer_state(policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The full AdamW state keyed by parameter name (a collective)."""
    return get_optimizer_state_dict(policy, optimizer, options=FULL)


def load_full_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optim_state: dict
) -> None:
    """Each rank takes its shards of full weights and optimizer state (every rank passes the same full dicts)."""
    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(policy, weights, options=opts)
    set_optimizer_state_dict(policy, optimizer, optim_state, options=opts)
