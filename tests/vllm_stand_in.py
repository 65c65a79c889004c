"""A stand-in for a ``vllm serve`` server (torch only, on 127.0.0.1): the routes grpolab's vllm_server engine uses,
answered by a transformers model whose weights arrive over the gloo weight-transfer group as grpolab's vLLM plugin
receives them (rank 1 of the trainer's group, one broadcast per announced tensor).

Its knobs make the servers the engine must refuse: no RL API (``rl_api=False``: /weight_info is 404), no token-in
route (``scale_out=False``: 403), another tokenizer (``token_offset``), another logprobs mode or backend, another
vLLM version, a route that hangs (``hang``: seconds /inference/v1/generate sleeps), a tied model (``tied``: the
per-parameter checksums of POST /weight_checker list no lm_head, as vLLM's of a tied model). ``lora_rank``: LoRA
adapters up to that rank loaded at run time from peft files (/v1/load_lora_adapter: the merged copy W + alpha / r B A
of its model, a name loaded twice refused; /v1/unload_lora_adapter; /v1/models), a request naming one (``model``)
sampled by it (``max_loras``: what its /server_info reports); ``adapter_loads`` lists the names loaded. ``port``: where it listens (0:
any free port; a server restarted at the URL of one that was closed). ``requests`` counts the generation requests
it answered; ``applied`` the weight updates it loaded; ``joins`` the weight-transfer groups it joined.

In-flight updates (vLLM's RL API, vllm/entrypoints/rl/online/api_router.py): a generation samples token by token,
each token under the weights and version label of that moment, and reports vLLM's per-token version spans.
``POST /pause?mode=`` ``keep`` freezes requests between tokens (they go on after ``/resume``), ``abort`` ends them at
once (finish_reason ``abort``), ``wait`` waits until they finish; a weight update while requests run unpaused is
refused (409), as grpolab relies on pausing. ``kv_cache``: requests keep a KV cache, computed under the weights of
its tokens' time, reused after a weight change unless ``/reset_prefix_cache?reset_running_requests=true``
recomputes it (vLLM's preemption). ``hold_after`` / ``hold_if``: a request whose sampling params satisfy ``hold_if``
holds after ``hold_after`` tokens of its first completion until the weight version changes (so where a sync falls
inside a completion does not depend on timing); a keep-pause waits until every such request has reached its hold
point; ``hold_s`` bounds every such wait (then the request fails). ``label``: report this version for every token
(a server whose labels lag its weights). ``pauses`` lists the pause modes asked for; ``generations`` counts the
sampling requests received.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
import urllib.parse
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from grpolab.algo.logprobs import token_logprobs
from grpolab.rollout.weight_transfer import gloo_group, tcp_uri


def sha256_of(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


class StandIn:
    def __init__(self, model, tokenizer, *, rl_api=True, scale_out=True, logprobs_mode="processed_logprobs",
                 backend="gloo", token_offset=0, version="0.32.0", max_model_len=512, hang=0.0, port=0,
                 kv_cache=False, hold_after=0, hold_if=lambda sp: True, hold_s=20.0, label=None, tied=False,
                 lora_rank=0, max_loras=1):  # fmt: skip
        self.model, self.tokenizer, self.version, self.tied = model.eval(), tokenizer, version, tied
        self.rl_api, self.scale_out, self.token_offset, self.hang = rl_api, scale_out, token_offset, hang
        self.config = {
            "model_config": {"logprobs_mode": logprobs_mode, "max_model_len": max_model_len},
            "weight_transfer_config": {"backend": backend},
            "lora_config": {"max_lora_rank": lora_rank, "max_loras": max_loras} if lora_rank else None,
        }
        self.adapters, self.adapter_loads = {}, []
        self.weight_version, self.group, self.requests, self.applied, self.joins = None, None, 0, 0, 0
        self.kv_cache, self.hold_after, self.hold_if, self.hold_s, self.label = (
            kv_cache,
            hold_after,
            hold_if,
            hold_s,
            label,
        )
        self.paused, self.pauses, self.cache_epoch, self.active, self.generations = False, [], 0, [], 0
        self.lock = threading.Condition()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ routes

    def route(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        path, _, query = path.partition("?")
        args = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
        if path in ("/weight_info", "/init_weight_transfer_engine", "/update_weights") and not self.rl_api:
            return 404, {"detail": "Not Found"}
        table = {
            "/health": lambda: {},
            "/version": lambda: {"version": self.version},
            "/weight_info": lambda: {"weight_version": self.weight_version},
            "/server_info": lambda: {"vllm_config": self.config},
            "/get_world_size": lambda: {"world_size": 1},
            "/weight_checker": lambda: {"checksums": self.checksums()},
            "/tokenize": lambda: {
                "tokens": [
                    t + self.token_offset for t in self.tokenizer.encode(body["prompt"], add_special_tokens=False)
                ]
            },  # fmt: skip
            "/init_weight_transfer_engine": lambda: self.join(body["init_info"]),
            "/start_weight_update": lambda: {},
            "/update_weights": lambda: self.receive(body["update_info"]),
            "/finish_weight_update": lambda: self.finish(body.get("weight_version")),
            "/shutdown_weight_transfer_engine": lambda: {},
            "/inference/v1/generate": lambda: self.generate(body),
            "/pause": lambda: self.pause(args.get("mode", "abort")),
            "/resume": lambda: self.resume(),
            "/is_paused": lambda: {"is_paused": self.paused},
            "/reset_prefix_cache": lambda: self.reset_cache(args.get("reset_running_requests") == "true"),
            "/v1/models": lambda: {"data": [{"id": n} for n in ["base", *self.adapters]]},
        }
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and self.config["lora_config"]:
            return self.load_adapter(body) if path == "/v1/load_lora_adapter" else self.unload_adapter(body)
        if path == "/inference/v1/generate" and body.get("model") not in (None, *self.adapters):
            return 404, {"error": f"The model `{body['model']}` does not exist."}
        if path == "/inference/v1/generate" and not self.scale_out:
            return 403, {"error": "Scale-out endpoints are disabled"}
        if path not in table:
            return 404, {"detail": "Not Found"}
        if path == "/start_weight_update" and self.running():
            return 409, {"error": "a weight update while requests run unpaused: POST /pause first"}
        return 200, table[path]()

    def checksums(self) -> dict[str, str]:
        """vLLM's names and SHA-256 digests of the served parameters: a tied lm_head shares the embedding's (not
        listed); an untied server's lists it."""
        tensors = {n: p.detach() for n, p in self.model.named_parameters()}
        if not self.tied:
            tensors.setdefault("lm_head.weight", self.model.get_output_embeddings().weight.detach())
        return {f"dp0:pp0:pcp0:tp0:{n}": sha256_of(t) for n, t in tensors.items()}

    def load_adapter(self, body: dict) -> tuple[int, str | dict]:
        """A peft adapter directory as the merged copy of the model (vLLM's reply: text)."""
        from safetensors.torch import load_file

        name, path = body["lora_name"], Path(body["lora_path"])
        if name in self.adapters:
            return 400, {"error": f"The lora adapter '{name}' has already been loaded."}
        config = json.loads((path / "adapter_config.json").read_text())
        merged = copy.deepcopy(self.model)
        modules = dict(merged.named_modules())
        tensors = load_file(str(path / "adapter_model.safetensors"))
        with torch.no_grad():
            for key, a in tensors.items():
                if key.endswith(".lora_A.weight"):
                    module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                    b = tensors[key.replace(".lora_A.", ".lora_B.")]
                    modules[module].weight += (config["lora_alpha"] / config["r"]) * (b @ a)
        with self.lock:
            self.adapters[name] = merged
            self.adapter_loads.append(name)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, body: dict) -> tuple[int, str | dict]:
        with self.lock:
            if self.adapters.pop(body["lora_name"], None) is None:
                return 404, {"error": f"The lora adapter '{body['lora_name']}' cannot be found."}
        return 200, f"Success: LoRA adapter '{body['lora_name']}' removed successfully."

    def running(self) -> bool:
        """Generation requests in flight while the server is not paused."""
        with self.lock:
            return bool(self.active) and not self.paused

    # ------------------------------------------------------------------ pause, resume, caches

    def pause(self, mode: str) -> dict:
        with self.lock:
            self.pauses.append(mode)
            if mode != "keep":  # keep: the held requests reach their hold points first, then all freeze
                self.paused = True
            for state in self.active:  # abort: they end now; wait: they run on to their end
                state["aborted"], state["drain"] = mode == "abort", mode == "wait"
            self.lock.notify_all()
            deadline = time.monotonic() + self.hold_s
            while not self._quiet(mode):
                if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"pause ({mode}): requests still running after {self.hold_s} s")
            self.paused = True
        return {"status": "paused"}

    def _quiet(self, mode: str) -> bool:
        """Whether a pause of `mode` may return: keep -- every held request at its hold point; wait -- none left."""
        if mode == "wait":
            return not self.active
        return mode == "abort" or all(not s["eligible"] or s["holding"] or s["held"] for s in self.active)

    def resume(self) -> dict:
        with self.lock:
            self.paused = False
            self.lock.notify_all()
        return {"status": "resumed"}

    def reset_cache(self, running: bool) -> dict:
        """vLLM's reset: with running requests it succeeds only when told to recompute theirs (preemption)."""
        with self.lock:
            if self.active and not running:
                return {"success": False}
            self.cache_epoch += 1
        return {"success": True}

    def join(self, info: dict) -> dict:
        from torch.distributed import PrefixStore, TCPStore

        bound = timedelta(seconds=info["timeout_s"])
        store = TCPStore(info["master_address"], info["master_port"], info["world_size"], False, bound)
        prefix = PrefixStore(tcp_uri(info["master_address"], info["master_port"]), store)
        self.group = gloo_group(prefix, info["rank_offset"], info["world_size"], bound)
        self.joins += 1
        return {}

    def receive(self, info: dict) -> dict:
        received = {}
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype))
            self.group.broadcast(t, 0).wait()
            received[name] = t
        self.pending = received
        return {}

    def finish(self, version) -> dict:
        with self.lock, torch.no_grad():
            params = dict(self.model.named_parameters(remove_duplicate=False))
            for name, t in self.pending.items():
                params[name].copy_(t.to(params[name].dtype))
            self.weight_version, self.applied = version, self.applied + 1
        return {}

    def generate(self, body: dict) -> dict:
        if self.hang:
            time.sleep(self.hang)
        sp, prompt = body["sampling_params"], list(body["token_ids"])
        model = self.adapters[body["model"]] if body.get("model") else self.model
        with torch.no_grad():
            if sp.get("prompt_logprobs") is not None:
                with self.lock:
                    self.requests += 1
                    logits = model(torch.tensor([prompt])).logits[0, :-1].double()
                lp = token_logprobs(logits, torch.tensor(prompt[1:])).tolist()
                entries = [None] + [{str(t): {"logprob": v}} for t, v in zip(prompt[1:], lp)]
                return {"choices": [{"index": 0, "token_ids": []}], "prompt_logprobs": entries}
            state = {"aborted": False, "holding": False, "held": False, "eligible": bool(self.hold_after)
                     and self.hold_if(sp), "start": None, "drain": False, "model": model}  # fmt: skip
            with self.lock:
                self.requests, self.generations = self.requests + 1, self.generations + 1
                self.active.append(state)
            try:
                gen = torch.Generator().manual_seed(sp.get("seed") or 0)
                choices = [self._sample(prompt, sp, gen, i, state) for i in range(sp.get("n", 1))]
            finally:
                with self.lock:
                    self.active.remove(state)
                    self.lock.notify_all()
        return {"choices": choices, **({"model": body["model"]} if body.get("model") else {})}

    def _turn(self, state: dict, index: int, t: int) -> None:
        """Wait (holding the lock) until the next token may be sampled: not paused, not held."""
        if state["eligible"] and index == 0 and t == self.hold_after and not state["held"]:
            state["holding"] = True
            self.lock.notify_all()
        deadline = time.monotonic() + self.hold_s
        while not state["aborted"]:
            paused = self.paused and not state["drain"]
            if state["holding"] and not paused and self.weight_version != state["start"]:
                state["holding"], state["held"] = False, True
            if not paused and not state["holding"]:
                return
            if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"a request waited {self.hold_s} s (paused or held) for a weight sync")

    def _sample(self, prompt: list[int], sp: dict, gen: torch.Generator, index: int, state: dict) -> dict:
        ids, out, content, starts, past, epoch = list(prompt), [], [], [], None, None
        temperature, finish = sp.get("temperature", 1.0), "length"
        for t in range(sp["max_tokens"]):
            with self.lock:
                self._turn(state, index, t)
                if state["aborted"]:
                    finish = "abort"
                    break
                state["start"] = self.weight_version if state["start"] is None else state["start"]
                if self.kv_cache and past is not None and epoch == self.cache_epoch:
                    step = state["model"](torch.tensor([ids[-1:]]), cache=past, use_cache=True)
                else:
                    step = state["model"](torch.tensor([ids]), use_cache=self.kv_cache)
                past, epoch = (step.cache if self.kv_cache else None), self.cache_epoch
                version = self.label or self.weight_version
            logits = step.logits[0, -1].double()
            if temperature == 0:
                tok = int(logits.argmax())
            else:
                tok = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            if not starts or starts[-1][0] != version:
                starts.append((version, len(out)))
            ids.append(tok)
            out.append(tok)
            content.append(
                {"token_id": tok, "logprob": float(torch.log_softmax(logits / (temperature or 1.0), -1)[tok])}
            )
            if tok in sp.get("stop_token_ids", []):
                finish = "stop"
                break
        with self.lock:  # the first completion has passed its hold point, or ended before it
            state["held"] = state["held"] or index == 0
            self.lock.notify_all()
        ends = [start for _, start in starts[1:]] + [len(out)]
        spans = [{"version": v, "start": a, "end": b} for (v, a), b in zip(starts, ends)]
        logprobs = {"content": content} if sp.get("logprobs") is not None else None
        return {"index": index, "token_ids": out, "logprobs": logprobs, "weight_versions": spans,
                "finish_reason": finish}  # fmt: skip

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else {}
                try:
                    status, reply = stand_in.route(method, self.path, body)
                except Exception as e:  # noqa: BLE001 -- a stand-in's failure goes back as vLLM's would
                    status, reply = 500, {"error": f"{type(e).__name__}: {e}"}
                text = isinstance(reply, str)  # vLLM's LoRA routes answer text
                data = reply.encode() if text else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._answer("GET")

            def do_POST(self):  # noqa: N802
                self._answer("POST")

            def log_message(self, *args):
                pass

        return Handler
