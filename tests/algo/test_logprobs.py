"""token_logprobs and the entropy of logprobs_and_entropy (grpolab.algo.logprobs) against naive float64 log-softmax loops."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.logprobs import logprobs_and_entropy, token_logprobs


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The entropy grpolab's training passes compute (token ids do not affect it)."""
    ids = torch.zeros(logits.shape[:-1], dtype=torch.long)
    return logprobs_and_entropy(logits, ids, temperature, with_entropy=True)[1]


def naive_logsoftmax_row(row: list[float], temperature: float) -> list[float]:
    z = [x / temperature for x in row]
    m = max(z)
    s = 0.0
    for v in z:
        s += math.exp(v - m)
    lse = m + math.log(s)
    return [v - lse for v in z]


def naive(logits: torch.Tensor, ids: torch.Tensor, temperature: float):
    """Returns (logp [B][T], entropy [B][T]) from the exact float64 widening of the logits."""
    lg = logits.double().tolist()
    tok = ids.tolist()
    lp, ent = [], []
    for b in range(len(lg)):
        lrow, erow = [], []
        for t in range(len(lg[b])):
            ls = naive_logsoftmax_row(lg[b][t], temperature)
            lrow.append(ls[tok[b][t]])
            h = 0.0
            for v in ls:
                h -= math.exp(v) * v
            erow.append(h)
        lp.append(lrow)
        ent.append(erow)
    return torch.tensor(lp, dtype=torch.float64), torch.tensor(ent, dtype=torch.float64)


def _inputs(seed: int, dtype, B=3, T=5, V=11, scale=3.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale + offset).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    return logits, ids


TEMPS = [1.0, 0.7, 1.3]


@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize("seed", range(3))
def test_float64_vs_naive(temperature, seed):
    logits, ids = _inputs(seed, torch.float64)
    lp_ref, h_ref = naive(logits, ids, temperature)
    lp = token_logprobs(logits, ids, temperature)
    h = entropy_from_logits(logits, temperature)
    assert lp.dtype == torch.float64 and h.dtype == torch.float64
    assert lp.shape == ids.shape and h.shape == ids.shape
    torch.testing.assert_close(lp, lp_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("temperature", TEMPS)
def test_float32_vs_naive(temperature):
    logits, ids = _inputs(4, torch.float32)
    lp_ref, h_ref = naive(logits, ids, temperature)
    lp = token_logprobs(logits, ids, temperature)
    h = entropy_from_logits(logits, temperature)
    assert lp.dtype == torch.float32 and h.dtype == torch.float32
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", TEMPS)
def test_half_precision_input_is_upcast(low, temperature):
    logits, ids = _inputs(5, low, scale=4.0)
    lp = token_logprobs(logits, ids, temperature)
    h = entropy_from_logits(logits, temperature)
    assert lp.dtype == torch.float32 and h.dtype == torch.float32
    # exactly the float32 computation on the (exactly widened) half-precision values
    assert torch.equal(lp, token_logprobs(logits.float(), ids, temperature))
    assert torch.equal(h, entropy_from_logits(logits.float(), temperature))
    # and float32-accurate against the float64 reference on the same values
    lp_ref, h_ref = naive(logits, ids, temperature)
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-5)


def test_half_precision_upcast_has_teeth():
    """Computing the log-softmax in bf16 itself would be visibly wrong, so the upcast matters."""
    logits, ids = _inputs(6, torch.bfloat16, scale=4.0, V=50)
    lp_ref, _ = naive(logits, ids, 0.7)
    in_bf16 = torch.gather(torch.log_softmax(logits / 0.7, -1), -1, ids.unsqueeze(-1)).squeeze(-1)
    assert (in_bf16.double() - lp_ref).abs().max() > 1e-3
    assert (token_logprobs(logits, ids, 0.7).double() - lp_ref).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_logits_stable(dtype):
    """logits around 1e3 do not overflow; logp is shift-invariant."""
    logits, ids = _inputs(7, torch.float64, scale=3.0)
    shifted = (logits + 1000.0).to(dtype)
    lp = token_logprobs(shifted, ids, 0.8)
    h = entropy_from_logits(shifted, 0.8)
    assert torch.isfinite(lp).all() and torch.isfinite(h).all()
    lp_ref, h_ref = naive(logits, ids, 0.8)
    tol = 1e-3 if dtype == torch.float32 else 1e-9
    torch.testing.assert_close(lp.double(), lp_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(h.double(), h_ref, rtol=tol, atol=tol)


def test_entropy_bounds_and_special_cases():
    V = 13
    uniform = torch.zeros(2, 3, V, dtype=torch.float64)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((2, 3), math.log(V), dtype=torch.float64))
    # uniform at any temperature
    torch.testing.assert_close(entropy_from_logits(uniform, 0.3), torch.full((2, 3), math.log(V), dtype=torch.float64))
    ids = torch.zeros(2, 3, dtype=torch.long)
    torch.testing.assert_close(token_logprobs(uniform, ids), torch.full((2, 3), -math.log(V), dtype=torch.float64))
    # a peaked distribution has ~0 entropy
    peaked = torch.zeros(1, 1, V, dtype=torch.float64)
    peaked[..., 3] = 60.0
    assert 0 <= entropy_from_logits(peaked).item() < 1e-20
    assert token_logprobs(peaked, torch.tensor([[3]])).item() == pytest.approx(0.0, abs=1e-20)
    # random logits: 0 <= H <= log V, and temperature raises the entropy
    logits, _ = _inputs(8, torch.float64, V=V)
    h1 = entropy_from_logits(logits, 1.0)
    h2 = entropy_from_logits(logits, 2.0)
    assert (h1 >= 0).all() and (h1 <= math.log(V) + 1e-12).all()
    assert (h2 > h1).all()


def test_logprobs_normalised_over_vocab():
    logits, _ = _inputs(9, torch.float64, V=7)
    B, T, V = logits.shape
    total = torch.zeros(B, T, dtype=torch.float64)
    for v in range(V):
        total += torch.exp(token_logprobs(logits, torch.full((B, T), v), 0.6))
    torch.testing.assert_close(total, torch.ones(B, T, dtype=torch.float64), rtol=1e-14, atol=1e-14)


def test_logprob_gradient():
    """d log p_tok / d logits_v = (1[v = tok] - softmax(z)_v) / T."""
    logits, ids = _inputs(10, torch.float64, B=2, T=3, V=5)
    logits.requires_grad_()
    T_ = 0.7
    (grad,) = torch.autograd.grad(token_logprobs(logits, ids, T_).sum(), logits)
    p = torch.softmax(logits.detach() / T_, -1)
    onehot = torch.nn.functional.one_hot(ids, 5).double()
    torch.testing.assert_close(grad, (onehot - p) / T_, rtol=1e-12, atol=1e-14)


def test_inputs_not_modified():
    logits, ids = _inputs(11, torch.float32)
    before = logits.clone()
    token_logprobs(logits, ids, 0.5)
    entropy_from_logits(logits, 0.5)
    assert torch.equal(logits, before)


def _reference_logp_entropy(logits: torch.Tensor, ids: torch.Tensor, temperature: float):
    """Plain autograd through a full log_softmax: the formulas, no chunking, no hand-written backward."""
    ls = torch.log_softmax(logits / temperature, -1)
    return ls.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(ls.exp() * ls).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hand_written_backward_passes_gradcheck(temperature):
    """Both outputs' gradients (log p and, with entropy_grad, H) against finite differences in float64."""
    logits, ids = _inputs(12, torch.float64, B=2, T=3, V=6)
    logits.requires_grad_()

    def both(x):
        return logprobs_and_entropy(x, ids, temperature, with_entropy=True, entropy_grad=True)

    assert torch.autograd.gradcheck(both, (logits,), eps=1e-6, atol=1e-8)
    # one output at a time (the other's gradient is None in the backward)
    assert torch.autograd.gradcheck(lambda x: both(x)[1], (logits,), eps=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(lambda x: both(x)[0], (logits,), eps=1e-6, atol=1e-8)


def test_gradients_match_autograd_through_log_softmax():
    logits, ids = _inputs(13, torch.float64, B=3, T=4, V=9)
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    x = logits.clone().requires_grad_()
    lp, h = logprobs_and_entropy(x, ids, 0.8, with_entropy=True, entropy_grad=True)
    (got,) = torch.autograd.grad((a * lp + b * h).sum(), x)
    y = logits.clone().requires_grad_()
    lp_ref, h_ref = _reference_logp_entropy(y, ids, 0.8)
    (want,) = torch.autograd.grad((a * lp_ref + b * h_ref).sum(), y)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    # without entropy_grad the entropy carries no graph
    _, h_detached = logprobs_and_entropy(x, ids, 0.8, with_entropy=True)
    assert not h_detached.requires_grad


def test_chunks_do_not_change_values_or_gradients(monkeypatch):
    """7 rows in chunks of 2 (the last one short) give what one chunk gives, values and gradients."""
    import grpolab.algo.logprobs as lpm

    logits, ids = _inputs(14, torch.float32, B=1, T=7, V=10)
    w = torch.randn(1, 7)

    def run():
        x = logits.clone().requires_grad_()
        lp, h = lpm.logprobs_and_entropy(x, ids, 0.9, with_entropy=True, entropy_grad=True)
        (lp * w + h).sum().backward()
        return lp, h, x.grad

    whole = run()
    monkeypatch.setattr(lpm, "CHUNK_BYTES", 4 * 10 * 2)
    assert lpm.chunk_rows(10) == 2 and lpm.chunk_rows(10, torch.device("cpu")) == 2
    chunked = run()
    for got, want in zip(chunked, whole):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_bf16_logits_get_a_bf16_gradient_of_the_float32_computation():
    logits, ids = _inputs(15, torch.bfloat16, scale=4.0, V=40)
    x16 = logits.clone().requires_grad_()
    x32 = logits.float().requires_grad_()
    (g16,) = torch.autograd.grad(token_logprobs(x16, ids, 0.7).sum(), x16)
    (g32,) = torch.autograd.grad(token_logprobs(x32, ids, 0.7).sum(), x32)
    assert g16.dtype == torch.bfloat16
    assert torch.equal(g16, g32.bfloat16())


def test_chunks_are_cache_sized_on_a_cpu_and_large_elsewhere():
    import grpolab.algo.logprobs as lpm

    assert lpm.chunk_rows(49152) == lpm.chunk_rows(49152, torch.device("cpu")) == 5  # 5 x 49152 x 4 B < 1 MiB
    assert lpm.chunk_rows(49152, torch.device("cuda")) == 1365  # 256 MiB of float32 rows
    assert lpm.chunk_rows(10**7) == 1  # at least one row


@pytest.mark.parametrize("first", [float("-inf"), torch.finfo(torch.float32).min, -1e4])
def test_gradient_with_a_masked_or_extreme_first_logit(first):
    """A masked (-inf) or extreme logit anywhere in a row, the first column included, leaves the log-probability's
    gradient finite and equal to autograd through a float64 log_softmax."""
    logits, ids = _inputs(16, torch.float32, B=2, T=3, V=50)
    ids = ids.clamp(min=1)  # the tokens are never the masked entry
    logits[..., 0] = first
    x = logits.clone().requires_grad_()
    (got,) = torch.autograd.grad(token_logprobs(x, ids, 0.7).sum(), x)
    y = logits.double().requires_grad_()
    (want,) = torch.autograd.grad(torch.log_softmax(y / 0.7, -1).gather(-1, ids.unsqueeze(-1)).sum(), y)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_second_order_gradients_are_refused_not_wrong():
    logits, ids = _inputs(17, torch.float64, B=1, T=2, V=5)
    x = logits.clone().requires_grad_()
    (g,) = torch.autograd.grad(token_logprobs(x, ids).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()
