"""Packing a micro-batch of whole groups for one training pass: no padding of completions to the longest.

Completion i of group j (length L_i) becomes one *segment* of L_i slots:

    inputs  [q_last, o_0, ..., o_{L_i - 2}]      (q_last = the last prompt token)
    targets [o_0, o_1, ..., o_{L_i - 1}]         (what each slot's logits predict)
    position ids  len(q_j) - 1 + t,  t = 0 .. L_i - 1

Segments are placed into rows of S = max_i L_i slots by first-fit decreasing, never mixing prompts in a row, so
a row holds several short completions where padding would hold one. Every row attends to its group's prompt
(minus the last token, run once per group and cached) and, inside the row, each slot sees only the earlier slots
of its own segment: the block-causal mask below. The logits of slot t of segment i are therefore exactly those
of position t of completion i in the plain padded pass (tested to float64 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) of total length <= capacity; the longest items are placed first, each into
    the first bin with room. Items of length 0 are left out."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


@dataclass
class PackedRows:
    """R rows of S slots. ids/targets/seg/pos [R, S] (seg = completion row, -1 and pos -1 on pad slots);
    group [R]: the prompt (group index in the micro-batch) of each row; row/col [K] and slot ([K], [K]): real
    slot k fills completion row[k], column col[k] and sits at slot[0][k], slot[1][k] of the packed rows."""

    ids: torch.Tensor
    targets: torch.Tensor
    seg: torch.Tensor
    pos: torch.Tensor
    group: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    slot: tuple[torch.Tensor, torch.Tensor]


def pack_completions(
    comp_ids: torch.Tensor, cmask: torch.Tensor, last_prompt_token: torch.Tensor, prompt_of_row: torch.Tensor
) -> PackedRows:
    """comp_ids/cmask [N, Lc] (masks 1 on a prefix), last_prompt_token [P], prompt_of_row [N] in 0..P-1."""
    lengths = cmask.sum(-1).tolist()
    capacity = max(max(lengths), 1)
    placed: list[tuple[int, int, int]] = []  # (completion row, packed row, offset)
    groups: list[int] = []
    prompt_of = prompt_of_row.tolist()
    for j in range(len(last_prompt_token)):
        rows = [i for i, p in enumerate(prompt_of) if p == j]
        for members in first_fit_decreasing([lengths[i] for i in rows], capacity):
            offset = 0
            for m in members:
                placed.append((rows[m], len(groups), offset))
                offset += lengths[rows[m]]
            groups.append(j)
    n_rows = max(len(groups), 1)
    ids = torch.zeros((n_rows, capacity), dtype=torch.long)
    targets, seg, pos = ids.clone(), ids - 1, ids - 1
    row_idx, col_idx, r_idx, s_idx = [], [], [], []
    for i, r, off in placed:
        n = lengths[i]
        t = torch.arange(n)
        ids[r, off] = last_prompt_token[prompt_of[i]]
        ids[r, off + 1 : off + n] = comp_ids[i, : n - 1]
        targets[r, off : off + n] = comp_ids[i, :n]
        seg[r, off : off + n], pos[r, off : off + n] = i, t
        row_idx.append(torch.full((n,), i))
        col_idx.append(t)
        r_idx.append(torch.full((n,), r))
        s_idx.append(off + t)
    cat = lambda xs: torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long)  # noqa: E731
    return PackedRows(
        ids, targets, seg, pos, torch.tensor(groups or [0]), cat(row_idx), cat(col_idx), (cat(r_idx), cat(s_idx))
    )


def block_causal_mask(prompt_mask: torch.Tensor, seg: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[R, 1, S, Lq + S] bool (True = attend): slot q sees the real tokens of its row's prompt prompt_mask [R, Lq]
    and slot k of the same segment with pos[k] <= pos[q]. Every slot also sees itself, so a pad slot's row of the
    mask is never empty (an empty row gives NaN, whose gradient would poison the whole batch)."""
    same = (seg.unsqueeze(2) == seg.unsqueeze(1)) & (seg.unsqueeze(2) >= 0)
    causal = pos.unsqueeze(1) <= pos.unsqueeze(2)
    own = same & causal | torch.eye(seg.shape[1], dtype=torch.bool)
    prompt = prompt_mask.bool().unsqueeze(1).expand(-1, seg.shape[1], -1)
    return torch.cat([prompt, own], dim=2).unsqueeze(1)
