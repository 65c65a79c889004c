"""Prepacked weights for the decode loop on a CPU (`prepacked_linears`, the decode loop's ``prepack`` switch).

A decode step multiplies a few rows (G per prompt) by every weight matrix of the model. Called as ``F.linear``,
the CPU BLAS re-packs each weight into its blocked layout on every call, work that a handful of rows cannot amortise
(measured: packing once makes the whole decode step 0.62-0.78x as long, docs/performance.md). oneDNN can reorder a
weight into its blocked layout once (``torch.ops.mkldnn._reorder_linear_weight``) and multiply against that copy
afterwards (``torch.ops.mkldnn._linear_pointwise``): the same sum y = x W^T + b, accumulated in another order (equal
to float32 rounding, tested), the path torch.compile's CPU backend takes for a frozen float32 linear layer.

The weights change after every optimizer step, so the packed copies live for one decode call: made after the
prefill, dropped when the loop ends (one extra copy of the linear weights, in memory only while decoding). Used only
where it was measured to pay (float32 weights on a CPU with oneDNN, benchmarks/decode_floor.py); any other model,
dtype or device is decoded as it is.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch


def prepack_available(model: torch.nn.Module) -> bool:
    """float32 weights on a CPU, and a torch built with oneDNN."""
    p = next(model.parameters(), None)
    return (p is not None and p.device.type == "cpu" and p.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b with W given in oneDNN's blocked layout (`packed`); x [..., in] -> y [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@contextmanager
def prepacked_linears(model: torch.nn.Module, rows: int, enabled: bool = True) -> Iterator[int]:
    """Within the block, every plain ``nn.Linear`` of `model` (exactly that class, with no forward of its own set on
    the instance) computes its product against a copy of its weight packed once for `rows` rows; on exit the modules
    are as they were, whatever happened. Yields how many layers were packed (0 when not `enabled` or not
    `prepack_available`)."""
    patched: list[torch.nn.Module] = []
    try:
        if enabled and prepack_available(model):
            for module in model.modules():
                if type(module) is torch.nn.Linear and "forward" not in module.__dict__:
                    packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
                    bias = None if module.bias is None else module.bias.detach()
                    module.forward = partial(packed_linear, packed, bias)
                    patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
