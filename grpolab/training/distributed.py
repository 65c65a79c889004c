"""Data parallelism over N processes launched by `torchrun` (torch.distributed: gloo on CPU, nccl on CUDA).

The contract (docs/scaling.md):

- whole groups live on one rank: the step's prompts are drawn identically on every rank (same prompt sampler,
  same seed) and rank k owns the global groups k, k + W, k + 2W, ... (`owned_groups`);
- each group's sampling randomness comes from its own generator seeded by (seed, step, global group index)
  (`group_seed`), never from the rank, so the samples of a run do not depend on the number of ranks;
- every statistic the objective takes over the batch is global: rewards, lengths and truncation flags are
  gathered (`gather_rows`), aggregation denominators and loss sums are all-reduced, gradients are summed over the
  ranks after each minibatch (the weights are already global, so the sum *is* the gradient of the global loss);
- decisions (dynamic sampling, skipping a non-finite step) are taken on gathered data, so every rank takes the
  same number of optimizer steps and no collective can hang;
- rank 0 writes the run directory.

A single process is the world of size 1: every function here is then a no-op or the identity.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..rollout.base import Ranks


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_world(device: torch.device) -> World:
    """The process group of a `torchrun` launch (RANK / WORLD_SIZE / LOCAL_RANK set), else the world of one.

    Backend: nccl when the run's device is CUDA, gloo otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def owned_groups(num_groups: int, world: World) -> list[int]:
    """The global group indices rank `world.rank` samples and trains: k, k + W, k + 2W, ...

    >>> owned_groups(5, World(rank=1, size=2))
    [1, 3]
    """
    return list(range(world.rank, num_groups, world.size))


def group_seed(seed: int, step: int, group: int) -> int:
    """The seed of one group's sampling stream: a hash of (seed, step, global group index), so it is the same
    whichever rank samples the group.

    >>> group_seed(0, 1, 2) == group_seed(0, 1, 2) != group_seed(0, 1, 3)
    True
    """
    return int.from_bytes(hashlib.sha256(f"grpolab:{seed}:{step}:{group}".encode()).digest()[:8], "little") >> 1


def all_reduce_sum(t: torch.Tensor, world: World) -> torch.Tensor:
    """Sum of `t` over the ranks (in place; `t` itself for one process)."""
    if world.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def gather_objects(obj, world: World) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not world.distributed:
        return [obj]
    out = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def gather_rows(local: torch.Tensor, owned: list[int], num_groups: int, group_size: int, world: World) -> torch.Tensor:
    """The global group-major [num_groups * group_size, ...] tensor from each rank's rows of its owned groups."""
    if not world.distributed:
        return local
    parts = gather_objects((owned, local.cpu()), world)
    out = torch.empty((num_groups * group_size, *local.shape[1:]), dtype=local.dtype)
    for groups, rows in parts:
        for i, g in enumerate(groups):
            out[g * group_size : (g + 1) * group_size] = rows[i * group_size : (i + 1) * group_size]
    return out.to(local.device)


def all_reduce_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Sum every gradient over the ranks, in one flat buffer (a missing gradient counts as zeros)."""
    if not world.distributed:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads)):
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def engine_ranks(world: World) -> Ranks:
    """The world as the rollout engine sees it (grpolab.rollout.base.Ranks)."""
    return Ranks(world.rank, world.size, lambda obj: gather_objects(obj, world))


def resolve_device(setting: str) -> torch.device:
    """train.device -> the device of this process: auto = cuda when available, else cpu; under torchrun on CUDA
    each rank takes cuda:LOCAL_RANK (an explicit cuda:N is kept)."""
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda":
        setting = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if setting.startswith("cuda"):
        from ..errors import ConfigError

        if not torch.cuda.is_available():
            raise ConfigError(
                f"train.device: {setting} asked for, but torch sees no CUDA device (torch "
                f"{torch.__version__}; set train.device=cpu or install a CUDA build of torch)"
            )
        torch.cuda.set_device(torch.device(setting))
    return torch.device(setting)
