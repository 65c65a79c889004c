"""DAPO soft overlong punishment: a length-dependent reward component (Yu et al. 2025, eq. 13)."""

from __future__ import annotations


def soft_overlong_penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """R_len = 0 if L <= L_max - buffer; -factor * (L - (L_max - buffer)) / buffer if L_max - buffer < L <= L_max;
    -factor beyond L_max. buffer = 0 turns it off.

    >>> soft_overlong_penalty(10, 64, 16)
    0.0
    >>> soft_overlong_penalty(56, 64, 16)
    -0.5
    >>> soft_overlong_penalty(64, 64, 16, factor=2.0)
    -2.0
    """
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return -factor * min(1.0, (length - (max_len - buffer)) / buffer)
