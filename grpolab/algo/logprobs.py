"""Token log-probabilities and entropy from logits, a cache-sized chunk of rows at a time.

For each row of logits (one position), with z = logits / T computed in float32 or wider:
    l = log_softmax(z),  log p = l[token],  H = -sum_v e^{l_v} l_v.
Gradients (upstream g for log p, h for H; p = softmax(z)):
    d log p / d logits_v = (1[v = token] - p_v) / T
    d H / d logits_v     = -p_v (l_v + H) / T
The forward keeps only the logits and the log-normaliser of each row; the backward recomputes each chunk's
softmax, so no float32 tensor of every row's vocabulary is built or kept (with bf16 logits, half the memory
held for the backward).
On a CPU a chunk is about 1 MiB of float32, so it stays in the core's cache across its passes; on a GPU chunks are
large (few launches). Speed: docs/performance.md, "Levers" (log-probabilities a chunk at a time).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

CHUNK_BYTES = 1 << 20  # CPU: float32 working set of one chunk, fits a core's L2 cache
ACCELERATOR_CHUNK_BYTES = 256 << 20  # GPU: few, large chunks (each chunk is several kernel launches)


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """z = logits / T in float32 or wider (a new tensor unless float32 logits at T = 1)."""
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return z if temperature == 1.0 else z / temperature


def chunk_rows(vocab: int, device: torch.device | None = None) -> int:
    """Rows per chunk: CHUNK_BYTES of float32 on a CPU (ACCELERATOR_CHUNK_BYTES elsewhere), at least one row."""
    budget = CHUNK_BYTES if device is None or device.type == "cpu" else ACCELERATOR_CHUNK_BYTES
    return max(1, budget // (4 * vocab))


class _TokenLogprobs(torch.autograd.Function):
    """(log p [N], H [N]) of rows [N, V] of logits and their tokens [N]; see the module docstring."""

    @staticmethod
    def forward(ctx, logits, ids, temperature):
        n, vocab = logits.shape
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        logp, entropy, lse = (torch.empty(n, dtype=wide, device=logits.device) for _ in range(3))
        step = chunk_rows(vocab, logits.device)
        for s in range(0, n, step):
            z = scaled_logits(logits[s : s + step], temperature)
            ls = torch.log_softmax(z, -1)
            logp[s : s + step] = ls.gather(-1, ids[s : s + step, None]).squeeze(-1)
            top, at = ls.max(-1, keepdim=True)  # log-normaliser read at each row's largest logit: exact, finite
            lse[s : s + step] = (z.gather(-1, at) - top).squeeze(-1)
            entropy[s : s + step] = -(ls.exp().mul_(ls)).sum(-1)
        ctx.save_for_backward(logits, ids, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, g_logp, g_entropy):
        logits, ids, lse, entropy = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty_like(logits)
        n, vocab = logits.shape
        step = chunk_rows(vocab, logits.device)
        for s in range(0, n, step):
            ls = scaled_logits(logits[s : s + step], temperature) - lse[s : s + step, None]  # log p_v
            p = ls.exp()
            if g_entropy is not None:  # -h p (l + H)
                ls.add_(entropy[s : s + step, None]).mul_(p).mul_(-g_entropy[s : s + step, None])
            else:
                ls.zero_()
            if g_logp is not None:  # g (1[v = token] - p)
                g = g_logp[s : s + step, None]
                ls.sub_(p.mul_(g)).scatter_add_(-1, ids[s : s + step, None], g.to(ls.dtype))
            grad[s : s + step] = ls.div_(temperature) if temperature != 1.0 else ls
        return grad, None, None


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[token]: [..., V] x [...] -> [...], computed in float32 or wider."""
    return logprobs_and_entropy(logits, token_ids, temperature)[0]


def logprobs_and_entropy(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(token), H or None) of logits [..., V] and tokens [...]: the formulas of the module docstring.

    The entropy has no graph unless entropy_grad.
    """
    shape = token_ids.shape
    logp, entropy = _TokenLogprobs.apply(logits.reshape(-1, logits.shape[-1]), token_ids.reshape(-1), temperature)
    if not with_entropy:
        return logp.view(shape), None
    return logp.view(shape), (entropy if entropy_grad else entropy.detach()).view(shape)
