"""vLLM servers for ``rollout.engine: vllm_server`` (docs/vllm.md, "vLLM servers"): the HTTP client, the servers
grpolab starts itself, and the checks a server must pass before training.

``ServerClient`` speaks JSON to one OpenAI-compatible ``vllm serve`` with every wait bounded and every error naming
the server. ``ServerPool`` holds the run's servers and which of them are in rotation: a request whose server died or
hung is retried on another, that server out for the rest of the run; none left is a ``ServerFault``.
``LocalServer`` starts ``vllm serve`` from vLLM's environment on this host (its log kept, then copied into the run
directory). ``check_server`` refuses, in one line naming the server, what would fail or mislead later: an
unreachable URL, a server without the RL API (``VLLM_SERVER_DEV_MODE=1``) or the token-in API
(``--enable-scale-out``), another tokenizer, a logprobs mode other than the sampled distribution's, no weight-transfer
backend, a ``max_model_len`` shorter than the run needs, or a model whose output layer is tied to its embeddings.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable

from ..config.checks import DEVICE_FORM
from ..errors import GrpolabError
from .workers.process import LOG_TAIL_LINES, EngineDied, EngineUnavailable

LOGPROBS_MODE = "processed_logprobs"
"""The sampled distribution's log-probabilities (logits / T after top-k / top-p), as the offline worker's."""
PROBE_TEXT = "grpolab probe: 12 + 30 = 42, ÿ ☃ <|im_start|>assistant"
"""Tokenised by the server and by grpolab: the ids must match (specials, digits and bytes included)."""
HEALTH_BOUND_S = 5.0
"""The bound on the /health probe that tells a server that answered an error apart from one that died."""
log = logging.getLogger("grpolab")


class ServerError(GrpolabError):
    """A server answered an error (``status``: its HTTP status), or not at all within the bound (None); the message
    names it."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ServerClient:
    """JSON over HTTP to one vLLM server; ``timeout``: the bound in seconds on each request."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url.rstrip("/"), timeout

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """The decoded JSON reply (None for an empty one; the text of one that is not JSON, as vLLM's LoRA routes
        answer); ServerError naming the server, the route and the cause."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        bound = self.timeout if timeout is None else timeout
        try:
            with urllib.request.urlopen(req, timeout=bound) as reply:
                raw, kind = reply.read(), reply.headers.get_content_type()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500].replace("\n", " ")
            raise ServerError(f"vLLM server {self.url}: {method} {path} answered {e.code}: {detail}", e.code) from None
        except (TimeoutError, socket.timeout):
            raise ServerError(f"vLLM server {self.url}: {method} {path} gave no answer within {bound:g} s") from None
        except (urllib.error.URLError, OSError) as e:
            cause = getattr(e, "reason", e)
            raise ServerError(f"vLLM server {self.url}: {method} {path} failed ({cause})") from None
        if not raw.strip():
            return None
        return json.loads(raw) if kind == "application/json" else raw.decode(errors="replace")

    def get(self, path: str, timeout: float | None = None) -> Any:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body: Any = None, timeout: float | None = None) -> Any:
        return self.request("POST", path, body if body is not None else {}, timeout)


def status_of(error: ServerError) -> int | None:
    """The HTTP status a ServerError carries (None: no answer)."""
    return getattr(error, "status", None)


class ServerFault(EngineDied):
    """What the run cannot sample past: no server left in rotation, or a server in rotation that failed a weight
    sync (left on older weights, it would serve them silently). The trainer stops with a checkpoint of the last
    completed step (grpolab.training.sampler_faults)."""


class ServerPool:
    """The run's servers and which of them are in rotation. A request whose server gives no answer (it died, or hung
    past the bound), or answers an error while its /health no longer answers, is retried on the next server in
    rotation, the same request (prompt, seed, parameters); the lost server leaves the rotation for the rest of the
    run, with one warning: it is asked nothing again, neither samples nor weights. An error from a server that is
    still up (a refused request) is the request's own and is raised. ``on_out(i)``: called once when server i
    leaves; it returns more words for the warning."""

    def __init__(self, clients: list[ServerClient], on_out: Callable[[int], str] = lambda i: ""):
        self.clients, self.on_out = clients, on_out
        self.out: dict[int, str] = {}  # server index -> why it left the rotation
        self.retried = 0  # requests sent again to another server
        self._lock = threading.Lock()

    @property
    def live(self) -> list[int]:
        """The indices of the servers in rotation; ServerFault naming each lost one's cause when none is left."""
        live = [i for i in range(len(self.clients)) if i not in self.out]
        if not live:
            raise ServerFault("no vLLM server left in rotation: " + "; ".join(self.out.values()))
        return live

    def assign(self, count: int, first: int = 0) -> list[int]:
        """The server of each of `count` requests: request i to the ((first + i) mod n)-th of the n servers in rotation
        (first: the trainer's rank, so that ranks with one prompt each do not all ask the first server)."""
        live = self.live
        return [live[(first + i) % len(live)] for i in range(count)]

    def post(self, server: int, path: str, body: dict) -> tuple[Any, int]:
        """POST `body` to `server` (the next one in rotation when it has left), again to the next while the one asked
        is lost: (the reply, the index of the server that answered)."""
        while True:
            if server in self.out:
                server = self.next_live(server)
            try:
                return self.clients[server].post(path, body), server
            except ServerError as e:
                if not self.lost(server, e):
                    raise
                self.take_out(server, str(e))
            server = self.next_live(server)  # ServerFault when none is left
            with self._lock:
                self.retried += 1

    def next_live(self, server: int) -> int:
        """The first server in rotation after `server`, in the order of the list (wrapping round)."""
        live = self.live
        return next((i for i in live if i > server), live[0])

    def lost(self, server: int, error: ServerError) -> bool:
        """Whether `error` means the server is gone: no answer at all, or a 5xx while /health no longer answers."""
        status = status_of(error)
        if status is None:
            return True
        if status < 500:
            return False
        try:
            self.clients[server].get("/health", timeout=min(self.clients[server].timeout, HEALTH_BOUND_S))
        except ServerError:
            return True
        return False

    def take_out(self, server: int, cause: str) -> None:
        """Server `server` out of rotation for the rest of the run (once; a warning while others are left)."""
        with self._lock:
            if server in self.out:
                return
            self.out[server] = cause
            left = len(self.clients) - len(self.out)
        more, url = self.on_out(server), self.clients[server].url
        if left:
            log.warning("vLLM server %s is out of rotation for the rest of the run (%d of %d left%s): %s", url, left,
                        len(self.clients), more, cause.removeprefix(f"vLLM server {url}: "))  # fmt: skip


# ---------------------------------------------------------------------------------------------- servers started here


def device_env(entry: str) -> dict[str, str]:
    """The environment that puts one server started here on its devices: ``cpu:LIST`` binds its OpenMP threads to
    those cores (vLLM's VLLM_CPU_OMP_THREADS_BIND), ``cuda:IDS`` shows it only those GPUs (CUDA_VISIBLE_DEVICES).

    >>> device_env("cpu:0-3"), device_env("cuda:1,2")
    ({'VLLM_CPU_OMP_THREADS_BIND': '0-3'}, {'CUDA_VISIBLE_DEVICES': '1,2'})
    """
    found = DEVICE_FORM.match(entry)
    if not found:
        raise ValueError(f"{entry!r}: expected cpu:<cores> (e.g. cpu:0-3) or cuda:<GPU ids> (e.g. cuda:0 or cuda:0,1)")
    kind, ids = found.group(1), found.group(2)
    return {"VLLM_CPU_OMP_THREADS_BIND": ids} if kind == "cpu" else {"CUDA_VISIBLE_DEVICES": ids}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_command(python: Path, model_dir: Path, port: int, dtype: str, max_model_len: int, seed: int, backend: str,
                  extra: list[str] = ()):  # fmt: skip
    """``vllm serve`` with what grpolab needs: token ids in and out (``--enable-scale-out``), the sampled
    distribution's logprobs, no sampling default from the model's generation_config, a weight-transfer backend.
    It runs the API server's module (what ``vllm serve`` runs): the vllm-cpu distribution's ``vllm`` command looks
    for a distribution named vllm and fails."""
    return [
        str(python), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--seed", str(seed), "--enforce-eager", "--enable-prefix-caching", "--enable-scale-out",
        "--logprobs-mode", LOGPROBS_MODE, "--generation-config", "vllm",
        "--weight-transfer-config", json.dumps({"backend": backend}), *extra,
    ]  # fmt: skip


class LocalServer:
    """A ``vllm serve`` process started here in a session of its own, its output in ``log_path``; ``close`` stops
    the session (the engine core with it)."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str], url: str):
        self.url, self.log_path = url, log_path
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        child_env.update(env)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=log_path.parent,
                start_new_session=True,
                preexec_fn=stop_with_parent,
            )
        self._finalizer = weakref.finalize(self, stop_session, self.proc)

    def log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float) -> None:
        """Until GET /health answers 200; EngineUnavailable naming the server and its log when the process exits
        or the bound passes (then it is stopped)."""
        client, deadline = ServerClient(self.url, 5.0), time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise EngineUnavailable(
                    f"vLLM server {self.url} exited with code {self.proc.returncode} while starting; the last lines "
                    f"of its log ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                client.get("/health")
                return
            except ServerError:
                pass
            if time.monotonic() >= deadline:
                self.close()
                raise EngineUnavailable(
                    f"vLLM server {self.url} was not ready within {timeout:g} s (rollout.worker_start_timeout_s) and "
                    f"was stopped; the last lines of its log ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def close(self) -> None:
        stop_session(self.proc)

    def keep_log(self, log_dir: Path | None) -> None:
        """Copy the log into ``log_dir`` (the run directory) when it exists."""
        if log_dir is not None and Path(log_dir).is_dir() and self.log_path.is_file():
            shutil.copyfile(self.log_path, Path(log_dir) / self.log_path.name)


def stop_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the trainer dies, however it dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: close() and the finalizer still stop it


def stop_session(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the server's session (vLLM shuts its engine core down), SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            proc.send_signal(sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the engine core may outlive the API server by a moment: the session goes whole
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------- checks before training


def check_server(
    client: ServerClient, tokenizer, max_model_len: int, backend: str, lead: bool = True
) -> dict[str, Any]:
    """What the run needs of one server, each refusal one line naming it and the fix; returns {"version",
    "world_size", "config": GET /server_info's vllm_config}. ``lead``: also the check that makes the server hash its
    whole model (check_untied; under torchrun rank 0's alone)."""
    where = f"rollout.servers: {client.url}"
    try:
        client.get("/health", timeout=min(client.timeout, 10.0))
    except ServerError as e:
        raise ServerError(f"{where} is unreachable ({cause_of(e)}); expected a running `vllm serve` (docs/vllm.md)")
    version = (client.get("/version") or {}).get("version", "")
    try:
        client.get("/weight_info")
    except ServerError as e:
        if status_of(e) != 404:
            raise
        raise ServerError(f"{where} has no RL API (GET /weight_info: 404); start it with VLLM_SERVER_DEV_MODE=1")
    config = (client.get("/server_info?config_format=json") or {}).get("vllm_config") or {}
    check_config(where, config, max_model_len, backend)
    check_tokenizer(where, client, tokenizer)
    if lead:
        check_untied(where, client)
    try:
        client.post("/inference/v1/generate", generate_body([tokenizer.eos_token_id or 0], {"max_tokens": 1}))
    except ServerError as e:
        if status_of(e) not in (403, 404):
            raise
        raise ServerError(f"{where} does not take token ids (POST /inference/v1/generate: {status_of(e)}); start it "
                          "with --enable-scale-out")  # fmt: skip
    world = (client.get("/get_world_size?include_dp=true") or {}).get("world_size", 1)
    return {"version": version, "world_size": int(world), "config": config}


def cause_of(error: ServerError) -> str:
    text = str(error)
    return text[text.rfind("(") + 1 : -1] if text.endswith(")") else text


def check_config(where: str, config: dict, max_model_len: int, backend: str) -> None:
    """The served engine's settings (GET /server_info): logprobs mode, weight-transfer backend, max_model_len."""
    model = config.get("model_config") or {}
    mode = model.get("logprobs_mode")
    if mode != LOGPROBS_MODE:
        raise ServerError(f"{where} returns {mode} log-probabilities; start it with --logprobs-mode {LOGPROBS_MODE} "
                          "(the sampled distribution's, which the importance correction needs)")  # fmt: skip
    served = (config.get("weight_transfer_config") or {}).get("backend")
    if served != backend:
        raise ServerError(f"{where} has weight-transfer backend {served}; expected {backend}: start it with "
                          f"--weight-transfer-config '{{\"backend\": \"{backend}\"}}'")  # fmt: skip
    if int(model.get("max_model_len") or 0) < max_model_len:
        raise ServerError(f"{where} holds {model.get('max_model_len')} tokens per sequence; the run needs "
                          f"{max_model_len} (longest prompt + max_new_tokens + 1): start it with --max-model-len "
                          f"{max_model_len} or more")  # fmt: skip


def check_tokenizer(where: str, client: ServerClient, tokenizer) -> None:
    """The server's tokenizer gives grpolab's ids for PROBE_TEXT (a server without one: its vocabulary size)."""
    want = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    try:
        got = (client.post("/tokenize", {"prompt": PROBE_TEXT, "add_special_tokens": False}) or {}).get("tokens")
    except ServerError as e:
        if status_of(e) is None or status_of(e) >= 500:
            raise
        got = None  # a --skip-tokenizer-init server: nothing to compare here (the first weight sync checks shapes)
    if got is not None and list(got) != list(want):
        raise ServerError(f"{where} serves another tokenizer (it reads {PROBE_TEXT!r} as {len(got)} tokens "
                          f"{got[:6]}..., the run's as {len(want)} tokens {want[:6]}...); serve the run's model")  # fmt: skip


def check_untied(where: str, client: ServerClient) -> None:
    """The served model holds an lm_head of its own. vLLM 0.32 reloads weights in place and leaves a tied lm_head with
    its old values (docs/vllm.md), so a server of a tied model (SmolLM2, Qwen2.5-0.5B, Qwen3-0.6B) would sample with a
    stale output layer after every sync. Read from the RL API's per-parameter checksums (POST /weight_checker), whose
    names are the served model's parameters, a tied lm_head sharing the embedding's and so not listed; a server
    without that route cannot tell and passes."""
    try:
        names = list(((client.post("/weight_checker", {"action": "checksum"}) or {}).get("checksums") or {}))
    except ServerError as e:
        if status_of(e) in (404, 405):
            return
        raise
    if tied_embeddings(names):
        raise ServerError(f"{where} serves a model whose lm_head is tied to its embeddings; a weight sync would leave "
                          "that output layer stale in vLLM 0.32: serve the untied copy that `python "
                          "examples/launch/serving_model.py MODEL DIR` writes (docs/vllm.md)")  # fmt: skip


def tied_embeddings(names: list[str]) -> bool:
    """Whether a served model's parameter names (vLLM's, e.g. ``dp0:pp0:pcp0:tp0:model.embed_tokens.weight``; with
    --enable-lora ``...embed_tokens.base_layer.weight``) show an input embedding and no output layer of its own.

    >>> tied_embeddings(["tp0:model.embed_tokens.base_layer.weight", "tp0:model.norm.weight"])
    True
    >>> tied_embeddings(["tp0:model.embed_tokens.weight", "tp0:lm_head.qweight"])
    False
    """
    plain = [n.replace(".base_layer.", ".") for n in names]
    embedding = any(n.endswith("embed_tokens.weight") for n in plain)
    return embedding and not any(re.search(r"(^|[.:])lm_head\.", n) for n in plain)


def token_labels(spans: list[dict] | None, count: int) -> list[str] | None:
    """vLLM's weight-version spans of a completion ([{version, start, end}], output-token indices [start, end)) as one
    label per token; None when the server reported none. ServerError when they do not cover the tokens in order."""
    if not spans:
        return None if count else []
    labels: list[str] = []
    for span in spans:
        if int(span["start"]) != len(labels) or int(span["end"]) < int(span["start"]):
            raise ServerError(f"weight-version spans {spans} do not cover the {count} sampled tokens in order")
        labels += [str(span["version"])] * (int(span["end"]) - int(span["start"]))
    if len(labels) != count:
        raise ServerError(f"weight-version spans {spans} do not cover the {count} sampled tokens in order")
    return labels


def policy_version(label: str) -> int:
    """A server's weight-version label as grpolab sets it (str(updates + 1)) -> the policy version (updates)."""
    try:
        return int(label) - 1
    except ValueError:
        raise ServerError(f"weight version {label!r}: expected the number grpolab set (was the server synced by "
                          "another trainer?)") from None  # fmt: skip


def generate_body(prompt: list[int], params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """A token-in request to POST /inference/v1/generate: token ids out, no detokenising; `model`: a LoRA adapter the
    server holds (None: its model)."""
    sampling = {"detokenize": False, "skip_special_tokens": False, **params}
    body = {"token_ids": list(prompt), "sampling_params": sampling, "output_mode": "tokens"}
    return body if model is None else {**body, "model": model}
