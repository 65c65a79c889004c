"""A rollout engine in a worker process: the trainer-side half (docs/vllm.md, docs/async.md).

``WorkerEngine`` is a RolloutEngine (rollout/base.py) whose sampling happens in another process (an
``EngineProcess``: grpolab.rollout.workers.process). This half owns everything that needs grpolab: the results
contract (completion ids right-padded, the mask 1 through the stop token, the truncation flags, the sampled tokens'
logprobs, texts decoded with grpolab's tokenizer), stop rules (rollout/stop.py, applied to the returned tokens: a
prefix is sampled alike whatever follows it, so cutting after the fact is exact), and the weights (the policy's,
LoRA merged, written once per sync to shared memory as safetensors, one file per version until the worker has
loaded it).

Requests may stay in flight: ``submit`` sends a generation and returns at once, ``finish`` collects its rollout;
``sync_weights(policy, wait=False)`` queues a weight load behind them. The worker answers in the order asked, so a
generation submitted before a sync samples from the old weights and one submitted after it from the new ones --
what rollout.max_staleness's pipeline (grpolab.training.pipeline) builds on. ``generate`` is submit + finish.

Two workers answer these requests: vLLM's (grpolab.rollout.vllm_engine, in vLLM's own venv) and grpolab's own
decode loop in a process of its own (``GrpolabProcessEngine``, grpolab.rollout.workers.grpolab_worker).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import GrpolabError
from ..models.lora import MergedWeights, is_lora
from .base import Rollout, SamplingParams
from .grpolab_engine import eos_ids, group_rollout, left_pad
from .stop import stop_rule
from .workers.process import EngineDied, EngineProcess, EngineUnavailable, cause_line, shared_memory_dir

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
GRPOLAB_WORKER_SCRIPT = Path(__file__).parent / "workers" / "grpolab_worker.py"


def policy_tensors(policy: torch.nn.Module, dtype: torch.dtype, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's weights by their plain HF names, in `dtype`, on the CPU, contiguous: a LoRA policy's merged
    W + (alpha / r) B A (grpolab.models.lora.MergedWeights; ``merge=False``: its base W), an FSDP2-sharded policy's
    gathered. A tensor tied under several names (the embeddings and lm_head) is given under each name, as its own
    copy: the engine holds the model untied (see `engine_config`)."""
    plain = dict(policy.named_parameters(remove_duplicate=False))
    named = MergedWeights(policy, merge=merge) if is_lora(policy) else plain
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    with torch.no_grad():
        for name in named:
            t = named[name]
            full = t.full_tensor() if isinstance(t, DTensor) else t  # an FSDP2 shard: gathered (a collective)
            cast = full.detach().to(device="cpu", dtype=dtype)
            out[name] = cast.clone() if id(t) in seen else cast.contiguous()
            seen.add(id(t))
    return out


def join_gathers(policy: torch.nn.Module) -> None:
    """The collectives policy_tensors takes on an FSDP2-sharded policy (each tensor's all-gather, in its order), for a
    rank that sends nothing; nothing for a policy that is not sharded."""
    with torch.no_grad():
        for tensor in dict(policy.named_parameters(remove_duplicate=False)).values():
            if isinstance(tensor, DTensor):
                tensor.full_tensor()


def engine_config(policy: torch.nn.Module):
    """The policy's config as the engine gets it: word embeddings untied. vLLM 0.32's in-place weight reload leaves
    a tied lm_head with its old values (it restores the kernel tensors of a layer the checkpoint names no weight
    for; measured: after a sync the engine's logprobs followed neither model); untied, both matrices are loaded
    on every sync, and the logits are the same numbers."""
    from copy import deepcopy

    config = deepcopy(plain_model(policy).config)
    config.tie_word_embeddings = False
    return config


def plain_model(policy: torch.nn.Module) -> torch.nn.Module:
    return policy.get_base_model() if is_lora(policy) else policy


def right_pad(rows: list[list], value, dtype: torch.dtype) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


@dataclass
class PendingRollout:
    """A generation sent to the worker and not yet collected (WorkerEngine.submit)."""

    prompts: list[list[int]]
    params: SamplingParams
    group_size: int
    want_logp: bool
    truncating: bool
    reply: dict | None = None


@dataclass
class _InFlight:
    """A request sent and not yet answered: its op, the generation it carries, or the weight file it loads."""

    op: str
    pending: PendingRollout | None = None
    path: Path | None = None
    began: float = 0.0
    written: float = 0.0
    bytes: float = 0.0


class WorkerEngine:
    """RolloutEngine on a worker process (module docstring). Construct with the policy, grpolab's tokenizer and the
    sampler dtype; `close()` (or the process's exit) stops the worker.

    python / worker_script / name: the worker; start_timeout / call_timeout: bounds in seconds on the engine's start
    (model load) and on each later reply; max_model_len: the longest prompt + completion the engine holds;
    start_fields: more fields of the worker's ``start`` request; env: more environment variables for it."""

    install_hint = ""

    def __init__(
        self,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        dtype: torch.dtype,
        python: str | Path,
        worker_script: Path,
        name: str,
        max_model_len: int = 2048,
        seed: int = 0,
        start_timeout: float = 900.0,
        call_timeout: float = 1800.0,
        start_fields: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ):
        if dtype not in DTYPES:
            raise ValueError(f"rollout.dtype: expected one of {sorted(DTYPES.values())} for {name}, got {dtype}")
        self.tokenizer, self.dtype, self.call_timeout, self.name = tokenizer, dtype, call_timeout, name
        self.stop_ids = eos_ids(plain_model(policy), tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self._triggers: dict[str, set[int]] = {}
        self._inflight: deque[_InFlight] = deque()
        self._versions = 0
        self.last_sync: dict[str, float] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="grpolab-engine-", dir=shared_memory_dir()))
        weakref.finalize(self, shutil.rmtree, self.workdir, True)
        model_dir = self.workdir / "model"
        self._write_model_dir(policy, model_dir)
        self.process = EngineProcess(Path(python), worker_script, self.workdir, name, env, self.install_hint)
        try:
            reply = self.process.request(
                "start",
                start_timeout,
                model_dir=str(model_dir),
                dtype=DTYPES[dtype],
                max_model_len=max_model_len,
                seed=seed,
                **(start_fields or {}),
            )
        except GrpolabError as e:
            self.close()
            hint = f" ({self.install_hint})" if self.install_hint else ""
            raise EngineUnavailable(f"{name} did not start: {cause_line(str(e))}{hint}\n{e}") from None
        self.version, self.start_s = reply.get("version", ""), reply["start_s"]
        shutil.rmtree(model_dir, ignore_errors=True)  # loaded: the engine holds its own copy

    def _write_model_dir(self, policy: torch.nn.Module, model_dir: Path) -> None:
        from safetensors.torch import save_file

        model_dir.mkdir()
        engine_config(policy).save_pretrained(model_dir)
        plain_model(policy).generation_config.save_pretrained(model_dir)
        save_file(policy_tensors(policy, self.dtype), str(model_dir / "model.safetensors"), metadata={"format": "pt"})

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._inflight)

    def close(self) -> None:
        if hasattr(self, "process"):
            self.process.close()
        self._inflight.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ replies in order

    def _send(self, entry: _InFlight, **fields) -> None:
        self.process.send(entry.op, **fields)
        self._inflight.append(entry)

    def _drain_through(self, target: _InFlight) -> dict:
        """Take replies in order until `target`'s has come; each reply waits at most call_timeout."""
        while self._inflight:
            entry = self._inflight[0]
            try:
                reply = self.process.receive(entry.op, self.call_timeout)
            finally:
                if entry.path is not None:
                    entry.path.unlink(missing_ok=True)
            self._inflight.popleft()
            if entry.op == "load_weights":
                self.last_sync = {
                    "bytes": entry.bytes,
                    "write_s": entry.written - entry.began,
                    "load_s": float(reply["load_s"]),
                    "total_s": entry.written - entry.began + float(reply["load_s"]),
                }
            if entry.pending is not None:
                entry.pending.reply = reply
            if entry is target:
                return reply
        raise GrpolabError(f"{self.name}: a reply was awaited for a request that was never sent ({target.op!r})")

    def _request(self, op: str, **fields) -> dict:
        entry = _InFlight(op)
        self._send(entry, **fields)
        return self._drain_through(entry)

    def wait_all(self) -> None:
        """Wait for every request in flight (e.g. before a checkpoint: the pending generations' rollouts)."""
        if self._inflight:
            self._drain_through(self._inflight[-1])

    # ------------------------------------------------------------------------------------------ weights

    def sync_weights(self, policy: torch.nn.Module, wait: bool = True) -> None:
        """The policy's weights (LoRA merged, cast to the engine's dtype) into the engine: a safetensors file in
        shared memory (one per version), loaded in place by the worker after the requests sent before it, then
        removed. wait=False returns once the file is written. `last_sync` records bytes and seconds of the newest
        load answered."""
        from safetensors.torch import save_file

        began = time.perf_counter()
        tensors = policy_tensors(policy, self.dtype)
        self._versions += 1
        path = self.workdir / f"weights-{self._versions}.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        entry = _InFlight("load_weights", path=path, began=began, written=time.perf_counter())
        entry.bytes = float(sum(t.numel() * t.element_size() for t in tensors.values()))
        try:
            self._send(entry, path=str(path))
        except GrpolabError:
            path.unlink(missing_ok=True)
            raise
        if wait:
            self._drain_through(entry)

    # ------------------------------------------------------------------------------------------ sampling

    def score(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The engine's teacher-forced log softmax(logits)(token) of every token after the first of each sequence
        (temperature 1, nothing truncated): [len(seq) - 1] float32 each."""
        reply = self._request("score", sequences=[list(map(int, s)) for s in sequences])
        return [torch.tensor(r, dtype=torch.float32) for r in reply["logprobs"]]

    def check_params(self, params: SamplingParams) -> None:
        """What this engine cannot sample (ValueError naming the setting); none here."""

    def pending(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None) -> PendingRollout:
        """The record of a generation about to be sent (seeds and params checked): completions per prompt, whether
        log-probabilities are wanted and whether top-k / top-p truncate."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds: expected one per prompt ({len(prompts)}), got {len(seeds)}")
        self.check_params(params)
        g = 1 if params.greedy else params.group_size
        want_logp = params.logprobs and not params.greedy
        truncating = params.top_k > 0 or params.top_p < 1.0
        return PendingRollout([list(map(int, p)) for p in prompts], params, g, want_logp, truncating)

    def submit(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> PendingRollout:
        """Send a generation (see ``generate``) and return at once; ``finish`` collects it."""
        pending = self.pending(prompts, params, seeds)
        g, want_logp, truncating = pending.group_size, pending.want_logp, pending.truncating
        self._send(
            _InFlight("generate", pending),
            prompts=pending.prompts,
            n=g,
            greedy=params.greedy,
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k),
            max_tokens=int(params.max_new_tokens),
            logprobs=want_logp,
            seeds=None if seeds is None else [int(s) for s in seeds],
            stop_token_ids=self.stop_ids,
            stop_rule=params.stop_rule,
            untruncated=want_logp and truncating,
        )
        return pending

    def finish(self, pending: PendingRollout) -> Rollout:
        """The rollout of a submitted generation (waiting for it and for every request sent before it)."""
        if pending.reply is None:
            entry = next((e for e in self._inflight if e.pending is pending), None)
            if entry is None:
                raise GrpolabError(f"{self.name}: this generation was not submitted to the running worker")
            self._drain_through(entry)
        return self._rollout(pending)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """G completions per prompt, group-major; seeds: one per prompt, the seed of its request (the worker draws
        the group's n samples from one generator seeded with it)."""
        return self.finish(self.submit(prompts, params, seeds))

    def _rollout(self, pending: PendingRollout) -> Rollout:
        reply, prompts, g = pending.reply, pending.prompts, pending.group_size
        rows = [c for group in reply["groups"] for c in group]
        if len(rows) != g * len(prompts):
            raise EngineDied(f"{self.name} returned {len(rows)} completions for {len(prompts)} prompts x {g}")
        tokens = [c["token_ids"] for c in rows]
        lengths = self._apply_stop_rule(tokens, pending.params.stop_rule)
        stopped = [n < len(t) or (n > 0 and t[n - 1] in self.stop_ids) for t, n in zip(tokens, lengths)]
        kept = [t[:n] for t, n in zip(tokens, lengths)]
        comp = right_pad(kept, self.pad_id, torch.long)
        cmask = right_pad([[1] * n for n in lengths], 0, torch.long)
        truncated = torch.tensor([not s for s in stopped], dtype=torch.bool)
        if pending.want_logp:
            logp = right_pad([c["logprobs"][:n] for c, n in zip(rows, lengths)], 0.0, torch.float32)
        else:
            logp = torch.full(comp.shape, float("nan"), dtype=torch.float32)
        untruncated = None
        if pending.want_logp and pending.truncating:
            untruncated = self._untruncated(kept, comp.shape, rows)
        ids, mask = left_pad(prompts, self.pad_id)
        return group_rollout(self.tokenizer, ids, mask, g, comp, cmask, logp, untruncated, truncated)

    def _untruncated(self, kept: list[list[int]], shape, rows: list[dict]) -> torch.Tensor:
        """log softmax(logits / T)(o_t) of the kept completion tokens, as the worker returned them
        (``logprobs_untruncated``: computed in the generation's own request, so on the weights that sampled)."""
        out = torch.zeros(shape, dtype=torch.float32)
        for i, (k, c) in enumerate(zip(kept, rows)):
            if "logprobs_untruncated" not in c:
                raise EngineDied(f"{self.name} returned no untruncated logprobs (asked for under top_k / top_p)")
            out[i, : len(k)] = torch.tensor(c["logprobs_untruncated"][: len(k)], dtype=torch.float32)
        return out

    def _apply_stop_rule(self, tokens: list[list[int]], rule_name: str) -> list[int]:
        """Each row's length once the stop rule (rollout/stop.py) has ended it: the first token after which the rule
        holds, asked only at tokens whose text holds one of the rule's characters (as the decode loop does)."""
        rule = stop_rule(rule_name)
        if rule is None:
            return [len(t) for t in tokens]
        check, chars = rule
        if rule_name not in self._triggers:
            pieces = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            self._triggers[rule_name] = {i for i, p in enumerate(pieces) if p and any(c in p for c in chars)}
        triggers = self._triggers[rule_name]
        lengths = []
        for row in tokens:
            n = len(row)
            for t, tok in enumerate(row):
                if tok in self.stop_ids:
                    break
                if tok in triggers and check(self.tokenizer.decode(row[: t + 1], skip_special_tokens=True)):
                    n = t + 1
                    break
            lengths.append(n)
        return lengths


class GrpolabProcessEngine(WorkerEngine):
    """grpolab's own decode loop (rollout.decoder grpolab: GrpolabEngine) in a worker process of this Python
    (``rollout.engine: grpolab_process``; grpolab.rollout.workers.grpolab_worker): the same samples as the in-process engine
    for the same weights, seeds and thread count, generated while the trainer does something else. threads: the
    worker's torch threads (0: torch's default)."""

    def __init__(self, policy, tokenizer, dtype: torch.dtype, threads: int = 0, speed: dict | None = None, **kwargs):
        self._tokenizer_to_save = tokenizer
        fields = {"threads": int(threads), "speed": dict(speed or {})}
        super().__init__(
            policy,
            tokenizer,
            dtype,
            python=sys.executable,
            worker_script=GRPOLAB_WORKER_SCRIPT,
            name="grpolab worker",
            start_fields=fields,
            **kwargs,
        )

    def _write_model_dir(self, policy: torch.nn.Module, model_dir: Path) -> None:
        super()._write_model_dir(policy, model_dir)
        self._tokenizer_to_save.save_pretrained(model_dir)  # the worker's decode loop decodes for stop rules
