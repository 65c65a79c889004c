"""Serve a GGUF file with llama.cpp (llama-cpp-python) and answer chat requests greedily -- the second independent
stack of the serving check (grpolab.serving.check, ``--stack gguf``). Like serve_hf.py it imports only the standard
library, numpy and llama_cpp, refuses to import grpolab at all, and is run as ``python -I serve_gguf.py ...`` from a
directory outside grpolab's source tree.

What a llama.cpp deployment does with the file is what this script does:

- ``llama_cpp.Llama(model_path, n_ctx, logits_all=True)``: the weights, tokenizer and chat template all come from
  the file;
- the prompt: the Jinja chat template in the file's metadata (``tokenizer.chat_template``) rendered by
  llama-cpp-python's ``Jinja2ChatFormatter`` with ``add_generation_prompt=True`` and the file's bos / eos texts --
  the formatter its ``create_chat_completion`` uses when the file has a template and no built-in format
  (``Llama.chat_format``, reported) -- then ``Llama.tokenize(prompt, add_bos=False, special=True)`` as that chat
  handler does (the formatter says the template wrote the special tokens itself);
- greedy decoding: ``Llama.generate(prompt_ids, temp=0)`` (llama.cpp's greedy sampler, repeat penalty 1, so no
  other sampler acts), from an empty cache per request (``Llama.reset()``: no prefix reuse between requests), one
  request at a time; the answer ends on a token llama.cpp counts as end of generation (``llama_vocab_is_eog``: the
  file's eos / eot / eom ids and the tokens it recognises by their text) or at max_new_tokens;
- the log-probability of each generated token: log softmax (float64) of the logits row llama.cpp computed for
  that position; with reference ids, the same for each reference token after the same prompt (teacher forcing:
  one ``Llama.eval(prompt + reference)``), so two stacks are compared token by token even where answers part.

Input (--requests, JSON) and output (--out, JSON) are serve_hf.py's: per request uid, prompt_ids, completion_ids,
text (special tokens not rendered), logprobs, stopped, reference_logprobs; the stack adds ``declared_end_ids``
(what the file's metadata names) beside ``eos_token_id`` (every id llama.cpp ends on).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import json
import os
import sys
import time

FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}  # general.file_type (llama.cpp's LLAMA_FTYPE_*)
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


class RefuseGrpolab(importlib.abc.MetaPathFinder):
    """An import hook that makes ``import grpolab`` (or any submodule) fail in this process. The same as
    serve_hf.py's on purpose: each serving script runs alone under ``python -I``, importing nothing beside it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "grpolab" or fullname.startswith("grpolab."):
            raise ImportError(f"{fullname}: the serving stack runs without grpolab code")
        return None


def refuse_grpolab() -> None:
    """Install RefuseGrpolab ahead of every other finder (an editable install's finder included)."""
    sys.meta_path.insert(0, RefuseGrpolab())


def logprobs_of(rows, token_ids) -> list[float]:
    """log softmax(rows[t])[token_ids[t]] per position, in float64: rows [T, V] logits, token_ids [T]."""
    import numpy as np

    x = np.asarray(rows, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=-1))
    return (x[np.arange(len(token_ids)), np.asarray(token_ids, dtype=np.int64)] - lse).tolist()


def prompt_ids(llm, formatter, messages: list[dict]) -> list[int]:
    """The file's chat template rendered for the messages, tokenized as llama-cpp-python's chat handler does."""
    result = formatter(messages=messages)
    return llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)


def answer(llm, formatter, eog, request: dict, max_new_tokens: int) -> dict:
    """One request: the prompt, greedy generation to an end-of-generation token, logprobs, teacher forcing."""
    prompt = prompt_ids(llm, formatter, request["messages"])
    reference = list(request.get("reference_ids") or [])
    need = len(prompt) + max(max_new_tokens, len(reference))
    if need > llm.n_ctx():
        raise ValueError(
            f"request {request['uid']}: prompt of {len(prompt)} tokens + {max(max_new_tokens, len(reference))} "
            f"does not fit n_ctx {llm.n_ctx()}; pass a larger --n-ctx"
        )
    llm.reset()
    completion, stopped = [], False
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0):
        completion.append(int(token))
        if token in eog:
            stopped = True
            break
        if len(completion) >= max_new_tokens:
            break
    start = len(prompt) - 1
    row = {
        "uid": request["uid"],
        "prompt_ids": prompt,
        "completion_ids": completion,
        "text": llm.detokenize(completion, special=False).decode("utf-8", errors="replace"),
        "logprobs": logprobs_of(llm.scores[start : start + len(completion)], completion),
        "stopped": stopped,
    }
    if reference:
        llm.reset()
        llm.eval(prompt + reference)
        row["reference_logprobs"] = logprobs_of(llm.scores[start : start + len(reference)], reference)
    return row


def serve(model_path: str, requests: list[dict], max_new_tokens: int, threads: int, n_ctx: int) -> dict:
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    threads = threads or os.cpu_count() or 1
    start = time.perf_counter()
    llm = Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_batch=min(n_ctx, 512),
        logits_all=True,
        n_threads=threads,
        n_threads_batch=threads,
        seed=0,
        verbose=False,
    )
    loaded = time.perf_counter() - start
    meta = llm.metadata
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog = {i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)}

    def text(token: int) -> str:
        return llama_cpp.llama_vocab_get_text(vocab, token).decode("utf-8") if token >= 0 else ""

    template = meta.get("tokenizer.chat_template", "")
    formatter = Jinja2ChatFormatter(
        template=template, eos_token=text(llm.token_eos()), bos_token=text(llm.token_bos()), add_generation_prompt=True
    )
    rows = [answer(llm, formatter, eog, r, max_new_tokens) for r in requests]
    return {
        "stack": {
            "llama_cpp": llama_cpp.__version__,
            "python": sys.version.split()[0],
            "isolated": bool(sys.flags.isolated),
            "chat_format": llm.chat_format,
            "threads": threads,
            "grpolab_modules": sorted(m for m in sys.modules if m.split(".")[0] == "grpolab"),
        },
        "model_dir": model_path,
        "dtype": FILE_TYPES.get(int(meta.get("general.file_type", -1)), meta.get("general.file_type")),
        "eos_token_id": sorted(eog),
        "declared_end_ids": sorted({int(meta[k]) for k in END_KEYS if k in meta}),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "n_ctx": llm.n_ctx(),
        "load_s": loaded,
        "answer_s": time.perf_counter() - start - loaded,
        "rows": rows,
    }


def main() -> None:
    refuse_grpolab()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--requests", required=True, help="JSON list of requests")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all the CPU's)")
    parser.add_argument("--n-ctx", type=int, default=1024, help="context length (prompt + answer must fit)")
    args = parser.parse_args()
    with open(args.requests, encoding="utf-8") as f:
        requests = json.load(f)
    result = serve(args.model, requests, args.max_new_tokens, args.threads, args.n_ctx)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
