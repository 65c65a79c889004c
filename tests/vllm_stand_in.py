"""A stand-in for a ``vllm serve`` server (torch only, on 127.0.0.1): the routes grpolab's vllm_server engine uses,
answered by a transformers model whose weights arrive over the gloo weight-transfer group as grpolab's vLLM plugin
receives them (rank 1 of the trainer's group, one broadcast per announced tensor).

Its knobs make the servers the engine must refuse: no RL API (``rl_api=False``: /weight_info is 404), no token-in
route (``scale_out=False``: 403), another tokenizer (``token_offset``), another logprobs mode or backend, another
vLLM version, a route that hangs (``hang``: seconds /inference/v1/generate sleeps). ``port``: where it listens (0:
any free port; a server restarted at the URL of one that was closed). ``requests`` counts the generation requests
it answered; ``applied`` the weight updates it loaded; ``joins`` the weight-transfer groups it joined.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from grpolab.algo.logprobs import token_logprobs
from grpolab.rollout.weight_transfer import gloo_group, tcp_uri


class StandIn:
    def __init__(self, model, tokenizer, *, rl_api=True, scale_out=True, logprobs_mode="processed_logprobs",
                 backend="gloo", token_offset=0, version="0.32.0", max_model_len=512, hang=0.0, port=0):  # fmt: skip
        self.model, self.tokenizer, self.version = model.eval(), tokenizer, version
        self.rl_api, self.scale_out, self.token_offset, self.hang = rl_api, scale_out, token_offset, hang
        self.config = {
            "model_config": {"logprobs_mode": logprobs_mode, "max_model_len": max_model_len},
            "weight_transfer_config": {"backend": backend},
        }
        self.weight_version, self.group, self.requests, self.applied, self.joins = None, None, 0, 0, 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ routes

    def route(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        path = path.split("?")[0]
        if path in ("/weight_info", "/init_weight_transfer_engine", "/update_weights") and not self.rl_api:
            return 404, {"detail": "Not Found"}
        table = {
            "/health": lambda: {},
            "/version": lambda: {"version": self.version},
            "/weight_info": lambda: {"weight_version": self.weight_version},
            "/server_info": lambda: {"vllm_config": self.config},
            "/get_world_size": lambda: {"world_size": 1},
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
        }
        if path == "/inference/v1/generate" and not self.scale_out:
            return 403, {"error": "Scale-out endpoints are disabled"}
        if path not in table:
            return 404, {"detail": "Not Found"}
        return 200, table[path]()

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
        with self.lock, torch.no_grad():
            self.requests += 1
            if sp.get("prompt_logprobs") is not None:
                logits = self.model(torch.tensor([prompt])).logits[0, :-1].double()
                lp = token_logprobs(logits, torch.tensor(prompt[1:])).tolist()
                entries = [None] + [{str(t): {"logprob": v}} for t, v in zip(prompt[1:], lp)]
                return {"choices": [{"index": 0, "token_ids": []}], "prompt_logprobs": entries}
            gen = torch.Generator().manual_seed(sp.get("seed") or 0)
            choices = [self._sample(prompt, sp, gen, i) for i in range(sp.get("n", 1))]
        return {"choices": choices}

    def _sample(self, prompt: list[int], sp: dict, gen: torch.Generator, index: int) -> dict:
        ids, out, content = list(prompt), [], []
        for _ in range(sp["max_tokens"]):
            logits = self.model(torch.tensor([ids])).logits[0, -1].double()
            temperature = sp.get("temperature", 1.0)
            if temperature == 0:
                tok = int(logits.argmax())
            else:
                tok = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            lp = float(torch.log_softmax(logits / (temperature or 1.0), -1)[tok])
            ids.append(tok)
            out.append(tok)
            content.append({"token_id": tok, "logprob": lp})
            if tok in sp.get("stop_token_ids", []):
                break
        spans = [{"version": self.weight_version, "start": 0, "end": len(out)}]
        logprobs = {"content": content} if sp.get("logprobs") is not None else None
        return {"index": index, "token_ids": out, "logprobs": logprobs, "weight_versions": spans,
                "finish_reason": "stop" if out and out[-1] in sp.get("stop_token_ids", []) else "length"}  # fmt: skip

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
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
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
