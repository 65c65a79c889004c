"""The worker side of the ``gloo`` weight-transfer backend (grpolab_vllm's docstring; docs/vllm.md).

vLLM's RL API drives it: ``/init_weight_transfer_engine`` joins the trainer's process group (the trainer is rank 0
and holds the TCPStore; this worker is ``rank_offset`` + its rank in the server), ``/start_weight_update`` opens
vLLM's layerwise reload, ``/update_weights`` receives each named tensor by a gloo broadcast from rank 0 and loads it
with the model's ``load_weights``, ``/finish_weight_update`` finalises the reload (CPU-prepacked weights rebuilt).
The group is vLLM's own stateless gloo group (``stateless_init_torch_distributed_process_group``); every collective
is bounded by ``timeout_s``. The trainer side is grpolab.rollout.weight_transfer.GlooSender (plain torch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes: expected one entry each per tensor, got "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Dense checkpoint-format weights over a gloo broadcast, loaded through vLLM's layerwise reload."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        p = self.parallel_config
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        self.shutdown()
        self.group = stateless_init_torch_distributed_process_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            backend="gloo",
            timeout=timedelta(seconds=init_info.timeout_s),
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes an accelerator after receiving; a CPU has none to wait for
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer: /init_weight_transfer_engine was not called")
        stream = self._received(update_info)
        try:
            self.model.load_weights(stream)
        finally:  # every announced tensor is received even when loading fails (another model): the trainer's
            for _ in stream:  # broadcasts complete and the error reaches it at once, not after the group's timeout
                pass

    def _received(self, info: GlooUpdateInfo) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor as it arrives from rank 0 (a broadcast per tensor, in the order the trainer announced)."""
        for name, dtype_name, shape in zip(info.names, info.dtype_names, info.shapes):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
            self.group.broadcast(tensor, 0).wait()
            yield name, tensor

    def shutdown(self) -> None:
        if self.group is not None:
            from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None
