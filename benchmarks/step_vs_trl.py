#!/usr/bin/env python
"""One GRPO training step, grpolab vs TRL's GRPOTrainer, on identical settings -- rerunnable by any user.

    pip install -e ".[bench]"                       # TRL
    python benchmarks/step_vs_trl.py                # bundled SmolLM2-135M-Instruct, fp32, 3 rounds x 3 steps
    python benchmarks/step_vs_trl.py --precision bf16 --json-out bench.json
    python benchmarks/step_vs_trl.py --scaling      # grpolab step time vs work over G x max_new_tokens

Both sides get the same weights (one local checkpoint directory), the same prompts in the same order (arithmetic
problems rendered through the tokenizer's chat template; TRL gets them in its conversational format), the same
reward (grpolab.rewards.score_completion wrapped as a TRL reward function), and the same algorithm: G
completions per prompt, temperature 1.0, beta = 0.04 with the k3 estimator in the loss, clip 0.2, mu = 1 (one
optimizer step per rollout batch, so neither side needs a separate old-logprob pass), per-sequence token mean,
group std scaling, AdamW (0.9, 0.99, no weight decay), constant learning rate, grad-norm clip 1.0, the same
micro-batch size.

Each side runs in its own worker process (`--worker ours|trl`, spawned by this script), so peak RSS is per side.
Rounds alternate: ours, trl, ours, trl, ... Every worker runs one warm-up step (not counted) and then --steps
measured steps. Reported: median step time of each side over all measured steps, the ratio grpolab / TRL,
tokens per second (prompt + completion tokens / step time), peak RSS, a phase breakdown, and the FLOPs the step
must do against this machine's measured matrix rate (see benchmarks/common.py for the accounting).

Phases are measured without editing either library: the workers wrap methods of the live objects.
  generation   grpolab: GrpolabEngine.generate           TRL: GRPOTrainer._generate (tokenise, generate, decode)
  reward       grpolab: batch.score_rollout         TRL: GRPOTrainer._calculate_rewards
  reference    PolicyUpdater.logprobs_no_grad(ref)  TRL: _get_per_token_logps_and_entropies(ref_model), no grad
  old logprobs PolicyUpdater.logprobs_no_grad(pol)  TRL: _get_per_token_logps_and_entropies(model), no grad
  policy fwd   grpolab: update() minus the rest     TRL: compute_loss
  policy bwd   torch.Tensor.backward (both)
  optimizer    torch.nn.utils.clip_grad_norm_ + Optimizer.step (global step hooks; both)
  weight sync  grpolab: GrpolabEngine.sync_weights (bf16 sampler copy)
  other        step wall time minus all of the above (advantages, logging, data loading, trainer overhead)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402  (benchmarks/common.py, beside this file)
import trl_side  # noqa: E402

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"
# The quickstart's task: two-term addition/subtraction with operands up to 20.
TASK_OPTIONS = {"max_operand": 20, "operators": "+-", "terms": 2, "seed": 0, "test_fraction": 0.3, "num_test": 300}
REWARD_WEIGHTS = {"correct": 1.0, "format": 0.1}
PHASES = [
    "generation",
    "reward",
    "reference",
    "old_logprobs",
    "policy_fwd",
    "policy_bwd",
    "optimizer",
    "weight_sync",
    "other",
]
SIDES = {"ours": "grpolab", "trl": "TRL"}


# ============================================================================================ worker side


class Instrument:
    """Accumulates wall time per phase for the current step; wraps callables without changing what they do."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)  # per phase, over the whole run (a sanity check of the hooks)
        self._opt_t0: float | None = None
        self.precision_seen: dict[str, str] = {}
        self._handles: list[Any] = []

    def wrap(
        self,
        fn: Callable,
        phase: str | Callable[..., str | None],
        after: Callable[[Any, tuple, dict], None] | None = None,
    ) -> Callable:
        def wrapper(*args, **kwargs):
            ph = phase(*args, **kwargs) if callable(phase) else phase
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                if ph is not None:
                    self.acc[ph] += time.perf_counter() - t0
                    self.calls[ph] += 1
            if after is not None:
                after(out, args, kwargs)
            return out

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def install_global(self) -> None:
        """Backward, gradient clipping and optimizer steps: the same hooks on both sides."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.wrap_attr(torch.Tensor, "backward", "policy_bwd")
        self.wrap_attr(torch.nn.utils, "clip_grad_norm_", "optimizer")

        def pre(opt, args, kwargs):
            self._opt_t0 = time.perf_counter()

        def post(opt, args, kwargs):
            if self._opt_t0 is not None:
                self.acc["optimizer"] += time.perf_counter() - self._opt_t0
                self.calls["optimizer.step"] += 1
                self._opt_t0 = None

        self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]

    def wrap_attr(self, obj: Any, name: str, phase, after=None) -> None:
        setattr(obj, name, self.wrap(getattr(obj, name), phase, after))

    def watch_precision(self, model, tag: str) -> None:
        """Record, per model and grad mode, the weight dtype, the activation dtype and autocast as actually run."""
        import torch

        layer = next((m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")), None)
        if layer is None:
            return
        weight_dtype = str(next(model.parameters()).dtype).replace("torch.", "")

        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            grad = "train" if torch.is_grad_enabled() else "no_grad"
            auto = torch.is_autocast_enabled("cpu")
            ac = str(torch.get_autocast_dtype("cpu")).replace("torch.", "") if auto else "off"
            act = str(getattr(x, "dtype", "?")).replace("torch.", "")
            self.precision_seen.setdefault(f"{tag}/{grad}", f"weights {weight_dtype}, activations {act}, autocast {ac}")

        self._handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))

    def take(self) -> dict[str, float]:
        out = dict(self.acc)
        self.acc.clear()
        return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return math.nan


def grpolab_raw_config(args, model_path: str, out_dir: str) -> dict:
    bf16 = args.precision == "bf16"
    return {
        "model": {"name": model_path, "dtype": "float32"},
        "task": {"name": "arithmetic", "options": dict(TASK_OPTIONS)},
        "reward": {"weights": dict(REWARD_WEIGHTS)},
        "rollout": {
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "dtype": "bfloat16" if bf16 else "float32",
            "decoder": args.decoder,
        },
        "speed": {"cpu_fast_paths": not args.no_cpu_fast_paths},
        "algorithm": {
            "preset": "grpo",
            "beta": args.beta,
            "kl_estimator": "k3",
            "kl_placement": "loss",
            "eps_low": 0.2,
            "eps_high": 0.2,
            "aggregation": "seq_mean_token_mean",
        },
        "train": {
            "steps": args.warmup + args.steps,
            "prompts_per_step": args.prompts_per_step,
            "mu": 1,
            "minibatches": 1,
            "micro_batch_size": args.micro_batch_size,
            "lr": args.lr,
            "weight_decay": 0.0,
            "adam_beta1": 0.9,
            "adam_beta2": 0.99,
            "schedule": "constant",
            "grad_clip": 1.0,
            "precision": args.precision,
            "seed": args.seed,
            "samples_per_step": 4,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": out_dir, "name": "bench"},
    }


def step_record(
    instr: Instrument,
    wall: float,
    prompt_lens: list[int],
    completion_lens: list[int],
    shape,
    args,
    extra: dict[str, Any],
) -> dict[str, Any]:
    phases = instr.take()
    flops = common.step_flops(shape, prompt_lens, completion_lens, args.group_size, with_reference=args.beta > 0)
    shared = common.step_flops(
        shape, prompt_lens, completion_lens, args.group_size, with_reference=args.beta > 0, share_prompt=True
    )
    rec = {
        "wall_s": wall,
        "phases": {p: phases.get(p, 0.0) for p in PHASES if p != "other"},
        "sequences": len(completion_lens),
        "prompt_tokens": int(sum(prompt_lens)),
        "completion_tokens": int(sum(completion_lens)),
        "completion_len_mean": sum(completion_lens) / max(len(completion_lens), 1),
        "prompt_lens": prompt_lens,
        "completion_lens": completion_lens,
        "flops": flops,
        "flops_shared_prompt_total": shared["total"],
        **extra,
    }
    if "update_total" in phases:  # grpolab: the policy forward is what update() spent besides the measured parts
        inside = sum(rec["phases"][p] for p in ("reference", "old_logprobs", "policy_bwd", "optimizer"))
        rec["phases"]["policy_fwd"] = max(phases["update_total"] - inside, 0.0)
    rec["phases"]["other"] = max(wall - sum(rec["phases"].values()), 0.0)
    rec["tokens"] = rec["prompt_tokens"] + rec["completion_tokens"]
    rec["tokens_per_s"] = rec["tokens"] / wall
    return rec


def run_ours(args, model_path: str) -> dict[str, Any]:
    import torch

    import grpolab.training.batch as B
    import grpolab.training.trainer as T
    from grpolab.config import from_dict

    out_dir = tempfile.mkdtemp(prefix="grpolab-bench-ours-")
    cfg = from_dict(grpolab_raw_config(args, model_path, out_dir))
    run_dir = Path(out_dir) / "bench"
    run_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    trainer = T.Trainer(cfg, run_dir)
    setup_s = time.perf_counter() - t0
    setup_rss = current_rss_mb()
    trainer.save = lambda: None  # type: ignore[method-assign]  # no checkpoint writes in a timing run
    shape = common.ModelShape.from_model(trainer.policy)

    instr = Instrument()
    instr.install_global()
    captured: dict[str, Any] = {}

    def keep_rollout(rollout, a, k):
        captured["prompt_lens"] = rollout.prompt_mask.sum(-1).tolist()
        captured["completion_lens"] = rollout.completion_mask.sum(-1).tolist()

    def keep_problems(problems, a, k):
        captured.setdefault("uids", []).extend(p.uid for p in problems)

    instr.wrap_attr(trainer.engine, "generate", "generation", keep_rollout)
    instr.wrap_attr(trainer.engine, "sync_weights", "weight_sync")
    instr.wrap_attr(trainer.sampler, "take", None, keep_problems)
    instr.wrap_attr(B, "score_rollout", "reward")  # called by name inside BatchCollector.generate_round
    ref = trainer.reference
    instr.wrap_attr(
        trainer.updater, "logprobs_no_grad", lambda model, *a, **k: "reference" if model is ref else "old_logprobs"
    )
    instr.wrap_attr(trainer.updater, "update", "update_total")
    if trainer.engine.own_copy:
        instr.watch_precision(trainer.engine.model, "sampler")
    instr.watch_precision(trainer.policy, "policy")
    if ref is not None:
        instr.watch_precision(ref, "reference")

    steps: list[dict[str, Any]] = []
    last = [time.perf_counter()]

    def on_step(step: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        extra = {
            "reward_mean": metrics.get("reward/mean"),
            "truncated_frac": metrics.get("completion/truncated_frac"),
            "prompt_uids": captured.pop("uids", []),
            "grpolab_metrics": {k: v for k, v in metrics.items() if k.startswith(("time/", "throughput/", "memory/"))},
        }
        steps.append(
            step_record(instr, now - last[0], captured["prompt_lens"], captured["completion_lens"], shape, args, extra)
        )
        last[0] = time.perf_counter()

    last[0] = time.perf_counter()
    trainer.fit(on_step=on_step)
    return {
        "side": "ours",
        "setup_s": setup_s,
        "rss_after_setup_mb": setup_rss,
        "peak_rss_mb": peak_rss_mb(),
        "shape": common.shape_dict(shape),
        "precision_seen": instr.precision_seen,
        "torch_threads": torch.get_num_threads(),
        "phase_calls": dict(instr.calls),
        "notes": {
            "share_prompt": cfg.speed.share_prompt,
            "optimizer": f"torch.optim.AdamW({'fused' if cfg.speed.fused_adamw else 'foreach'}=True)",
            "pack_completions": cfg.speed.pack_completions,
            "decoder": cfg.rollout.decoder,
            "cpu_fast_paths": cfg.speed.cpu_fast_paths,
            "sampler_copy": trainer.engine.own_copy,
        },
        "warmup": steps[: args.warmup],
        "steps": steps[args.warmup :],
    }


def run_trl(args, model_path: str) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpolab.config import from_dict
    from grpolab.models.load import load_tokenizer
    from grpolab.tasks import render_prompt
    from grpolab.tasks.prompting import prompt_ids as grpolab_prompt_ids

    out_dir = tempfile.mkdtemp(prefix="grpolab-bench-trl-")
    cfg = from_dict(grpolab_raw_config(args, model_path, out_dir))
    problems = trl_side.ordered_problems(cfg, (args.warmup + args.steps) * args.prompts_per_step)
    by_text = {render_prompt(p): p for p in problems}
    tokenizer = load_tokenizer(model_path)
    config = GRPOConfig(
        output_dir=out_dir,
        save_strategy="no",
        **trl_side.trl_settings(
            cfg,
            bf16=args.precision == "bf16",
            max_steps=args.warmup + args.steps,
            gradient_checkpointing=args.trl_gradient_checkpointing,
        ),
    )
    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=[trl_side.trl_reward(REWARD_WEIGHTS)],
        args=config,
        train_dataset=trl_side.trl_dataset(problems),
        processing_class=tokenizer,
    )
    setup_s = time.perf_counter() - t0
    setup_rss = current_rss_mb()
    shape = common.ModelShape.from_model(trainer.model)

    instr = Instrument()
    instr.install_global()
    captured: dict[str, Any] = {"prompt_mismatch": 0, "prompts_checked": 0}

    def check_prompts(out, a, k):
        prompts = a[0] if a else k["prompts"]
        ids = out[0]
        for msgs, got in zip(prompts, ids):
            p = by_text.get(msgs[-1]["content"])
            if p is None:
                continue
            captured["prompts_checked"] += 1
            captured["prompt_mismatch"] += list(got) != grpolab_prompt_ids(tokenizer, p)

    def keep_prompts(out, a, k):
        prompts = a[0] if a else k["prompts"]
        seen = captured.setdefault("uids", [])
        for msgs in prompts:
            p = by_text.get(msgs[-1]["content"])
            if p is not None and p.uid not in seen:
                seen.append(p.uid)

    def keep_batch(out, a, k):
        captured["prompt_lens"] = out["prompt_mask"].sum(-1).tolist()
        captured["completion_lens"] = out["completion_mask"].sum(-1).tolist()
        captured["old_logprobs_computed"] = out.get("old_per_token_logps") is not None

    def logps_phase(model, *a, **k):
        if torch.is_grad_enabled():
            return None  # inside compute_loss: counted there
        return "reference" if model is trainer.ref_model else "old_logprobs"

    instr.wrap_attr(trainer, "_tokenize_prompts", None, check_prompts)
    instr.wrap_attr(trainer, "_generate", "generation", keep_prompts)
    instr.wrap_attr(trainer, "_calculate_rewards", "reward")
    instr.wrap_attr(trainer, "_get_per_token_logps_and_entropies", logps_phase)
    instr.wrap_attr(trainer, "_generate_and_score_completions", None, keep_batch)
    instr.wrap_attr(trainer, "compute_loss", "policy_fwd")
    instr.watch_precision(trainer.model, "policy")
    if trainer.ref_model is not None:
        instr.watch_precision(trainer.ref_model, "reference")

    steps: list[dict[str, Any]] = []
    last = [time.perf_counter()]

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            last[0] = time.perf_counter()

        def on_step_end(self, *a, **k):
            now = time.perf_counter()
            m = trainer._metrics["train"]
            extra = {
                "reward_mean": (m.get("reward") or [math.nan])[-1],
                "truncated_frac": (m.get("completions/clipped_ratio") or [math.nan])[-1],
                "prompt_uids": captured.pop("uids", []),
                "old_logprobs_computed": captured.get("old_logprobs_computed"),
            }
            steps.append(
                step_record(
                    instr, now - last[0], captured["prompt_lens"], captured["completion_lens"], shape, args, extra
                )
            )
            last[0] = time.perf_counter()

    trainer.add_callback(StepTimer())
    trainer.train()
    return {
        "side": "trl",
        "setup_s": setup_s,
        "rss_after_setup_mb": setup_rss,
        "peak_rss_mb": peak_rss_mb(),
        "shape": common.shape_dict(shape),
        "precision_seen": instr.precision_seen,
        "torch_threads": torch.get_num_threads(),
        "phase_calls": dict(instr.calls),
        "notes": {
            "optimizer": str(config.optim),
            "checkpointing": {
                k: getattr(config, k, None) for k in ("gradient_checkpointing", "activation_checkpointing")
            },
            "steps_per_generation": config.steps_per_generation,
            "generation_batch_size": config.generation_batch_size,
            "prompts_checked": captured["prompts_checked"],
            "prompt_token_mismatches": captured["prompt_mismatch"],
            "mixed_precision": str(getattr(trainer.accelerator, "mixed_precision", "?")),
        },
        "warmup": steps[: args.warmup],
        "steps": steps[args.warmup :],
    }


def worker_main(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tempfile.tempdir = tempfile.mkdtemp(
        prefix=f"grpolab-bench-{args.worker}-"
    )  # run dirs of this worker, removed below
    try:
        result = (run_ours if args.worker == "ours" else run_trl)(args, args.model)
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    result["settings"] = settings_dict(args)
    Path(args.worker_out).write_text(json.dumps(result))


# ============================================================================================ parent side


def settings_dict(args) -> dict[str, Any]:
    return {
        k: getattr(args, k)
        for k in (
            "model",
            "precision",
            "group_size",
            "max_new_tokens",
            "prompts_per_step",
            "micro_batch_size",
            "steps",
            "warmup",
            "lr",
            "beta",
            "seed",
            "threads",
            "trl_gradient_checkpointing",
            "rounds",
            "scaling",
            "scaling_trl",
            "scaling_groups",
            "scaling_tokens",
            "scaling_steps",
        )
        if hasattr(args, k)
    }


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("grpolab", "torch", "transformers", "trl", "accelerate"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def spawn(args, side: str, log_dir: Path, tag: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one worker process; returns its JSON, or {"error": ...} with the tail of its log."""
    o = {**vars(args), **(overrides or {})}
    out = log_dir / f"{tag}.json"
    log = log_dir / f"{tag}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        side,
        "--worker-out",
        str(out),
        "--model",
        o["model"],
        "--precision",
        o["precision"],
        "--group-size",
        str(o["group_size"]),
        "--max-new-tokens",
        str(o["max_new_tokens"]),
        "--prompts-per-step",
        str(o["prompts_per_step"]),
        "--micro-batch-size",
        str(o["micro_batch_size"]),
        "--steps",
        str(o["steps"]),
        "--warmup",
        str(o["warmup"]),
        "--lr",
        repr(o["lr"]),
        "--beta",
        repr(o["beta"]),
        "--seed",
        str(o["seed"]),
        "--threads",
        str(o["threads"]),
        "--decoder",
        o["decoder"],
    ]
    if o["no_cpu_fast_paths"]:
        cmd.append("--no-cpu-fast-paths")
    if o["trl_gradient_checkpointing"]:
        cmd.append("--trl-gradient-checkpointing")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=args.worker_timeout or None
        ).returncode
    wall = time.perf_counter() - t0
    if rc != 0 or not out.is_file():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        return {"side": side, "error": f"worker exited with {rc}", "log": str(log), "log_tail": tail, "process_s": wall}
    result = json.loads(out.read_text())
    result["process_s"] = wall
    result["log"] = str(log)
    return result


def measure_matmul(shape: common.ModelShape, d_ff: int | None, seconds: float) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates = []
        for label, m, k, n in common.representative_shapes(shape, d_ff):
            rates.append({"shape": label, "gflops": common.matmul_rate(m, k, n, dtype, min_seconds=seconds) / 1e9})
        out[name] = {"shapes": rates, "peak_gflops": max(r["gflops"] for r in rates)}
    return out


def summarise(results: list[dict[str, Any]], peak_gflops: float) -> dict[str, Any]:
    """Pooled medians over the measured steps of every round of one side."""
    steps = [s for r in results if "steps" in r for s in r["steps"]]
    if not steps:
        return {"error": "no measured steps"}
    med = common.median
    phase = {p: med(s["phases"][p] for s in steps) for p in PHASES}
    flops = {k: med(s["flops"][k] for s in steps) for k in ("generation", "reference", "policy", "total")}
    achieved = med(s["flops"]["total"] / s["wall_s"] / 1e9 for s in steps)
    per_phase_rate = {
        "generation": med(
            s["flops"]["generation"] / s["phases"]["generation"] / 1e9 for s in steps if s["phases"]["generation"] > 0
        ),
        "reference": med(
            s["flops"]["reference"] / s["phases"]["reference"] / 1e9 for s in steps if s["phases"]["reference"] > 0
        ),
        "policy": med(
            s["flops"]["policy"] / (s["phases"]["policy_fwd"] + s["phases"]["policy_bwd"]) / 1e9
            for s in steps
            if s["phases"]["policy_fwd"] + s["phases"]["policy_bwd"] > 0
        ),
    }
    return {
        "measured_steps": len(steps),
        "step_s_median": med(s["wall_s"] for s in steps),
        "step_s_min": min(s["wall_s"] for s in steps),
        "step_s_max": max(s["wall_s"] for s in steps),
        "round_medians_s": [med(s["wall_s"] for s in r["steps"]) for r in results if r.get("steps")],
        "s_per_tflop_median": med(s["wall_s"] / (s["flops"]["total"] / 1e12) for s in steps),
        "tokens_per_s_median": med(s["tokens_per_s"] for s in steps),
        "completion_len_mean": sum(s["completion_len_mean"] for s in steps) / len(steps),
        "prompt_tokens_per_step": med(s["prompt_tokens"] for s in steps),
        "truncated_frac_mean": _mean([s.get("truncated_frac") for s in steps]),
        "reward_mean": _mean([s.get("reward_mean") for s in steps]),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results if "peak_rss_mb" in r),
        "rss_after_setup_mb": max(r["rss_after_setup_mb"] for r in results if "rss_after_setup_mb" in r),
        "phases_median_s": phase,
        "flops_median": flops,
        "achieved_gflops": achieved,
        "utilisation": achieved / peak_gflops if peak_gflops else math.nan,
        "phase_gflops": per_phase_rate,
    }


def _mean(xs: list[Any]) -> float:
    v = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def print_header(args, machine: dict[str, Any], vers: dict[str, str], model_path: str) -> None:
    f = machine["flags"]
    print("== machine")
    print(
        f"cpu: {machine['model']}; {machine['logical_cpus']} logical CPUs; torch threads {machine['torch_threads']}; "
        f"torch CPU capability {machine['torch_cpu_capability']}"
    )
    print("matrix features: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in f.items()))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    print(f"model: {args.model} -> {model_path}")
    print(
        f"settings: precision {args.precision}, G={args.group_size}, {args.prompts_per_step} prompts/step, "
        f"max_new_tokens {args.max_new_tokens}, micro-batch {args.micro_batch_size}, lr {args.lr}, beta {args.beta} (k3), "
        f"mu 1, temperature 1.0, "
        + (
            f"scaling grid G {args.scaling_groups} x max_new_tokens {args.scaling_tokens}, {args.warmup} warm-up + "
            f"{args.scaling_steps} measured steps per point"
            if args.scaling
            else f"{args.warmup} warm-up + {args.steps} measured steps per worker, {args.rounds} round(s)"
        )
    )


def print_matmul(mm: dict[str, Any]) -> None:
    print("\n== matrix rate (torch.matmul, best of repeated runs)")
    for name, d in mm.items():
        for r in d["shapes"]:
            print(f"  {name}  {r['shape']:<48} {r['gflops']:8.1f} GFLOP/s")
    if mm.get("fp32", {}).get("peak_gflops"):
        print(f"  bf16 / fp32 peak: {mm['bf16']['peak_gflops'] / mm['fp32']['peak_gflops']:.2f}x")


def print_compare(
    summary: dict[str, dict[str, Any]], results: dict[str, list[dict[str, Any]]], peak: float, precision: str
) -> None:
    ours, trl = summary.get("ours", {}), summary.get("trl", {})
    print("\n== step time (median over all measured steps; lower is better)")
    for side in ("ours", "trl"):
        if side not in summary:
            continue
        s = summary[side]
        if "error" in s:
            print(f"  {SIDES[side]:8} {s['error']}")
            continue
        print(
            f"  {SIDES[side]:8} median {fmt(s['step_s_median'])} s  (min {fmt(s['step_s_min'])}, max {fmt(s['step_s_max'])}; "
            f"round medians {', '.join(fmt(x) for x in s['round_medians_s'])}; {s['measured_steps']} steps)"
        )
    if "step_s_median" in ours and "step_s_median" in trl:
        print(
            f"  ratio grpolab / TRL: {ours['step_s_median'] / trl['step_s_median']:.3f}  "
            f"(per unit of work, s/TFLOP: {ours['s_per_tflop_median'] / trl['s_per_tflop_median']:.3f}; "
            f"< 1 means grpolab is faster)"
        )
    rows = [
        ("tokens/s (prompt+completion)", "tokens_per_s_median", 1),
        ("completion length, mean", "completion_len_mean", 1),
        ("prompt tokens / step", "prompt_tokens_per_step", 0),
        ("truncated fraction", "truncated_frac_mean", 2),
        ("reward, mean", "reward_mean", 3),
        ("peak RSS, MiB", "peak_rss_mb", 0),
        ("RSS after setup, MiB", "rss_after_setup_mb", 0),
        ("model GFLOP / step", None, 1),
        ("achieved GFLOP/s", "achieved_gflops", 1),
        (f"utilisation of {precision} matmul peak", "utilisation", 3),
    ]
    print(f"\n  {'':38} {'grpolab':>12} {'TRL':>12}")
    for label, key, d in rows:
        vals = []
        for side in ("ours", "trl"):
            s = summary.get(side, {})
            v = (
                s.get("flops_median", {}).get("total", math.nan) / 1e9
                if key is None and "flops_median" in s
                else s.get(key, math.nan)
            )
            vals.append(fmt(v, d))
        print(f"  {label:38} {vals[0]:>12} {vals[1]:>12}")
    print(f"\n== phase breakdown, median seconds per step (matmul peak {peak:.0f} GFLOP/s {precision})")
    print(f"  {'phase':14} {'grpolab':>10} {'TRL':>10}")
    for p in PHASES:
        a = ours.get("phases_median_s", {}).get(p, math.nan)
        b = trl.get("phases_median_s", {}).get(p, math.nan)
        print(f"  {p:14} {fmt(a, 3):>10} {fmt(b, 3):>10}")
    print("  achieved GFLOP/s by phase (required FLOPs / phase time):")
    for p in ("generation", "reference", "policy"):
        a = ours.get("phase_gflops", {}).get(p, math.nan)
        b = trl.get("phase_gflops", {}).get(p, math.nan)
        print(f"  {p:14} {fmt(a, 1):>10} {fmt(b, 1):>10}")
    print("\n== what actually ran")
    for side in ("ours", "trl"):
        ok = [r for r in results.get(side, []) if "error" not in r]
        if not ok:
            continue
        r = ok[0]
        print(f"  {SIDES[side]}: " + "; ".join(f"{k}: {v}" for k, v in sorted(r["precision_seen"].items())))
        print("    notes: " + ", ".join(f"{k}={v}" for k, v in r["notes"].items()))
        print(
            "    timed calls, whole run incl. warm-up: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["phase_calls"].items()))
        )
        if side == "trl":
            print(f"    old logprobs computed: {sorted({s.get('old_logprobs_computed') for s in r['steps']}, key=str)}")
    same = _same_prompts(results)
    print(f"  same prompts per step on both sides: {same}")
    for side in ("ours", "trl"):
        for r in results.get(side, []):
            if "error" in r:
                print(f"  {SIDES[side]} worker failed ({r['error']}); log: {r['log']}")
                print("    " + "\n    ".join(r["log_tail"]))


def _same_prompts(results: dict[str, list[dict[str, Any]]]) -> str:
    a = [s["prompt_uids"] for r in results.get("ours", []) if "steps" in r for s in r["warmup"] + r["steps"]]
    b = [s["prompt_uids"] for r in results.get("trl", []) if "steps" in r for s in r["warmup"] + r["steps"]]
    if not a or not b:
        return "n/a"
    n = min(len(a), len(b))
    return "yes" if a[:n] == b[:n] else "NO (see prompt_uids in the JSON)"


def run_compare(args, model_path: str, log_dir: Path, report: dict[str, Any]) -> None:
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for side in args.sides:
            print(f"  round {r + 1}/{args.rounds}: {SIDES[side]} ...", end="", flush=True)
            res = spawn(args, side, log_dir, f"round{r + 1}-{side}")
            results[side].append(res)
            if "error" in res:
                print(f" failed ({res['error']}; log {res['log']})")
            else:
                print(
                    f" step times {', '.join(fmt(s['wall_s']) for s in res['steps'])} s "
                    f"(warm-up {fmt(res['warmup'][0]['wall_s']) if res['warmup'] else '-'} s, peak RSS {res['peak_rss_mb']:.0f} MiB)"
                )
    peak = report["matmul"][args.precision]["peak_gflops"]
    summary = {side: summarise(results[side], peak) for side in args.sides}
    print_compare(summary, results, peak, args.precision)
    report.update(results=results, summary=summary)


def run_scaling(args, model_path: str, log_dir: Path, report: dict[str, Any]) -> None:
    sides = ["ours"] + (["trl"] if args.scaling_trl else [])
    peak = report["matmul"][args.precision]["peak_gflops"]
    points: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for g in args.scaling_groups:
        for m in args.scaling_tokens:
            for side in sides:
                mb = args.micro_batch_size if (g * args.prompts_per_step) % args.micro_batch_size == 0 else g
                print(f"  G={g:<3} max_new_tokens={m:<4} {SIDES[side]} ...", end="", flush=True)
                res = spawn(
                    args,
                    side,
                    log_dir,
                    f"scaling-G{g}-T{m}-{side}",
                    {
                        "group_size": g,
                        "max_new_tokens": m,
                        "micro_batch_size": mb,
                        "rounds": 1,
                        "steps": args.scaling_steps,
                    },
                )
                if "error" in res:
                    print(f" failed ({res['error']}; log {res['log']})")
                    points[side].append(
                        {"group_size": g, "max_new_tokens": m, "error": res["error"], "log": res["log"]}
                    )
                    continue
                s = summarise([res], peak)
                pt = {
                    "group_size": g,
                    "max_new_tokens": m,
                    "step_s": s["step_s_median"],
                    "gflop": s["flops_median"]["total"] / 1e9,
                    "tokens": common.median(x["tokens"] for x in res["steps"]),
                    "completion_len_mean": s["completion_len_mean"],
                    "phases_median_s": s["phases_median_s"],
                    "peak_rss_mb": s["peak_rss_mb"],
                    "utilisation": s["utilisation"],
                }
                points[side].append(pt)
                print(f" {fmt(pt['step_s'])} s/step, {fmt(pt['gflop'], 1)} GFLOP, {pt['tokens']:.0f} tokens")
    fits = {}
    print(f"\n== scaling ({args.precision}; matmul peak {peak:.0f} GFLOP/s)")
    for side in sides:
        ok = [p for p in points[side] if "error" not in p]
        print(f"  {SIDES[side]}")
        print(
            f"  {'G':>4} {'max_new':>8} {'len':>6} {'tokens':>7} {'GFLOP':>9} {'step s':>8} {'gen s':>7} {'util':>6} {'RSS MiB':>8}"
        )
        for p in ok:
            print(
                f"  {p['group_size']:>4} {p['max_new_tokens']:>8} {p['completion_len_mean']:>6.1f} {p['tokens']:>7.0f} "
                f"{p['gflop']:>9.1f} {p['step_s']:>8.2f} {p['phases_median_s']['generation']:>7.2f} {p['utilisation']:>6.3f} {p['peak_rss_mb']:>8.0f}"
            )
        f_flop = common.linear_fit([p["gflop"] for p in ok], [p["step_s"] for p in ok])
        f_tok = common.linear_fit([p["tokens"] for p in ok], [p["step_s"] for p in ok])
        fits[side] = {"vs_gflop": f_flop, "vs_tokens": f_tok}
        print(
            f"  fit step_s = {fmt(f_flop['intercept'])} + {fmt(f_flop['slope'] * 1000, 3)} ms/GFLOP * GFLOP   "
            f"(R^2 {fmt(f_flop['r2'], 3)}; marginal rate {fmt(1 / f_flop['slope'] if f_flop['slope'] else math.nan, 1)} GFLOP/s)"
        )
        print(
            f"  fit step_s = {fmt(f_tok['intercept'])} + {fmt(f_tok['slope'] * 1000, 3)} ms/token * tokens   (R^2 {fmt(f_tok['r2'], 3)})"
        )
    report.update(scaling={"points": points, "fits": fits})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="bundled alias, local checkpoint dir or hub id (default %(default)s)"
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="fp32: everything fp32. bf16: grpolab train.precision=bf16 + rollout.dtype=bfloat16; TRL bf16=True",
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--decoder",
        choices=["grpolab", "hf"],
        default="grpolab",
        help="grpolab's rollout.decoder (default: its default decode loop)",
    )
    p.add_argument(
        "--no-cpu-fast-paths",
        action="store_true",
        help="grpolab's speed.cpu_fast_paths off: decode without weights packed once per call",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward/backward, both sides")
    p.add_argument("--steps", type=int, default=3, help="measured steps per worker (after the warm-up)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps per worker, not counted")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds: ours, trl, ours, trl, ...")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads in the workers (0 = torch's default)")
    p.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's own default (off here: grpolab does not checkpoint, so off is the like-for-like setting)",
    )
    p.add_argument("--only", choices=["ours", "trl"], help="run one side only")
    p.add_argument("--matmul-seconds", type=float, default=0.5, help="time per matmul shape and dtype")
    p.add_argument(
        "--scaling", action="store_true", help="step time vs work over the G x max_new_tokens grid (grpolab)"
    )
    p.add_argument("--scaling-trl", action="store_true", help="with --scaling: TRL too")
    p.add_argument("--scaling-groups", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--scaling-tokens", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--scaling-steps", type=int, default=2, help="measured steps per grid point (after the warm-up)")
    p.add_argument("--json-out", help="write everything measured (every step of every worker) here")
    p.add_argument("--worker-timeout", type=float, default=0, help="seconds per worker process (0 = none)")
    p.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 0 or args.steps < 1 or args.rounds < 1:
        p.error("expected --steps >= 1, --rounds >= 1, --warmup >= 0")
    if (args.group_size * args.prompts_per_step) % args.micro_batch_size:
        p.error(
            f"--micro-batch-size must divide group_size * prompts_per_step = {args.group_size * args.prompts_per_step}"
        )
    args.sides = [args.only] if args.only else ["ours", "trl"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    from transformers import AutoConfig

    from grpolab.models.load import resolve_model_path

    needs_trl = "trl" in args.sides and not args.scaling or args.scaling and args.scaling_trl
    if needs_trl and importlib.util.find_spec("trl") is None:
        print('TRL is not installed: pip install -e ".[bench]"  (or run with --only ours)', file=sys.stderr)
        return 2
    model_path = resolve_model_path(args.model)
    args.model = model_path  # workers load the resolved local directory: both sides read the same files
    machine, vers = common.cpu_features(), versions()
    print_header(args, machine, vers, model_path)
    config = AutoConfig.from_pretrained(model_path)
    shape = common.ModelShape.from_config(config)
    mm = measure_matmul(shape, getattr(config, "intermediate_size", None), args.matmul_seconds)
    print_matmul(mm)
    log_dir = Path(tempfile.mkdtemp(prefix="grpolab-bench-logs-"))
    report: dict[str, Any] = {
        "machine": machine,
        "versions": vers,
        "settings": settings_dict(args),
        "model_path": model_path,
        "shape": common.shape_dict(shape),
        "matmul": mm,
        "log_dir": str(log_dir),
    }
    print(f"\n== runs (worker logs in {log_dir})")
    if args.scaling:
        run_scaling(args, model_path, log_dir, report)
    else:
        run_compare(args, model_path, log_dir, report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
