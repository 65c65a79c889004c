"""The rollout engine of a run (rollout.engine): grpolab's own decode loop in this process (grpolab.rollout.hf), the
same loop in a worker process (grpolab_process: grpolab.rollout.grpolab_worker), or vLLM's offline engine in a worker
process of its own venv (grpolab.rollout.vllm_engine; docs/vllm.md). Each keeps a sampler's copy of the weights that
the trainer syncs after every update, and each samples the in-training held-out eval. Agent episodes run turn by turn
on the policy's own KV cache, so they need the in-process engine."""

from __future__ import annotations

from typing import Any

import torch

from ..config import Config
from ..errors import ConfigError
from ..models.load import DTYPES
from ..rollout.hf import HFEngine
from ..tasks.base import Problem
from ..tasks.prompting import prompt_ids


def longest_sequence(cfg: Config, tokenizer, problems: list[Problem]) -> int:
    """What vLLM's max_model_len must hold: the run's longest rendered prompt plus the larger of
    rollout.max_new_tokens and eval.max_new_tokens, plus 1 (scoring a whole sequence asks the engine for one more
    token after it: VLLMEngine.score, the untruncated logprobs under top-k / top-p)."""
    longest_prompt = max((len(prompt_ids(tokenizer, p)) for p in problems), default=0)
    return longest_prompt + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens) + 1


def make_engine(
    cfg: Config, policy, tokenizer, sampling_dtype: str, sharded: bool, problems: list[Problem], agent: bool
) -> Any:
    """The run's RolloutEngine (module docstring); ``problems``: every train and held-out problem (vLLM's length
    bound); ``agent``: the run plays multi-turn episodes (refused with vLLM)."""
    r, speed = cfg.rollout, cfg.speed
    if r.engine == "grpolab":
        dtype = DTYPES[sampling_dtype]
        return HFEngine(policy, tokenizer, dtype, r.decoder, sharded, speed.cpu_fast_paths, speed.preallocate_kv_cache)
    if agent:
        raise ConfigError(
            "rollout.engine: expected grpolab for an agent task (its episodes continue each turn on the sampler's own "
            f"KV cache, which a worker process does not expose), got {r.engine}"
        )
    dtype = torch.bfloat16 if sampling_dtype == "bfloat16" else torch.float32
    if r.engine == "grpolab_process":
        from ..rollout.worker_engine import GrpolabProcessEngine

        return GrpolabProcessEngine(
            policy,
            tokenizer,
            dtype,
            threads=r.worker_threads,
            speed={"cpu_fast_paths": speed.cpu_fast_paths, "preallocate_kv_cache": speed.preallocate_kv_cache},
            max_model_len=longest_sequence(cfg, tokenizer, problems),
            seed=cfg.train.seed,
            start_timeout=r.vllm_start_timeout_s,
            call_timeout=r.vllm_call_timeout_s,
        )
    from ..rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        policy,
        tokenizer,
        dtype,
        python=r.vllm_python or None,
        max_model_len=longest_sequence(cfg, tokenizer, problems),
        seed=cfg.train.seed,
        start_timeout=r.vllm_start_timeout_s,
        call_timeout=r.vllm_call_timeout_s,
    )


def sync_metrics(engine: Any) -> dict[str, float]:
    """time/weight_sync_s and sync/bytes of the last weight sync a worker process answered (rollout.engine: vllm or
    grpolab_process; with rollout.max_staleness > 0 the newest load answered so far); {} for the in-process engine,
    whose copy is made in place."""
    last = getattr(engine, "last_sync", None)
    return {"time/weight_sync_s": last["total_s"], "sync/bytes": last["bytes"]} if last else {}
