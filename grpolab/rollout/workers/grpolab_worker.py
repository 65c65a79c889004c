"""grpolab's own decode loop as a worker process (``rollout.engine: grpolab_process``; docs/async.md).

Started by ``grpolab.rollout.worker_engine.GrpolabProcessEngine`` as ``<this Python> grpolab_worker.py --fd N``, it
answers the requests vLLM's worker answers (grpolab.rollout.workers.vllm_worker documents them: start, generate, score,
load_weights, stop), one at a time, in order, with grpolab's GrpolabEngine (rollout/grpolab_engine.py, the ``grpolab`` decoder) on its
own copy of the weights. A trainer keeps generations in flight on it while it updates (rollout.max_staleness).

- ``start``: load the model directory the trainer wrote (config, weights in the sampler dtype, tokenizer); set the
  process's torch threads (``threads``, 0: torch's default) and the decode loop's speed switches (``speed``).
- ``generate``: per prompt, ``n`` completions from the prompt's own seeded stream, the sampled tokens'
  log-probabilities (of the distribution sampled from) and, under top-k / top-p, the untruncated ones; the text stop
  rule ``stop_rule`` ends completions as the in-process engine does.
- ``score``: teacher-forced log softmax(logits)(token) of every token after the first (temperature 1).
- ``load_weights``: the weights from a safetensors file, copied into the model in place.
"""

from __future__ import annotations

import sys
import time


def start(state: dict, req: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpolab
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    began = time.perf_counter()
    if req.get("threads"):
        torch.set_num_threads(int(req["threads"]))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[req["dtype"]]
    model = AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=dtype).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(req["model_dir"])
    speed = req.get("speed") or {}
    state["engine"] = GrpolabEngine(model, tokenizer, dtype, "grpolab", False, **speed)
    state["model"] = model
    return {"version": grpolab.__version__, "start_s": time.perf_counter() - began}


def generate(state: dict, req: dict) -> dict:
    from grpolab.rollout.base import SamplingParams

    params = SamplingParams(
        group_size=int(req["n"]),
        temperature=float(req["temperature"]),
        top_p=float(req["top_p"]),
        top_k=int(req["top_k"]),
        max_new_tokens=int(req["max_tokens"]),
        greedy=bool(req["greedy"]),
        logprobs=bool(req["logprobs"]),
        stop_rule=req.get("stop_rule") or "none",
    )
    r = state["engine"].generate([list(p) for p in req["prompts"]], params, req.get("seeds"))
    g = 1 if params.greedy else params.group_size
    lengths = r.completion_mask.sum(-1).tolist()
    rows = []
    for i, n in enumerate(lengths):
        row = {"token_ids": r.completion_ids[i, :n].tolist(), "logprobs": r.sampler_logprobs[i, :n].tolist()}
        if r.sampler_logprobs_untruncated is not None:
            row["logprobs_untruncated"] = r.sampler_logprobs_untruncated[i, :n].tolist()
        rows.append(row)
    return {"groups": [rows[j * g : (j + 1) * g] for j in range(len(req["prompts"]))]}


def score(state: dict, req: dict) -> dict:
    import torch

    from grpolab.algo.logprobs import token_logprobs

    model, out = state["model"], []
    with torch.no_grad():
        for seq in req["sequences"]:
            ids = torch.tensor([list(seq)], dtype=torch.long)
            logits = model(input_ids=ids).logits[:, :-1].float()
            out.append(token_logprobs(logits, ids[:, 1:], 1.0)[0].tolist())
    return {"logprobs": out}


def load_weights(state: dict, req: dict) -> dict:
    import torch
    from safetensors.torch import load_file

    began = time.perf_counter()
    tensors = load_file(req["path"])
    params = dict(state["model"].named_parameters(remove_duplicate=False))
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise KeyError(f"the weights file lacks {len(missing)} parameter(s) of the model, first: {missing[0]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name])
    return {"load_s": time.perf_counter() - began}


COMMANDS = {"start": start, "generate": generate, "score": score, "load_weights": load_weights}


if __name__ == "__main__":
    from grpolab.rollout.workers.vllm_worker import (
        main,  # the same request loop (stdlib only; vllm is imported lazily there)
    )

    sys.exit(main(None, COMMANDS, __doc__))
