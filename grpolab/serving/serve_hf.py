"""Serve a model directory with plain transformers and answer chat requests greedily -- the independent stack of
the serving check (grpolab.serving.check). It imports only the standard library, torch and transformers, and
refuses to import grpolab at all, so nothing of grpolab's loading, prompting or decoding can make the served
answers agree with grpolab's evaluation; grpolab runs it as ``python -I serve_hf.py ...`` from a directory outside
its source tree.

What a deployment does with the directory is what this script does: ``AutoTokenizer`` and
``AutoModelForCausalLM.from_pretrained(dir, dtype="auto")`` (the precision the weights were written in),
``apply_chat_template(messages, add_generation_prompt=True)``, then ``generate`` with the directory's own
generation_config.json (its ``eos_token_id`` list ends the answer), greedy, one request at a time (no padding).

Input (--requests, JSON): ``[{"uid", "messages": [{"role", "content"}], "reference_ids": [int] (optional)}]``.
Output (--out, JSON): the stack (versions, dtype, eos ids, chat-template sha256, modules loaded) and per request
its prompt ids, completion ids and text, the log-probability of each generated token (log softmax of the raw
logits), whether an end id stopped it, and -- when reference ids are given -- the log-probability this model gives
each of those tokens after the same prompt (teacher forcing), so two stacks can be compared token by token even
where their greedy answers part.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import json
import sys
import time


class RefuseGrpolab(importlib.abc.MetaPathFinder):
    """An import hook that makes ``import grpolab`` (or any submodule) fail in this process."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "grpolab" or fullname.startswith("grpolab."):
            raise ImportError(f"{fullname}: the serving stack runs without grpolab code")
        return None


def refuse_grpolab() -> None:
    """Install RefuseGrpolab ahead of every other finder (an editable install's finder included)."""
    sys.meta_path.insert(0, RefuseGrpolab())


def token_logprobs(logits, token_ids):
    """log softmax(logits)[token] per position, in float32: logits [T, V], token_ids [T] -> list of T floats."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, token_ids.view(-1, 1)).view(-1).tolist()


def answer(model, tokenizer, request: dict, max_new_tokens: int) -> dict:
    """One request: greedy generation with the model's generation_config, per-token logprobs, teacher forcing."""
    import torch

    prompt = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, temperature=None,
                             top_p=None, top_k=None, max_new_tokens=max_new_tokens, return_dict_in_generate=True,
                             output_logits=True)
        completion = out.sequences[0, len(prompt):]
        steps = torch.stack([step[0] for step in out.logits])[: len(completion)]
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        row = {"uid": request["uid"], "prompt_ids": prompt, "completion_ids": completion.tolist(),
               "text": tokenizer.decode(completion, skip_special_tokens=True),
               "logprobs": token_logprobs(steps, completion),
               "stopped": bool(len(completion)) and int(completion[-1]) in eos}
        reference = request.get("reference_ids")
        if reference:
            full = torch.tensor([prompt + list(reference)], dtype=torch.long)
            logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1]
            row["reference_logprobs"] = token_logprobs(logits, torch.tensor(reference, dtype=torch.long))
    return row


def serve(model_dir: str, requests: list[dict], max_new_tokens: int, threads: int) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads > 0:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").eval()
    loaded = time.perf_counter() - start
    rows = [answer(model, tokenizer, r, max_new_tokens) for r in requests]
    eos = model.generation_config.eos_token_id
    return {
        "stack": {"transformers": transformers.__version__, "torch": torch.__version__,
                  "python": sys.version.split()[0], "isolated": bool(sys.flags.isolated),
                  "grpolab_modules": sorted(m for m in sys.modules if m.split(".")[0] == "grpolab")},
        "model_dir": model_dir, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "eos_token_id": sorted([eos] if isinstance(eos, int) else list(eos or [])),
        "chat_template_sha256": hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest(),
        "load_s": loaded, "answer_s": time.perf_counter() - start - loaded, "rows": rows,
    }


def main() -> None:
    refuse_grpolab()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory (a release bundle)")
    parser.add_argument("--requests", required=True, help="JSON list of requests")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    with open(args.requests, encoding="utf-8") as f:
        requests = json.load(f)
    result = serve(args.model, requests, args.max_new_tokens, args.threads)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
