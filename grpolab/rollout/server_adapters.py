"""LoRA runs on vLLM servers that sync only the adapter (``rollout.lora_sync: adapter``; docs/vllm.md, "LoRA").

The servers hold the base model W (sent once, by the weight transfer, at the first sync) and each weight version's
adapter (A, B of every adapted module) as a LoRA adapter of its own, loaded by vLLM's runtime adapter loading
(``POST /v1/load_lora_adapter``, servers run with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``) from
the peft files grpolab writes for it (``<adapter_dir>/v<version>``). A request names the version it samples with
(``"model": "grpolab-<engine>-v<version>"``, the engine's token keeping two runs, or a run and its resume, on one
server apart), so a completion is sampled wholly by the version it was sent with: syncs need no
pause, in-flight requests go on with their own adapter, and each token's version is its request's. A version no
generation in flight uses any more is unloaded and its files removed; closing the engine unloads the rest.

Why a new name per version: vLLM refuses to load a name twice, reloads an in-place adapter from disk on every step,
and keys the prefix cache by name and path (vllm/entrypoints/openai/models/serving.py, vllm/lora/worker_manager.py).
A sync moves the adapter's bytes (2 r (in + out) per adapted module) instead of the model's.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from ..errors import ConfigError
from ..models.lora import ADAPTER, ADAPTER_WEIGHTS, is_lora
from .servers import ServerClient, ServerError, log, status_of

SERVED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM 0.32's ``--max-lora-rank`` takes (vllm/config/lora.py)."""


def lora_rank(policy) -> int:
    """The LoRA rank of a peft policy; 0 for a plain one."""
    return int(policy.peft_config[ADAPTER].r) if is_lora(policy) else 0


def served_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM takes that holds `rank`."""
    for r in SERVED_RANKS:
        if r >= rank:
            return r
    raise ConfigError(f"model.lora.rank: vLLM serves LoRA ranks up to {SERVED_RANKS[-1]}, got {rank}; use "
                      "rollout.lora_sync: merged")  # fmt: skip


def lora_serve_flags(rank: int, slots: int) -> list[str]:
    """`vllm serve` flags for servers grpolab starts: adapters of rank `rank`, `slots` of them held at once."""
    return ["--enable-lora", "--max-lora-rank", str(served_rank(rank)), "--max-loras", str(slots),
            "--max-cpu-loras", str(slots)]  # fmt: skip


def adapter_tensors(policy) -> dict[str, torch.Tensor]:
    """The trained adapter by peft's file names (base_model.model....lora_A.weight), on the CPU in float32: an FSDP2
    policy's shards gathered, so every rank must call it (the gathers are collectives)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(policy, adapter_name=ADAPTER, save_embedding_layers=False)
    with torch.no_grad():
        return {
            n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().to("cpu", torch.float32).contiguous()
            for n, t in state.items()
        }


def write_adapter(policy, tensors: dict[str, torch.Tensor], directory: Path) -> int:
    """peft's adapter files (adapter_config.json, adapter_model.safetensors) in `directory`; the weights' bytes."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    policy.peft_config[ADAPTER].save_pretrained(str(directory))
    save_file(tensors, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return (directory / ADAPTER_WEIGHTS).stat().st_size


def check_lora_server(where: str, config: dict, rank: int, slots: int) -> None:
    """A server the adapters go to serves LoRA adapters of the run's rank (GET /server_info's lora_config); a warning
    when it batches fewer adapters than `slots` - 1, the versions that can sample at once (vLLM then runs the
    requests of the others later: slower, not wrong)."""
    lora = config.get("lora_config")
    if not isinstance(lora, dict):
        raise ServerError(f"{where} serves no LoRA adapters; start it with --enable-lora --max-lora-rank "
                          f"{served_rank(rank)} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, or set rollout.lora_sync: "
                          "merged")  # fmt: skip
    if int(lora.get("max_lora_rank") or 0) < rank:
        raise ServerError(f"{where} serves LoRA ranks up to {lora.get('max_lora_rank')}; the run's is {rank}: start "
                          f"it with --max-lora-rank {served_rank(rank)}")  # fmt: skip
    if int(lora.get("max_loras") or 1) < slots - 1:
        log.warning("%s batches %s LoRA adapter(s) at once; up to %d versions sample together here "
                    "(rollout.max_staleness + 1): start it with --max-loras %d", where, lora.get("max_loras"),
                    slots - 1, slots)  # fmt: skip


class AdapterVersions:
    """The adapters on the servers: each sync's written once and loaded on every live server; ``acquire`` /
    ``release`` count the generations in flight that sample with a version, and a version with none that is not the
    newest is unloaded from every server and its files removed. Served names are ``grpolab-<token>-v<version>``,
    the token the name of `directory` (made for this engine), so no two engines' names meet on a server."""

    def __init__(self, clients: list[ServerClient], directory: Path):
        self.clients, self.directory = clients, directory
        self.prefix = f"grpolab-{directory.name.rsplit('-', 1)[-1]}-v"
        self.users: Counter[int] = Counter()
        self.loaded: list[int] = []
        self.lock = threading.Lock()

    def name(self, version: int) -> str:
        """The served name of weight version `version`'s adapter."""
        return f"{self.prefix}{version}"

    def load(self, policy, tensors: dict[str, torch.Tensor], version: int, live: list[int]) -> dict[str, float]:
        """Write version `version`'s adapter and load it on every server in `live` (ServerError naming the server that
        refused); returns last_sync's figures (bytes over all servers, seconds, per server)."""
        began = time.perf_counter()
        path = self.directory / f"v{version}"
        size = write_adapter(policy, tensors, path)
        figures: dict[str, float] = {}
        for i in live:
            t = time.perf_counter()
            self._load_on(self.clients[i], self.name(version), path)
            figures.update({f"server/{i}/s": time.perf_counter() - t, f"server/{i}/bytes": float(size)})
        with self.lock:
            self.loaded.append(version)
        self.unload_unused(live)
        return {"bytes": float(size * len(live)), "total_s": time.perf_counter() - began, **figures}

    def _load_on(self, client: ServerClient, name: str, path: Path) -> None:
        """Adapter `name` from `path` into one server, then checked among its models; ServerError naming the cause."""
        try:
            client.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        except ServerError as e:
            if "No adapter found" in str(e):  # vLLM's LoRAAdapterNotFoundError: the server cannot read the path
                raise ServerError(f"{e} (a server on another host needs rollout.adapter_dir on a filesystem both "
                                  "read)") from None  # fmt: skip
            if status_of(e) in (404, 405):
                raise ServerError(f"vLLM server {client.url} does not load adapters at run time (POST "
                                  "/v1/load_lora_adapter: 404); start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
                                  "and --enable-lora") from None  # fmt: skip
            raise
        served = [m.get("id") for m in (client.get("/v1/models") or {}).get("data", [])]
        if name not in served:
            raise ServerError(f"vLLM server {client.url}: {name} is not among its models {served} after loading it")

    def acquire(self, version: int) -> None:
        """A generation that samples with `version` is in flight."""
        with self.lock:
            self.users[version] += 1

    def release(self, version: int) -> None:
        """A generation that sampled with `version` has ended."""
        with self.lock:
            self.users[version] -= 1
            if self.users[version] <= 0:
                del self.users[version]

    def unload_unused(self, live: list[int]) -> None:
        """Unload (every server in `live`) and delete each version older than the newest that no generation uses."""
        with self.lock:
            unused = [v for v in self.loaded[:-1] if v not in self.users]
            self.loaded = [v for v in self.loaded if v not in unused]
        self._unload(unused, live)

    def _unload(self, versions: list[int], servers: list[int]) -> None:
        for v in versions:
            for i in servers:
                try:
                    self.clients[i].post("/v1/unload_lora_adapter", {"lora_name": self.name(v)})
                except ServerError as e:
                    if status_of(e) != 404:  # already gone (a restarted server): nothing to free
                        raise
            shutil.rmtree(self.directory / f"v{v}", ignore_errors=True)

    def close(self, servers: list[int]) -> None:
        """Every version still loaded unloaded from `servers` (the ones in rotation), as far as they answer."""
        with self.lock:
            versions, self.loaded = self.loaded, []
        try:
            self._unload(versions, servers)
        except ServerError as e:
            log.warning("closing: an adapter could not be unloaded: %s", e)
