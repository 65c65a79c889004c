#!/usr/bin/env python
"""Each speed lever of grpolab, on and off, in one process on the same inputs: the before/after of every lever.

    python benchmarks/levers.py                     # bf16, bundled SmolLM2-135M-Instruct, 3 repeats
    python benchmarks/levers.py --precision fp32

Settings are those of step_vs_trl.py (G = 8, 4 prompts, 64 new tokens, beta = 0.04, micro-batches of 8). Compared,
alternating, --repeats times each, median seconds:

  generation       rollout.decoder=hf (transformers `generate`)  vs  grpolab (rollout/decode.py)
  training passes  one fixed rollout batch, reference pass + policy update (forward, backward, optimizer):
                   share_prompt=false (plain padded rows)  vs  share_prompt (prompt cache repeated G times,
                   padded completions)  vs  share_prompt + pack_completions (the default)
  attention (bf16) the bf16 policy update with attention in bf16 (SDPA)  vs  in float32 (sdpa_fp32, grpolab/training/attention.py)
  optimizer step   AdamW foreach  vs  fused, on the policy's parameters with fixed gradients
  determinism      the policy update with CPU flash attention (default SDPA)  vs  SDPA's math backend (heads
                   repeated)  vs  grouped_attention, what train.deterministic uses (--only-deterministic: this row alone)
  kernels          log-probabilities + entropy (forward + backward) and one sampling draw, against the plain
                   torch they replaced, on random bf16 logits (--only-kernels: these rows alone, no model)

Generation samples differ between decoders (different random streams), so the generation rows also report
seconds per generated token. Everything else runs on identical inputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import step_vs_trl  # noqa: E402  (benchmarks/step_vs_trl.py: the shared settings)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_trainer(args):
    from grpolab.config import from_dict
    from grpolab.models.load import resolve_model_path
    from grpolab.training.trainer import Trainer

    bench_args = step_vs_trl.parse_args(["--precision", args.precision, "--only", "ours"])
    out = Path(tempfile.mkdtemp(prefix="grpolab-levers-"))
    cfg = from_dict(step_vs_trl.grpolab_raw_config(bench_args, resolve_model_path(bench_args.model), str(out)))
    (out / "bench").mkdir()
    return Trainer(cfg, out / "bench")


def bench_generation(trainer, repeats: int) -> dict[str, dict[str, float]]:
    import torch

    problems = trainer.sampler.take(trainer.cfg.train.prompts_per_step)
    prompts = [trainer.collector.prompt_ids(p) for p in problems]
    times: dict[str, list[float]] = {"hf": [], "grpolab": []}
    tokens: dict[str, list[int]] = {"hf": [], "grpolab": []}
    for r in range(repeats + 1):  # the first round warms both up and is not counted
        for decoder in times:
            trainer.engine.decoder = decoder
            torch.manual_seed(r)
            box = {}
            t = timed(lambda: box.update(out=trainer.engine.generate(prompts, trainer.collector.params)))
            if r:
                times[decoder].append(t)
                tokens[decoder].append(int(box["out"].completion_mask.sum()))
    trainer.engine.decoder = "grpolab"
    return {d: {"s": statistics.median(times[d]), "s_per_token": sum(times[d]) / sum(tokens[d])} for d in times}


def bench_training(trainer, repeats: int) -> dict[str, float]:
    import torch

    torch.manual_seed(0)
    batch = trainer.collect()
    updater = trainer.updater
    variants = {"plain": (False, False), "shared prompt": (True, False), "shared prompt + packed": (True, True)}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats + 1):
        for name, (share_prompt, pack) in variants.items():
            updater.share_prompt, updater.pack = share_prompt, pack

            def step():
                ref = (
                    None
                    if updater.reference is None
                    else updater.logprobs_no_grad(updater.reference, batch.rollout, "fp32")
                )
                updater.update(batch.rollout, batch.advantages, ~batch.scores.invalid, ref_logp=ref)

            t = timed(step)
            if r:
                times[name].append(t)
    return {v: statistics.median(ts) for v, ts in times.items()}


def bench_attention(trainer, repeats: int) -> dict[str, float]:
    """The bf16 update with attention in bf16 (plain SDPA) and in float32 (grpolab/training/attention.py), same batch."""
    import torch

    torch.manual_seed(0)
    batch = trainer.collect()
    policy, updater = trainer.policy, trainer.updater
    times: dict[str, list[float]] = {"sdpa": [], "sdpa_fp32": []}
    for r in range(repeats + 1):
        for name in times:
            policy.set_attn_implementation(name)
            t = timed(lambda: updater.update(batch.rollout, batch.advantages, ~batch.scores.invalid))
            if r:
                times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_deterministic(trainer, repeats: int) -> dict[str, float]:
    """The policy update with the default SDPA backend (CPU flash attention: its backward does not repeat), with
    SDPA's math backend (every key/value head repeated for its query heads), and with what train.deterministic
    uses (grouped_attention, grpolab/training/attention.py), same batch, alternating."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from grpolab.training.reproducibility import training_attention

    torch.manual_seed(0)
    batch = trainer.collect()
    updater = trainer.updater
    settings = {
        "flash (default SDPA)": contextlib.nullcontext,
        "SDPA math, heads repeated": lambda: sdpa_kernel(SDPBackend.MATH),
        "grouped (deterministic)": lambda: training_attention(True, trainer.device),
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    for r in range(repeats + 1):
        for name, within in settings.items():
            with within():
                t = timed(lambda: updater.update(batch.rollout, batch.advantages, ~batch.scores.invalid))
            if r:
                times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_optimizer(trainer, repeats: int) -> dict[str, float]:
    import torch

    params = [p for p in trainer.policy.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    times: dict[str, list[float]] = {"foreach": [], "fused": []}
    for r in range(repeats + 1):
        for kind in times:
            opt = torch.optim.AdamW(params, lr=1e-9, betas=(0.9, 0.99), **{kind: True})
            opt.step()  # allocates the moments
            t = timed(opt.step)
            if r:
                times[kind].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_kernels(repeats: int, vocab: int = 49152, positions: int = 768) -> dict[str, dict[str, float]]:
    """Two per-token kernels against the plain torch they replaced, on random bf16 logits of SmolLM2's vocabulary
    (T = 0.8): log-probabilities + entropy, forward and backward over `positions` rows (grpolab/algo/logprobs.py vs
    autograd through a full float32 log_softmax); one sampling draw of 8 and 32 rows (grpolab/rollout/decode.py's
    two-level inverse CDF vs one float64 cumulative sum of the whole vocabulary)."""
    import torch

    from grpolab.algo.logprobs import logprobs_and_entropy
    from grpolab.rollout.decode import sample_tokens

    def plain_logprobs(x, ids):
        ls = torch.log_softmax(x.float() / 0.8, -1)
        with torch.no_grad():
            entropy = -(ls.exp() * ls).sum(-1)
        return ls.gather(-1, ids.unsqueeze(-1)).squeeze(-1), entropy

    def plain_draw(x, u):
        z = x.float() / 0.8
        cdf = torch.exp(z - torch.logsumexp(z, -1, keepdim=True)).cumsum(-1, dtype=torch.float64)
        return torch.searchsorted(cdf, (u.double() * cdf[:, -1]).unsqueeze(-1), right=True)

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(positions, vocab, generator=g) * 3).bfloat16()
    ids, weights = torch.randint(0, vocab, (positions,), generator=g), torch.randn(positions, generator=g)

    def backward_of(fn):
        def run():
            x = logits.clone().requires_grad_()
            (fn(x, ids)[0] * weights).sum().backward()

        return run

    cases = {
        "log-probabilities + entropy, fwd + bwd": {
            "plain": backward_of(plain_logprobs),
            "grpolab": backward_of(lambda x, i: logprobs_and_entropy(x, i, 0.8, with_entropy=True)),
        }
    }
    for rows in (8, 32):
        u = torch.rand(rows, generator=g)
        cases[f"sampling draw, {rows} rows"] = {
            "plain": lambda r=rows, u=u: plain_draw(logits[:r], u),
            "grpolab": lambda r=rows, u=u: sample_tokens(logits[:r], 0.8, u),
        }
    out = {}
    for case, fns in cases.items():
        times: dict[str, list[float]] = {name: [] for name in fns}
        for r in range(repeats + 1):
            for name, fn in fns.items():
                t = min(timed(fn) for _ in range(5))
                if r:
                    times[name].append(t)
        out[case] = {name: statistics.median(v) for name, v in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only-deterministic", action="store_true", help="time only the deterministic-attention row")
    p.add_argument("--only-kernels", action="store_true", help="time only the per-token kernels (no model)")
    args = p.parse_args(argv)
    if not args.only_deterministic:
        kernels = bench_kernels(args.repeats)
        print(
            f"per-token kernels, median of {args.repeats} (each the best of 5 calls)\n  {'':40s} plain ms  grpolab ms   ratio"
        )
        for case, t in kernels.items():
            print(f"  {case:40s} {1000 * t['plain']:8.2f} {1000 * t['grpolab']:10.2f} {t['grpolab'] / t['plain']:8.2f}")
    if args.only_kernels:
        return 0
    trainer = make_trainer(args)
    print(f"levers, precision {args.precision}, median of {args.repeats} (after one warm-up round)")
    det = bench_deterministic(trainer, args.repeats)
    print("\n  policy update, training attention  s   ratio to flash  ratio to SDPA math")
    for name, s in det.items():
        print(
            f"  {name:28s} {s:8.2f}   {s / det['flash (default SDPA)']:8.2f} {s / det['SDPA math, heads repeated']:14.2f}"
        )
    if args.only_deterministic:
        return 0
    gen = bench_generation(trainer, args.repeats)
    print("\n  generation (32 completions)       s      ms/token   ratio to plain")
    for name, label in (("hf", "transformers generate"), ("grpolab", "grpolab decode loop")):
        print(
            f"  {label:28s} {gen[name]['s']:8.2f} {1000 * gen[name]['s_per_token']:10.1f}   "
            f"{gen[name]['s_per_token'] / gen['hf']['s_per_token']:8.2f} (per token)"
        )
    train = bench_training(trainer, args.repeats)
    print("\n  reference + policy update          s   ratio to plain")
    for name, s in train.items():
        print(f"  {name:28s} {s:8.2f}   {s / train['plain']:8.2f}")
    if args.precision == "bf16":
        from grpolab.training.attention import register

        register()
        att = bench_attention(trainer, args.repeats)
        print("\n  bf16 policy update, attention in   s   ratio to bf16")
        for name, label in (("sdpa", "bf16 (plain SDPA)"), ("sdpa_fp32", "float32 (sdpa_fp32)")):
            print(f"  {label:28s} {att[name]:8.2f}   {att[name] / att['sdpa']:8.2f}")
    opt = bench_optimizer(trainer, args.repeats)
    print("\n  AdamW step                         s   ratio to foreach")
    for name, s in opt.items():
        print(f"  {name:28s} {s:8.3f}   {s / opt['foreach']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
