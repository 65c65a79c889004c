"""vLLM servers as the rollout engine (``rollout.engine: vllm_server``; docs/vllm.md, "vLLM servers").

``VLLMServerEngine`` samples on one or more OpenAI-compatible ``vllm serve`` processes: servers the user started
(``rollout.servers``, any host) or ``rollout.num_servers`` that it starts itself from vLLM's environment on this host
(grpolab.rollout.servers.LocalServer). Prompts go in as token ids (vLLM's token-in, token-out route
``/inference/v1/generate``), one request per prompt with n = group size, prompt i to server i mod the number of
servers; each completion comes back with its token ids, the sampled tokens' log-probabilities under the distribution
sampled from (the servers run ``--logprobs-mode processed_logprobs``, as the offline worker) and the weight version
that sampled it (``Rollout.weight_versions``). Weights go in through vLLM's weight-transfer API (gloo on CPUs:
grpolab.rollout.weight_transfer), to every server at once, each sync checked on every server by its weight version.

Faults (grpolab.rollout.servers.ServerPool): a request whose server died or hung is sent again, unchanged, to another
server in rotation, and that server is out for the rest of the run (a server started here is stopped, its log kept);
syncs skip it. No server left, or one in rotation that fails a sync, is a ``ServerFault``: the trainer stops with a
checkpoint (grpolab.training.sampler_faults).

Under torchrun every trainer process samples its own groups on the same servers (rank r's prompt i to server r + i
mod their number) and rank 0 alone holds the weight-transfer groups and syncs; each sync ends with a collective, so
no rank samples before the servers hold the new weights and every rank learns of a failed sync
(``grpolab.rollout.base.Ranks``).

It shares the offline engine's results contract, stop rules and parameter checks (grpolab.rollout.worker_engine
.WorkerEngine, grpolab.rollout.vllm_engine.VLLMEngine.check_params); what differs is the transport.

Requests stay in flight (a QueuedEngine, for rollout.max_staleness): ``submit`` sends a generation's requests from
background threads and returns, ``finish`` collects them. A weight sync does not wait for them: it pauses every
server with requests kept, transfers, drops the old weights' KV and resumes (grpolab.rollout.weight_transfer
.paused), so a completion may be sampled under two or more weight versions. vLLM reports each completion's
per-token version spans; they become ``Rollout.token_versions`` (policy version = label - 1), and each token's
log-probability is the one the server computed for it, so q is per token, from the weights that drew it. A
completion without spans, or one the server aborted, is an error, never guessed; so is an untruncated scoring pass
(top-k / top-p) with a sync since the generation was sent (it would score on other weights).

A LoRA run with ``rollout.lora_sync: adapter`` syncs only the adapter (grpolab.rollout.server_adapters): each version
its own adapter on the servers, each request naming the one it samples with.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .base import Ranks, Rollout, SamplingParams
from .grpolab_engine import eos_ids
from .server_adapters import AdapterVersions, adapter_tensors, check_lora_server, lora_rank, lora_serve_flags
from .servers import (
    LocalServer,
    ServerClient,
    ServerError,
    ServerFault,
    ServerPool,
    check_server,
    device_env,
    free_port,
    generate_body,
    policy_version,
    serve_command,
    token_labels,
)
from .vllm_engine import VLLMEngine, default_vllm_python
from .weight_transfer import GlooSender, paused, reach_address
from .worker_engine import (
    DTYPES,
    PendingRollout,
    WorkerEngine,
    join_gathers,
    plain_model,
    policy_tensors,
    right_pad,
)
from .workers.process import EngineUnavailable, shared_memory_dir

GENERATE = "/inference/v1/generate"
MAX_CONCURRENT = 64  # requests open at once per generation, over all servers (each server batches what it has)
GENERATIONS_IN_FLIGHT = 8  # generations collected at once in the background (rollout.max_staleness <= this is cheap)


@dataclass
class ServerPending(PendingRollout):
    """A generation sent from background threads: its collection (``future``), the newest weight version and the
    number of syncs completed when it was sent."""

    future: Future | None = None
    version_at_send: int = 0
    syncs_at_send: int = 0


def release(local: list, log_dir, workdirs: list[Path]) -> None:
    """Stop the servers started here, copy their logs into `log_dir` (the run directory), remove `workdirs`."""
    for server in local:
        server.close()
        server.keep_log(log_dir)
    local.clear()
    for workdir in workdirs:
        shutil.rmtree(workdir, ignore_errors=True)


class VLLMServerEngine(WorkerEngine):
    """RolloutEngine on vLLM servers (module docstring). ``servers``: URLs of running servers; none: start
    ``num_servers`` here (``python``: vLLM's environment, ``kv_cache_gib``: each one's CPU KV cache,
    ``server_devices``: each one's cores or GPUs, servers.device_env), their logs copied
    into ``log_dir`` at close. ``start_timeout`` bounds a server's start, ``call_timeout`` each request and each
    sync; ``transfer_host``: the address servers reach this trainer at for the weights ("" = the one on the route to
    each server); ``ranks``: the trainer's processes (torchrun: rank 0 alone syncs, module docstring). The policy's
    weights are synced to every server before the first rollout. ``lora_sync="adapter"`` (a LoRA policy, one
    process): syncs write the adapter under ``adapter_dir`` ("" = this host's shared memory) for the servers to load,
    up to ``adapter_slots`` versions held at once (grpolab.rollout.server_adapters)."""

    name = "vLLM server"
    check_params = VLLMEngine.check_params

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer,
        dtype: torch.dtype = torch.float32,
        servers: list[str] | tuple[str, ...] = (),
        num_servers: int = 1,
        python: str | Path | None = None,
        max_model_len: int = 2048,
        seed: int = 0,
        start_timeout: float = 900.0,
        call_timeout: float = 1800.0,
        log_dir: str | Path | None = None,
        transfer_host: str = "",
        kv_cache_gib: int = 1,
        ranks: Ranks = Ranks(),
        server_devices: list[str] | tuple[str, ...] = (),
        lora_sync: str = "merged",
        adapter_dir: str | Path = "",
        adapter_slots: int = 2,
    ):
        if dtype not in DTYPES:
            raise ValueError(f"rollout.dtype: expected one of {sorted(DTYPES.values())} for {self.name}, got {dtype}")
        self.tokenizer, self.dtype, self.call_timeout = tokenizer, dtype, call_timeout
        self.stop_ids, self.pad_id, self._triggers = eos_ids(plain_model(policy), tokenizer), tokenizer.pad_token_id, {}
        self.log_dir, self.local, self.senders, self._versions, self.ranks = log_dir, [], [], 0, ranks
        self.last_sync: dict[str, float] = {}
        self.syncs_done = 0  # syncs completed (an in-flight generation's scoring pass must see none after it was sent)
        self._jobs = ThreadPoolExecutor(GENERATIONS_IN_FLIGHT, thread_name_prefix="grpolab-generation")
        self._in_flight: set[Future] = set()
        self.server_devices = list(server_devices)  # servers started here: each one's devices (servers.device_env)
        self.workdir = Path(tempfile.mkdtemp(prefix="grpolab-servers-", dir=shared_memory_dir()))
        self.lora_rank, self.adapters = lora_rank(policy) if lora_sync == "adapter" else 0, None
        if self.lora_rank and ranks.size > 1:
            raise ConfigError(f"rollout.lora_sync: adapter syncs from one trainer process; with {ranks.size} (torchrun) "
                              "set rollout.lora_sync: merged")  # fmt: skip
        adapters = Path(
            tempfile.mkdtemp(prefix="grpolab-adapters-", dir=(self.lora_rank and adapter_dir) or self.workdir)
        )
        # close(), or the process's exit: the servers started here stopped, their logs kept, the workdirs removed
        self._release = weakref.finalize(self, release, self.local, log_dir, [self.workdir, adapters])
        try:
            if not servers:
                extra = lora_serve_flags(self.lora_rank, adapter_slots) if self.lora_rank else []
                servers = self._launch(policy, num_servers, python, max_model_len, seed, start_timeout, kv_cache_gib,
                                       extra)  # fmt: skip
            self.clients = [ServerClient(url, call_timeout) for url in servers]
            self.pool = ServerPool(self.clients, self._left_rotation)
            self.adapters = AdapterVersions(self.clients, adapters) if self.lora_rank else None
            lead = ranks.rank == 0
            infos = [check_server(c, tokenizer, max_model_len, GlooSender.backend, lead) for c in self.clients]
            for c, info in zip(self.clients, infos) if self.lora_rank else ():
                check_lora_server(f"rollout.servers: {c.url}", info["config"], self.lora_rank, adapter_slots)
            self.version = self._one_version([i["version"] for i in infos])
            self.senders = [
                GlooSender(c, transfer_host or reach_address(c.url), i["world_size"], call_timeout)
                for c, i in zip(self.clients, infos)
                if ranks.rank == 0  # one weight-transfer group per server: rank 0's
            ]
            self.start_s = 0.0
            self.first_sync(policy)
        except BaseException:
            self.close()
            raise

    def first_sync(self, policy: torch.nn.Module) -> None:
        """The policy's weights into every server before training; a server that cannot load them (another model)
        is refused naming it."""
        self._versions = 1
        try:
            self._sync(policy, "1")
        except ServerError as e:
            model = plain_model(policy)
            raise ServerError(
                f"rollout.servers: the run's model ({type(model).__name__}, "
                f"{sum(p.numel() for p in model.parameters())} parameters) could not be loaded into every server: {e}"
            ) from None

    def _launch(self, policy, count: int, python, max_model_len: int, seed: int, timeout: float, kv_gib: int,
                extra: list[str]):  # fmt: skip
        """Start `count` servers of the policy (its config untied, as the offline engine's; `extra`: more flags, the
        LoRA ones with adapters) and wait for each."""
        python = Path(python or default_vllm_python())
        if not python.is_file():
            raise EngineUnavailable(f"{self.name}: no Python at {python}; {VLLMEngine.install_hint}")
        model_dir = self.workdir / "model"
        self._write_model_dir(policy, model_dir)
        self.tokenizer.save_pretrained(model_dir)  # the server's /tokenize answers the tokenizer check
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_gib)}
        if extra:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        devices = self.server_devices or [""] * count
        if len(devices) != count:
            raise ValueError(f"rollout.server_devices: expected one entry per server ({count}), got {devices}")
        began = time.perf_counter()
        for i in range(count):
            port = free_port()
            command = serve_command(python, model_dir, port, DTYPES[self.dtype], max_model_len, seed, "gloo", extra)
            log = self.workdir / f"vllm_server_{i}.log"
            placed = {**env, **device_env(devices[i])} if devices[i] else env
            self.local.append(LocalServer(command, log, placed, f"http://127.0.0.1:{port}"))
        for server in self.local:
            server.wait_ready(max(1.0, timeout - (time.perf_counter() - began)))
        shutil.rmtree(model_dir, ignore_errors=True)  # loaded: each server holds its own copy
        return [s.url for s in self.local]

    def _one_version(self, versions: list[str]) -> str:
        for client, v in zip(self.clients, versions):
            if v != versions[0]:
                raise ServerError(f"rollout.servers: {client.url} runs vLLM {v}, {self.clients[0].url} runs "
                                  f"{versions[0]}; expected one version on every server")  # fmt: skip
        return versions[0]

    @property
    def urls(self) -> list[str]:
        return [c.url for c in getattr(self, "clients", [])]

    def record(self) -> list[dict]:
        """The manifest's record of the servers: URL, vLLM version, started by grpolab or not."""
        here = {s.url for s in self.local}
        return [{"url": u, "vllm": self.version, "started_here": u in here} for u in self.urls]

    def _left_rotation(self, server: int) -> str:
        """A server out of rotation (ServerPool.on_out): one started here is stopped (a hung one would hold its cores)
        and its log kept; the words the warning adds."""
        url = self.clients[server].url
        for local in self.local:
            if local.url == url:
                threading.Thread(target=local.close, daemon=True).start()
                return f"; stopped, its log kept as {local.log_path.name} in the run directory"
        return ""

    def fault_metrics(self) -> dict[str, float]:
        """servers/out_of_rotation (servers lost so far by any trainer rank) and servers/retried_requests (requests
        sent again to another server so far, summed over the ranks), since the engine started. A collective: every
        rank calls it at the same point of its step."""
        every = self.ranks.gather((sorted(self.pool.out), self.pool.retried))
        return {
            "servers/out_of_rotation": float(len({server for out, _ in every for server in out})),
            "servers/retried_requests": float(sum(retried for _, retried in every)),
        }

    def close(self) -> None:
        out = self.pool.out if hasattr(self, "pool") else {}  # a failed start may close before the pool exists
        if self.adapters is not None:
            self.adapters.close([i for i in range(len(self.clients)) if i not in out])
        for i, sender in enumerate(self.senders):
            sender.close(tell_server=i not in out)
        self.senders = []
        if hasattr(self, "_jobs"):
            self._jobs.shutdown(wait=False, cancel_futures=True)  # a request in flight ends within its bound
        self._release()

    # ------------------------------------------------------------------------------------------ weights

    def sync_weights(self, policy: torch.nn.Module, wait: bool = True, version: int | None = None) -> None:
        """The policy's weights (LoRA merged, in the engine's dtype) into every server in rotation at once, as the next
        weight version (``version``: this one, so that a resumed run's versions continue the recorded ones); each
        server's /weight_info must then report it. A server out of rotation is skipped; one in rotation that fails is
        a ServerFault, never skipped (it would serve its older weights). Generations in flight are kept across it
        and go on with the new weights (``paused``); ``wait`` changes nothing: the sync has landed when this returns.
        With adapters (module docstring) the version is a new adapter on each server and in-flight requests keep theirs.
        ``last_sync``: bytes sent over all servers, the wall seconds, and per server ``server/<i>/s`` and
        ``server/<i>/bytes``; {} after a failed sync."""
        self.last_sync = {}
        self._versions = self._versions + 1 if version is None else int(version)
        try:
            self._sync(policy, str(self._versions))
        except ServerError as e:
            raise ServerFault(f"{e} (in the weight sync of version {self._versions}; a server in rotation that "
                              "misses a sync would serve older weights)") from None  # fmt: skip

    def _sync(self, policy: torch.nn.Module, version: str) -> None:
        """Rank 0 sends (another rank joins an FSDP2 policy's gathers, which sending takes); then every rank learns
        of a failure on rank 0 (the same ServerError raised on each), so all stop at the same step. First, every
        rank's lost servers are out on every rank (``_share_lost``)."""
        self._share_lost()
        error = None
        try:
            if self.ranks.rank == 0:
                self._send(policy, version)
            else:
                join_gathers(policy)
        except (ServerError, ServerFault) as e:
            error = e
        first = self.ranks.first_error(str(error) if error is not None else None)  # a collective: no rank runs ahead
        if error is not None:
            raise error
        if first is not None:
            raise ServerError(first)
        self.syncs_done += 1

    def _share_lost(self) -> None:
        """A server any rank lost leaves the rotation of every rank (a collective): rank 0 then syncs none that
        another rank lost, and no rank samples on it again."""
        if self.ranks.size == 1:
            return
        for rank, out in enumerate(self.ranks.gather(dict(self.pool.out))):
            for server, cause in out.items():
                if rank != self.ranks.rank:
                    self.pool.take_out(server, f"lost by trainer rank {rank}: {cause}")

    def _send(self, policy: torch.nn.Module, version: str) -> None:
        """Rank 0's part of a sync: the merged model, or the adapter (the base first, once)."""
        if self.adapters is None:
            return self._send_weights(policy_tensors(policy, self.dtype), version)
        if not self.adapters.loaded:  # the first sync: the base model W, once, through the weight transfer
            self._send_weights(policy_tensors(policy, self.dtype, merge=False), version)
        self.last_sync = self.adapters.load(policy, adapter_tensors(policy), int(version), self.pool.live)

    def _send_weights(self, tensors: dict[str, torch.Tensor], version: str) -> None:
        """`tensors` into every server in rotation through the weight transfer, as `version`, each checked."""
        began = time.perf_counter()
        live = self.pool.live
        with paused([self.clients[i] for i in live]), ThreadPoolExecutor(len(live)) as pool:
            sent = list(pool.map(lambda i: self.senders[i].send(tensors, version), live))
            for i in live:
                served = (self.clients[i].get("/weight_info") or {}).get("weight_version")
                if served != version:
                    raise ServerError(f"vLLM server {self.clients[i].url}: serves weight version {served} after the "
                                      f"sync of version {version}")  # fmt: skip
        self.last_sync = {"bytes": sum(s["bytes"] for s in sent), "total_s": time.perf_counter() - began}
        for i, s in zip(live, sent):
            self.last_sync.update({f"server/{i}/s": s["s"], f"server/{i}/bytes": s["bytes"]})

    @property
    def weight_version(self) -> str:
        """The version of the newest sync ("1" = the policy's weights at the start)."""
        return str(self._versions)

    # ------------------------------------------------------------------------------------------ sampling

    def _post_all(self, bodies: list[dict], servers: list[int], failover: bool = True) -> list[dict]:
        """Each body to its server, at most MAX_CONCURRENT open at once; replies in the order of `bodies`. failover: a
        request whose server is lost goes to another in rotation (ServerPool.post), and `servers` is updated to name
        the server that answered each."""

        def one(i: int) -> dict:
            if not failover:
                return self.clients[servers[i]].post(GENERATE, bodies[i])
            reply, servers[i] = self.pool.post(servers[i], GENERATE, bodies[i])
            return reply

        if not bodies:
            return []
        with ThreadPoolExecutor(min(MAX_CONCURRENT, len(bodies))) as pool:
            return list(pool.map(one, range(len(bodies))))

    def submit(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None):
        """Send a generation (one request per prompt, spread over the servers) from background threads and return
        at once; ``finish`` collects it. Weight syncs meanwhile do not wait for it (module docstring)."""
        base = self.pending(prompts, params, seeds)
        pending = ServerPending(**vars(base), version_at_send=self._versions, syncs_at_send=self.syncs_done)
        sampling = {
            "n": pending.group_size,
            "temperature": 0.0 if params.greedy else float(params.temperature),
            "top_p": 1.0 if params.greedy else float(params.top_p),
            "top_k": 0 if params.greedy else int(params.top_k),
            "max_tokens": int(params.max_new_tokens),
            "logprobs": 0 if pending.want_logp else None,
            "stop_token_ids": list(self.stop_ids),
        }
        seeds = [None] * len(prompts) if seeds is None else [int(s) for s in seeds]
        model = self._served_model(pending.version_at_send)  # with adapters: the version's, for all its completions
        bodies = [generate_body(p, {**sampling, "seed": s}, model) for p, s in zip(pending.prompts, seeds)]
        servers = self.pool.assign(len(prompts), first=self.ranks.rank)
        if self.adapters is not None:
            self.adapters.acquire(pending.version_at_send)  # released by _collect, before its result is known
        pending.future = self._jobs.submit(self._collect, pending, bodies, servers)
        self._in_flight.add(pending.future)
        pending.future.add_done_callback(self._in_flight.discard)
        return pending

    def _served_model(self, version: int) -> str | None:
        """The model a request of weight version `version` names: its adapter with adapters, else the served one."""
        return self.adapters.name(version) if self.adapters is not None else None

    def _collect(self, pending: ServerPending, bodies: list[dict], servers: list[int]) -> dict:
        """The replies of a generation's requests (in a background thread): one list of completions per prompt."""
        try:
            return self._collect_groups(pending, bodies, servers)
        finally:
            if self.adapters is not None:
                self.adapters.release(pending.version_at_send)

    def _collect_groups(self, pending: ServerPending, bodies: list[dict], servers: list[int]) -> dict:
        """_collect's work: each reply's completions, the untruncated log-probabilities where sampling truncated."""
        groups = [self._choices(r, pending) for r in self._post_all(bodies, servers)]
        if pending.want_logp and pending.truncating:  # the trainer's untruncated ones: a scoring pass where sampled
            self._add_untruncated(pending.prompts, groups, servers, self._served_model(pending.version_at_send))
            if self.adapters is None and self.syncs_done != pending.syncs_at_send:
                raise ServerError(f"{self.name}: a weight sync fell between a generation and its scoring pass (the "
                                  "untruncated log-probabilities under top-k / top-p); expected none: rollout.top_k 0 "
                                  "and rollout.top_p 1 with syncs in flight")  # fmt: skip
        return {"groups": groups}

    def finish(self, pending: ServerPending) -> Rollout:
        """The rollout of a submitted generation (waiting for it; every request bounded by call_timeout): each row's
        weight version(s) and each token's policy version (``Rollout.token_versions``)."""
        if pending.reply is None:
            pending.reply = pending.future.result()
        rollout = self._rollout(pending)
        rows = [c for group in pending.reply["groups"] for c in group]
        lengths = rollout.completion_mask.sum(-1).tolist()
        labels = [c["labels"][:n] for c, n in zip(rows, lengths)]
        rollout.weight_versions = [",".join(dict.fromkeys(row)) or c["weight_version"] for row, c in zip(labels, rows)]
        versions = [[policy_version(v) for v in row] for row in labels]
        rollout.token_versions = right_pad(versions, -1, torch.long)[:, : rollout.completion_ids.shape[1]]
        return rollout

    def wait_all(self) -> None:
        """Wait for every generation in flight (its errors are raised by its ``finish``)."""
        for future in list(self._in_flight):
            future.exception()

    def _choices(self, reply: dict, pending: ServerPending) -> list[dict]:
        """One dict per completion of a reply (token_ids, logprobs, finish_reason, weight_version, labels: one
        weight-version label per token), by index."""
        out, want_logp, model = [], pending.want_logp, self._served_model(pending.version_at_send)
        if model is not None and reply.get("model", model) != model:
            raise ServerError(f"{self.name}: a request for adapter {model} was answered by {reply.get('model')}")
        for c in sorted(reply["choices"], key=lambda c: c["index"]):
            tokens = list(c.get("token_ids") or [])
            if c.get("finish_reason") == "abort":
                raise ServerError(f"{self.name}: a completion came back aborted after {len(tokens)} tokens (expected "
                                  "none: grpolab pauses with requests kept; did another client abort it?)")  # fmt: skip
            content = ((c.get("logprobs") or {}).get("content") or []) if want_logp else []
            if want_logp and [e["token_id"] for e in content] != tokens:
                raise ServerError(f"{self.name}: the logprobs returned do not follow the sampled tokens")
            logp = [float(e["logprob"]) for e in content] if want_logp else [math.nan] * len(tokens)
            # with adapters the request's version sampled every token; else vLLM's spans say which did
            labels = (
                [str(pending.version_at_send)] * len(tokens)
                if model
                else token_labels(c.get("weight_versions"), len(tokens))
            )
            if labels is None:  # no spans: only a generation that no sync overlapped has a known version
                if self.syncs_done != pending.syncs_at_send:
                    raise ServerError(f"{self.name}: a completion sampled while the weights changed came back "
                                      "without weight-version spans")  # fmt: skip
                labels = [str(pending.version_at_send)] * len(tokens)
            out.append({"token_ids": tokens, "logprobs": logp, "finish_reason": c.get("finish_reason"),
                        "weight_version": str(pending.version_at_send), "labels": labels})  # fmt: skip
        return out

    def _add_untruncated(self, prompts: list[list[int]], groups: list[list[dict]], servers: list[int],
                         model: str | None) -> None:  # fmt: skip
        seqs, where = [], []
        for p, group, server in zip(prompts, groups, servers):
            for c in group:
                seqs.append(p + c["token_ids"])
                where.append(server)
        scored = iter(self._score(seqs, where, model=model))
        for group in groups:
            for c in group:
                row = next(scored)
                c["logprobs_untruncated"] = row[len(row) - len(c["token_ids"]) :]

    def _score(self, sequences: list[list[int]], servers: list[int], failover: bool = True,
               model: str | None = None) -> list[list[float]]:  # fmt: skip
        params = {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        replies = self._post_all([generate_body(s, params, model) for s in sequences], servers, failover)
        out = []
        for seq, reply in zip(sequences, replies):
            entries = reply["prompt_logprobs"]  # position 0 has none
            out.append([float(entries[t][str(seq[t])]["logprob"]) for t in range(1, len(seq))])
        return out

    def score(self, sequences: list[list[int]], server: int | None = None) -> list[torch.Tensor]:
        """Teacher-forced log softmax(logits)(token) of every token after the first (temperature 1), on server
        `server` (None: spread over the servers in rotation; a server named is asked whether in rotation or not, with
        no retry elsewhere)."""
        seqs = [list(map(int, s)) for s in sequences]
        where = self.pool.assign(len(seqs), first=self.ranks.rank) if server is None else [server] * len(seqs)
        scored = self._score(seqs, where, failover=server is None, model=self._served_model(self._versions))
        return [torch.tensor(r, dtype=torch.float32) for r in scored]
