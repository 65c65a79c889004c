"""The rollout engine of a run, one registry keyed by ``rollout.engine`` (docs/vllm.md, docs/async.md):

- ``grpolab``: grpolab's own engine in this process (grpolab.rollout.grpolab_engine; rollout.decoder picks its
  decode loop or transformers' generate);
- ``grpolab_process``: the same decode loop in a worker process (grpolab.rollout.worker_engine.GrpolabProcessEngine);
- ``vllm``: vLLM's offline engine in a worker process of its own venv (grpolab.rollout.vllm_engine);
- ``vllm_server``: vLLM servers over HTTP, started by the user (rollout.servers) or here (rollout.num_servers), weights
  through vLLM's weight-transfer API (grpolab.rollout.server_engine).

Each keeps a sampler's copy of the weights that the trainer syncs after every update, and each samples the
in-training held-out eval. All but ``grpolab`` are QueuedEngines (rollout/base.py): they keep the next steps'
generations in flight for rollout.max_staleness. Agent episodes run turn by turn on the policy's own KV cache, so
they need the in-process engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..config import Config
from ..errors import ConfigError
from ..models.load import DTYPES
from ..tasks.base import Problem
from ..tasks.prompting import prompt_ids
from .base import Ranks, RolloutEngine
from .grpolab_engine import GrpolabEngine
from .server_engine import VLLMServerEngine
from .vllm_engine import VLLMEngine
from .worker_engine import GrpolabProcessEngine


@dataclass(frozen=True)
class EngineRequest:
    """What an engine is built from: the run's config, the policy and its tokenizer, the sampler dtype (rollout.dtype
    resolved: "float32", "bfloat16" or "float16"), whether the policy is about to be sharded (train.strategy fsdp2:
    the sampler keeps its own copy) and every train and held-out problem (a worker engine's length bound)."""

    cfg: Config
    policy: torch.nn.Module
    tokenizer: object
    sampling_dtype: str
    sharded: bool
    problems: list[Problem]
    run_dir: Path | None = None  # where engines keep their logs (the servers grpolab starts)
    ranks: Ranks = Ranks()  # the trainer's processes under torchrun (vllm_server: rank 0 alone syncs the servers)


def longest_sequence(cfg: Config, tokenizer, problems: list[Problem]) -> int:
    """What a worker engine's max_model_len must hold: the run's longest rendered prompt plus the larger of
    rollout.max_new_tokens and eval.max_new_tokens, plus 1 (scoring a whole sequence asks the engine for one more
    token after it: WorkerEngine.score, the untruncated logprobs under top-k / top-p)."""
    longest_prompt = max((len(prompt_ids(tokenizer, p)) for p in problems), default=0)
    return longest_prompt + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens) + 1


SAMPLER_DTYPES = {**DTYPES, "float16": torch.float16}
"""rollout.dtype resolved -> the sampler's weight dtype (float16: explicit only, never what auto picks)."""


def _worker_dtype(sampling_dtype: str) -> torch.dtype:
    return SAMPLER_DTYPES[sampling_dtype]


def grpolab_engine(req: EngineRequest) -> GrpolabEngine:
    r, speed = req.cfg.rollout, req.cfg.speed
    dtype = SAMPLER_DTYPES[req.sampling_dtype]
    return GrpolabEngine(
        req.policy, req.tokenizer, dtype, r.decoder, req.sharded, speed.cpu_fast_paths, speed.preallocate_kv_cache
    )


def grpolab_process_engine(req: EngineRequest) -> GrpolabProcessEngine:
    cfg, r, speed = req.cfg, req.cfg.rollout, req.cfg.speed
    return GrpolabProcessEngine(
        req.policy,
        req.tokenizer,
        _worker_dtype(req.sampling_dtype),
        threads=r.worker_threads,
        speed={"cpu_fast_paths": speed.cpu_fast_paths, "preallocate_kv_cache": speed.preallocate_kv_cache},
        max_model_len=longest_sequence(cfg, req.tokenizer, req.problems),
        seed=cfg.train.seed,
        start_timeout=r.worker_start_timeout_s,
        call_timeout=r.worker_call_timeout_s,
    )


def vllm_engine(req: EngineRequest) -> VLLMEngine:
    cfg, r = req.cfg, req.cfg.rollout
    return VLLMEngine(
        req.policy,
        req.tokenizer,
        _worker_dtype(req.sampling_dtype),
        python=r.vllm_python or None,
        max_model_len=longest_sequence(cfg, req.tokenizer, req.problems),
        seed=cfg.train.seed,
        start_timeout=r.worker_start_timeout_s,
        call_timeout=r.worker_call_timeout_s,
    )


def vllm_server_engine(req: EngineRequest) -> VLLMServerEngine:
    cfg, r = req.cfg, req.cfg.rollout
    if req.ranks.size > 1 and not r.servers:
        raise ConfigError(
            f"rollout.servers: expected the URLs of running servers with {req.ranks.size} trainer processes "
            "(torchrun): servers started here (rollout.num_servers) would be one set per process; start `vllm serve` "
            "on the inference hosts and list them (docs/vllm.md)"
        )
    return VLLMServerEngine(
        req.policy,
        req.tokenizer,
        _worker_dtype(req.sampling_dtype),
        servers=list(r.servers),
        num_servers=r.num_servers,
        server_devices=list(r.server_devices),
        python=r.vllm_python or None,
        max_model_len=longest_sequence(cfg, req.tokenizer, req.problems),
        seed=cfg.train.seed,
        start_timeout=r.worker_start_timeout_s,
        call_timeout=r.worker_call_timeout_s,
        log_dir=req.run_dir,
        transfer_host=r.weight_transfer_host,
        ranks=req.ranks,
        lora_sync=r.lora_sync,
        adapter_dir=r.adapter_dir,
        adapter_slots=r.max_staleness + 2,  # the newest version, those still sampling, the one being loaded
    )


ENGINES: dict[str, Callable[[EngineRequest], RolloutEngine]] = {
    "grpolab": grpolab_engine,
    "grpolab_process": grpolab_process_engine,
    "vllm": vllm_engine,
    "vllm_server": vllm_server_engine,
}
"""rollout.engine -> its builder (config.RolloutConfig.engine lists the same names)."""

QUEUED_ENGINES = frozenset({"grpolab_process", "vllm", "vllm_server"})
"""The engines that are QueuedEngines, requests kept in flight (rollout.max_staleness > 0): the two in a worker process
and the servers (whose syncs also keep them: per-token versions, grpolab.rollout.server_engine)."""

IN_PROCESS_ENGINES = frozenset({"grpolab"})
"""The engines whose sampler is a model in this process (agent episodes continue on its KV cache)."""


def make_engine(req: EngineRequest, agent: bool) -> RolloutEngine:
    """The run's engine (module docstring); ``agent``: the run plays multi-turn episodes (in-process engines only)."""
    name = req.cfg.rollout.engine
    if agent and name not in IN_PROCESS_ENGINES:
        raise ConfigError(
            "rollout.engine: expected grpolab for an agent task (its episodes continue each turn on the sampler's own "
            f"KV cache, which a worker process does not expose), got {name}"
        )
    if name not in ENGINES:
        raise ConfigError(f"rollout.engine: expected one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name](req)
