"""Serve a model directory with plain transformers and answer chat requests greedily -- the independent stack of
the serving check (grpolab.serving.check). It imports only the standard library, torch and transformers, and
refuses to import grpolab at all, so nothing of grpolab's loading, prompting or decoding can make the served
answers agree with grpolab's evaluation; grpolab runs it as ``python -I serve_hf.py ...`` from a directory outside
its source tree.

What a deployment does with the directory is what this script does: ``AutoTokenizer`` and
``AutoModelForCausalLM.from_pretrained(dir, dtype="auto")`` (the precision the weights were written in),
``apply_chat_template(messages, add_generation_prompt=True)``, then ``generate`` with the directory's own
generation_config.json (its ``eos_token_id`` list ends the answer), greedy. Requests whose prompts have the same
number of tokens are answered together, up to ``--batch-size`` at a time, so no prompt is ever padded; a row that
ends waits, padded, for the others and its answer is cut after its end id (``--batch-size 1``: one at a time).

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


def first_end(ids: list[int], eos: list[int]) -> int:
    """Tokens of an answer up to and including its first end id (all of them when none ends it)."""
    return next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))


def teacher_forced(model, prompt: list[int], reference: list[int]) -> list[float]:
    """log p(reference token | prompt, earlier reference tokens), one forward pass."""
    import torch

    full = torch.tensor([prompt + list(reference)], dtype=torch.long)
    logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor(reference, dtype=torch.long))


def answer_batch(model, tokenizer, requests: list[dict], prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """Requests whose prompts have one length: greedy generation together with the model's generation_config,
    per-token logprobs, and teacher forcing of each request's reference ids."""
    import torch

    assert len({len(p) for p in prompts}) == 1, "a batch holds prompts of one length (nothing is padded)"
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    ids = torch.tensor(prompts, dtype=torch.long)
    rows = []
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            max_new_tokens=max_new_tokens,
            return_dict_in_generate=True,
            output_logits=True,
        )
        for i, (request, prompt) in enumerate(zip(requests, prompts)):
            generated = out.sequences[i, len(prompt) :].tolist()
            completion = torch.tensor(generated[: first_end(generated, eos)], dtype=torch.long)
            steps = torch.stack([step[i] for step in out.logits[: len(completion)]]) if len(completion) else None
            row = {
                "uid": request["uid"],
                "prompt_ids": prompt,
                "completion_ids": completion.tolist(),
                "text": tokenizer.decode(completion, skip_special_tokens=True),
                "logprobs": token_logprobs(steps, completion) if steps is not None else [],
                "stopped": bool(len(completion)) and int(completion[-1]) in eos,
            }
            if request.get("reference_ids"):
                row["reference_logprobs"] = teacher_forced(model, prompt, request["reference_ids"])
            rows.append(row)
    return rows


def answer_all(model, tokenizer, requests: list[dict], max_new_tokens: int, batch_size: int) -> list[dict]:
    """Every request, in batches of equal prompt length (at most batch_size each); rows in request order."""
    prompts = [
        tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
        for r in requests
    ]
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    rows: list = [None] * len(requests)
    for indices in by_length.values():
        for start in range(0, len(indices), max(1, batch_size)):
            chunk = indices[start : start + max(1, batch_size)]
            answered = answer_batch(
                model, tokenizer, [requests[i] for i in chunk], [prompts[i] for i in chunk], max_new_tokens
            )
            for i, row in zip(chunk, answered):
                rows[i] = row
    return rows


def serve(model_dir: str, requests: list[dict], max_new_tokens: int, threads: int, batch_size: int = 1) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads > 0:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").eval()
    loaded = time.perf_counter() - start
    rows = answer_all(model, tokenizer, requests, max_new_tokens, batch_size)
    eos = model.generation_config.eos_token_id
    return {
        "stack": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "isolated": bool(sys.flags.isolated),
            "grpolab_modules": sorted(m for m in sys.modules if m.split(".")[0] == "grpolab"),
        },
        "model_dir": model_dir,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "eos_token_id": sorted([eos] if isinstance(eos, int) else list(eos or [])),
        "chat_template_sha256": hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest(),
        "load_s": loaded,
        "answer_s": time.perf_counter() - start - loaded,
        "batch_size": batch_size,
        "rows": rows,
    }


def main() -> None:
    refuse_grpolab()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory (a release bundle)")
    parser.add_argument("--requests", required=True, help="JSON list of requests")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--batch-size", type=int, default=1, help="requests answered together (same prompt length)")
    args = parser.parse_args()
    with open(args.requests, encoding="utf-8") as f:
        requests = json.load(f)
    result = serve(args.model, requests, args.max_new_tokens, args.threads, args.batch_size)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
