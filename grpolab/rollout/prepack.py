"""Prepacked weights for the decode loop on a CPU (`prepacked_linears`, the decode loop's ``prepack`` switch).

A decode step multiplies a few rows by every weight matrix; called as ``F.linear``, the CPU BLAS re-packs each weight
into its blocked layout on every call, work a handful of rows cannot amortise. oneDNN reorders each weight once
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplies against that copy (``_linear_pointwise``): the same
y = x W^T + b, summed in another order (equal to float32 rounding, tested). The weights change every optimizer step,
so the packed copies live for one decode call (one extra copy of the linear weights while decoding).

Taken for float32 weights on a CPU with oneDNN and for bfloat16 ones on a CPU with bf16 units; anything else -- or a
model with a linear weight of another dtype or device than its first parameter, or one oneDNN refuses -- decodes as
it is (all or nothing). Measurements: docs/performance.md, "Weights packed once per decode call".
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch


def cpu_has_bf16_units() -> bool:
    """The CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), as torch reports it."""
    checks = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(check is not None and check() for check in checks)


def prepack_available(model: torch.nn.Module) -> bool:
    """A torch built with oneDNN, weights on a CPU, and float32 weights -- or bfloat16 ones on a CPU with bf16 units
    (where oneDNN packs them; elsewhere bf16 products are conversions, and the precision probe samples in fp32)."""
    p = next(model.parameters(), None)
    if p is None or p.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return p.dtype == torch.float32 or (p.dtype == torch.bfloat16 and cpu_has_bf16_units())


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
        for module, packed in _packed_weights(model, rows) if enabled and prepack_available(model) else []:
            bias = None if module.bias is None else module.bias.detach()
            module.forward = partial(packed_linear, packed, bias)
            patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward


def _packed_weights(model: torch.nn.Module, rows: int) -> list[tuple[torch.nn.Linear, torch.Tensor]]:
    """(layer, its weight packed by oneDNN for `rows` rows) for every plain nn.Linear; none at all if one has another
    dtype or device than the model's first parameter, or if oneDNN refuses one (the model then decodes as it is)."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in m.__dict__]
    first = next(model.parameters())
    if any(m.weight.dtype != first.dtype or m.weight.device != first.device for m in linears):
        return []  # prepack_available judged the first parameter's dtype and device: it must speak for every layer
    try:
        return [(m, reorder_for_rows(m.weight.detach(), rows)) for m in linears]
    except RuntimeError:
        return []


def reorder_for_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout for products of `rows` rows (RuntimeError where it refuses)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)
