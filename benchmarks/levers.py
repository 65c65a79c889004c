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
  determinism      the policy update with CPU flash attention (default SDPA)  vs  the math backend that
                   train.deterministic uses (--only-deterministic: this row alone)

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
                ref = None if updater.reference is None else updater.logprobs_no_grad(updater.reference, batch.rollout, "fp32")
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
    """The policy update with the default SDPA backend (CPU flash attention: its backward does not repeat) and with
    the math backend train.deterministic uses (grpolab/training/reproducibility.py), same batch, alternating."""
    import torch

    from grpolab.training.reproducibility import training_attention

    torch.manual_seed(0)
    batch = trainer.collect()
    updater = trainer.updater
    times: dict[str, list[float]] = {"flash (default SDPA)": [], "math (deterministic)": []}
    for r in range(repeats + 1):
        for name in times:
            with training_attention(name.startswith("math"), trainer.device):
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only-deterministic", action="store_true", help="time only the deterministic-attention row")
    args = p.parse_args(argv)
    trainer = make_trainer(args)
    print(f"levers, precision {args.precision}, median of {args.repeats} (after one warm-up round)")
    det = bench_deterministic(trainer, args.repeats)
    print("\n  policy update, training attention  s   ratio to flash")
    for name, s in det.items():
        print(f"  {name:28s} {s:8.2f}   {s / det['flash (default SDPA)']:8.2f}")
    if args.only_deterministic:
        return 0
    gen = bench_generation(trainer, args.repeats)
    print("\n  generation (32 completions)       s      ms/token   ratio to plain")
    for name, label in (("hf", "transformers generate"), ("grpolab", "grpolab decode loop")):
        print(f"  {label:28s} {gen[name]['s']:8.2f} {1000 * gen[name]['s_per_token']:10.1f}   "
              f"{gen[name]['s_per_token'] / gen['hf']['s_per_token']:8.2f} (per token)")
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
