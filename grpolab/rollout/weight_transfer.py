"""The trainer's side of vLLM's weight-transfer API, for ``rollout.engine: vllm_server`` (docs/vllm.md).

A sync drives one server's RL routes in vLLM's order -- ``/start_weight_update``, ``/update_weights`` (answered once
every tensor has arrived), ``/finish_weight_update`` with the new weight version -- while the tensors travel on a
process group of this trainer (rank 0) and the server's workers. ``GlooSender`` is the CPU backend: torch.distributed
gloo over TCP, received inside the server by grpolab's vLLM plugin (vllm_plugin/, backend ``gloo``, registered with
vLLM's ``WeightTransferEngineFactory``). Its group is built as vLLM's ``stateless_init_torch_distributed_process_group``
builds the worker's (a TCPStore held here, a PrefixStore named by the rendezvous address, a gloo backend with its
sequence number set by rank 0), so the two join; every collective is bounded by the sender's timeout.

``paused`` wraps a sync so that requests in flight survive it (docs/vllm.md, "In-flight updates"): every server is
paused with vLLM's ``/pause?mode=keep`` (requests frozen between engine steps, kept; ``abort`` would end them and
``wait`` would let them finish first, so no completion could span the sync), the weights move, then
``/reset_prefix_cache?reset_running_requests=true`` drops every KV block computed with the old weights (the frozen
requests are preempted and recomputed on the new ones, as vLLM's preemption does) and ``/resume`` lets them go on.
A token sampled after the sync is therefore drawn from the new weights on a prefix recomputed with them: q(o_t) =
pi_version(t)(o_t | o_<t), the version vLLM reports in the completion's per-token spans.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import torch

from .servers import ServerClient, ServerError


def tcp_uri(host: str, port: int) -> str:
    """The rendezvous address as vLLM writes it (vllm.utils.network_utils.get_tcp_uri): the group's store prefix."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def gloo_group(store, rank: int, world_size: int, timeout: timedelta):
    """A gloo process group outside torch.distributed's global state, as vLLM's init_gloo_process_group makes it."""
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed.distributed_c10d import ProcessGroupGloo

    pg = ProcessGroup(store, rank, world_size)
    backend = ProcessGroupGloo(store, rank, world_size, timeout=timeout)
    pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    backend._set_sequence_number_for_group()
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
    return pg


class GlooSender:
    """One server's gloo group, this process rank 0. ``address``: where the server reaches this host (its workers
    connect to the TCPStore opened here); ``world_size``: the server's workers (GET /get_world_size)."""

    backend = "gloo"

    def __init__(self, client: ServerClient, address: str, world_size: int, timeout: float):
        from torch.distributed import PrefixStore, TCPStore

        self.client, self.timeout = client, timeout
        bound = timedelta(seconds=timeout)
        world = 1 + world_size
        self.store = TCPStore(address, 0, world, True, bound, wait_for_workers=False)
        init_info = {
            "master_address": address,
            "master_port": self.store.port,
            "world_size": world,
            "rank_offset": 1,
            "timeout_s": timeout,
        }
        prefix = PrefixStore(tcp_uri(address, self.store.port), self.store)
        with ThreadPoolExecutor(1) as pool:  # the server joins inside its reply: both sides meet in the group
            joined = pool.submit(client.post, "/init_weight_transfer_engine", {"init_info": init_info})
            try:
                self.group = gloo_group(prefix, 0, world, bound)
            except RuntimeError as e:
                cause = joined.exception(timeout) if joined.done() else None
                raise ServerError(
                    f"vLLM server {client.url}: the weight-transfer group did not form within {timeout:g} s "
                    f"({cause or e}); the server must reach this host at {address} (rollout.weight_transfer_host)"
                ) from None
            joined.result()

    def send(self, tensors: dict[str, torch.Tensor], version: str) -> dict[str, float]:
        """The tensors into the server's model as weight version `version`: {"s": seconds, "bytes": bytes sent}."""
        began = time.perf_counter()
        info = {
            "names": list(tensors),
            "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
            "shapes": [list(t.shape) for t in tensors.values()],
        }
        self.client.post("/start_weight_update")
        pool = ThreadPoolExecutor(1)
        try:
            received = pool.submit(self.client.post, "/update_weights", {"update_info": info})
            for tensor in tensors.values():
                if received.done():  # refused before the transfer: say why instead of waiting out the group
                    received.result()
                self.group.broadcast(tensor, 0).wait()
            received.result()
        except RuntimeError as e:  # the group's own bound (a server gone mid-transfer)
            raise ServerError(f"vLLM server {self.client.url}: the weight transfer failed ({e})") from None
        finally:
            pool.shutdown(wait=False)  # a server stuck in the group must not hang this process too
        self.client.post("/finish_weight_update", {"weight_version": version})
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        return {"s": time.perf_counter() - began, "bytes": float(size)}

    def close(self, tell_server: bool = True) -> None:
        """Leave the group; ``tell_server``: ask the server to leave it too (not a server out of rotation, which may
        hang)."""
        try:
            if tell_server:
                self.client.post("/shutdown_weight_transfer_engine", timeout=min(self.timeout, 30.0))
        except ServerError:
            pass  # the server may be gone already
        group, self.group = getattr(self, "group", None), None
        if group is not None:
            group.shutdown()


@contextmanager
def paused(clients: list[ServerClient]) -> Iterator[None]:
    """Every server paused (mode keep: requests in flight kept) for the body, then its stale KV dropped and resumed
    (module docstring). The servers are resumed whatever happens in the body; a failed resume is a ServerError."""
    with ThreadPoolExecutor(max(1, len(clients))) as pool:
        try:
            list(pool.map(lambda c: c.post("/pause?mode=keep"), clients))
            yield
            reset = list(pool.map(lambda c: c.post("/reset_prefix_cache?reset_running_requests=true"), clients))
            for client, reply in zip(clients, reset):
                if not (reply or {}).get("success"):
                    raise ServerError(f"vLLM server {client.url}: kept its KV cache of the old weights after the sync "
                                      f"(POST /reset_prefix_cache answered {reply})")  # fmt: skip
        finally:
            resumed = list(pool.map(lambda c: try_post(c, "/resume"), clients))
    failed = [e for e in resumed if e is not None]
    if failed:
        raise failed[0]


def try_post(client: ServerClient, path: str) -> ServerError | None:
    """POST `path`; the ServerError instead of raising it (so every server is asked)."""
    try:
        client.post(path)
    except ServerError as e:
        return e
    return None


def reach_address(url: str) -> str:
    """This host's address on the route to the server of `url` (where the server's workers can reach it)."""
    parts = urllib.parse.urlsplit(url)
    with socket.socket(socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((parts.hostname or "127.0.0.1", parts.port or 80))  # UDP: no packet is sent
        return s.getsockname()[0]
