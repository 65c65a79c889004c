"""The serving check: a model directory served by plain transformers in its own process (serve_hf.py, no grpolab
code), compared with grpolab's own measurements. Results go to RUN/release/serving.json, which the report grades
(grpolab.gate.release); the rollback check (grpolab.serving.rollback) serves its target the same way.

Serving (run_serving_check): grpolab evaluates the bundled checkpoint again on the held-out problems the release
was measured on (greedy, the evaluation's dtype and max_new_tokens, its stop rule), and scores its answers' tokens
by teacher forcing; the served stack answers the same problems greedily and scores grpolab's tokens too. Measured:
the prompts each side built (template and tokenizer), the end ids, the weights against the evaluated model cast
to the bundle's precision, identical completions, first divergence, mean |delta logprob| per token
(grpolab.serving.compare), and the accuracy of the served answers minus grpolab's, paired bootstrap over problems.

The second stack (``stack="gguf"``): the bundle converted to one GGUF file (grpolab.serving.gguf; f32, bf16 or f16)
beside it, served by llama.cpp through llama-cpp-python in its own process (serve_gguf.py, no grpolab code), the
same measures written to RUN/release/serving_gguf.json. The weights compared are the file's tensors against the
evaluated model's cast to the bundle's precision and put through the conversion (Q/K permutation, the file's type);
the end ids are both the file's declared eos / eot / eom and every id llama.cpp ends generation on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import GrpolabError
from ..evaluation.heldout import load_eval_problems, score_item, stop_rule_for
from ..evaluation.result import Completion
from ..evaluation.scoring import paired_bootstrap_diff
from ..manifest import read_manifest, write_json_atomic
from ..tasks import render_prompt
from ..tasks.base import Problem
from ..tasks.code import is_code_problem
from ..tasks.prompting import prompt_ids
from .bundle import RELEASE_FILE, read_release
from .compare import divergence_summary, mean_abs_logprob_diff

SERVE_SCRIPT = Path(__file__).with_name("serve_hf.py")
SERVE_GGUF_SCRIPT = Path(__file__).with_name("serve_gguf.py")
SERVING_FILE, SERVING_GGUF_FILE = "serving.json", "serving_gguf.json"
STACKS = ("transformers", "gguf")
LLAMA_CPP_MISSING = (
    "llama-cpp-python is not installed in this interpreter: `make install-gguf` or "
    "`pip install 'grpolab[gguf]'` (it builds llama.cpp from source: about 15 min on 2 cores)"
)
Log = Callable[[str], None]


def release_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "release"


def _serve_isolated(
    script: Path,
    model: Path,
    requests: list[dict[str, Any]],
    max_new_tokens: int,
    threads: int,
    what: str,
    extra: list[str],
    timeout_s: float,
) -> dict[str, Any]:
    """Run a serving script on `model` in a separate, isolated interpreter (``python -I``: no PYTHONPATH, no user
    site, not the script's or the working directory; run from an empty temporary directory; grpolab imports
    refused by the script itself) and return what it wrote."""
    with tempfile.TemporaryDirectory(prefix="grpolab-serve-") as tmp:
        req, out = Path(tmp) / "requests.json", Path(tmp) / "served.json"
        req.write_text(json.dumps(requests), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        cmd = [
            sys.executable,
            "-I",
            str(script),
            "--model",
            str(Path(model).resolve()),
            "--requests",
            str(req),
            "--out",
            str(out),
            "--max-new-tokens",
            str(max_new_tokens),
            "--threads",
            str(threads),
            *extra,
        ]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise GrpolabError(f"serving {model} with {what} failed (exit {proc.returncode}): " + " | ".join(tail))
        return json.loads(out.read_text(encoding="utf-8"))


def serve_with_transformers(
    model_dir: Path,
    requests: list[dict[str, Any]],
    max_new_tokens: int,
    threads: int = 0,
    batch_size: int = 8,
    timeout_s: float = 3600,
) -> dict[str, Any]:
    """serve_hf.py on a model directory, isolated (_serve_isolated); requests of one prompt length answered
    batch_size at a time (no padding)."""
    return _serve_isolated(
        SERVE_SCRIPT,
        model_dir,
        requests,
        max_new_tokens,
        threads,
        "plain transformers",
        ["--batch-size", str(batch_size)],
        timeout_s,
    )


def serve_with_llama_cpp(
    gguf_file: Path,
    requests: list[dict[str, Any]],
    max_new_tokens: int,
    threads: int = 0,
    n_ctx: int = 1024,
    timeout_s: float = 3600,
) -> dict[str, Any]:
    """serve_gguf.py on a GGUF file, isolated (_serve_isolated); GrpolabError saying how to install llama-cpp-python
    when this interpreter lacks it."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise GrpolabError(f"{LLAMA_CPP_MISSING}; the GGUF file {gguf_file} was written but cannot be served here")
    return _serve_isolated(
        SERVE_GGUF_SCRIPT, gguf_file, requests, max_new_tokens, threads, "llama.cpp", ["--n-ctx", str(n_ctx)], timeout_s
    )


def serve_requests(problems: list[Problem], references: list[list[int]] | None = None) -> list[dict[str, Any]]:
    return [
        {
            "uid": p.uid,
            "messages": [{"role": "user", "content": render_prompt(p)}],
            **({"reference_ids": references[i]} if references else {}),
        }
        for i, p in enumerate(problems)
    ]


def score_answers(
    problems: list[Problem], texts: list[str], lengths: list[int], truncated: list[bool], task: str
) -> list[float]:
    """Held-out accuracy of each answer, scored as grpolab's evaluation scores it (math-verify; code in the sandbox)."""
    from ..evaluation.heldout import score_code_item
    from ..evaluation.scoring import code_passes, held_out_job

    done = [Completion(t, n, c) for t, n, c in zip(texts, lengths, truncated)]
    if problems and all(is_code_problem(p) for p in problems):
        verdicts = code_passes([[held_out_job(c.text, p)] for p, c in zip(problems, done)])
        return [score_code_item(p, c, [], v)["scores"]["accuracy"] for p, c, v in zip(problems, done, verdicts)]
    return [score_item(p, c, [], task)["scores"]["accuracy"] for p, c in zip(problems, done)]


def paired_change(reference: list[float], other: list[float]) -> dict[str, float]:
    mean, lo, hi = paired_bootstrap_diff(reference, other)
    return {"mean": mean, "ci_low": lo, "ci_high": hi}


def grpolab_side(
    ckpt: Path, problems: list[Problem], max_new_tokens: int, dtype: str, batch_size: int
) -> dict[str, Any]:
    """grpolab's evaluation of the checkpoint: prompts, greedy completion ids (stop token included), texts,
    truncation, the teacher-forced logprob of each completion token, the stop ids, and the model itself."""
    import torch

    from ..models.load import DTYPES, load_causal_lm, load_tokenizer
    from ..rollout.base import SamplingParams
    from ..rollout.grpolab_engine import GrpolabEngine

    tokenizer = load_tokenizer(str(ckpt))
    model = load_causal_lm(str(ckpt), dtype).eval()
    engine = GrpolabEngine(model, tokenizer, DTYPES[dtype])
    params = SamplingParams(group_size=1, max_new_tokens=max_new_tokens, greedy=True, stop_rule=stop_rule_for(problems))
    prompts = [prompt_ids(tokenizer, p) for p in problems]
    ids, texts, truncated = [], [], []
    for i in range(0, len(problems), batch_size):
        r = engine.generate(prompts[i : i + batch_size], params)
        for row, m in zip(r.completion_ids, r.completion_mask):
            ids.append(row[: int(m.sum())].tolist())
        texts += r.texts
        truncated += r.truncated.tolist()
    logprobs = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, ids):
            full = torch.tensor([prompt + completion], dtype=torch.long)
            logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
            logprobs.append(
                torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion).view(-1, 1)).view(-1).tolist()
            )
    return {
        "prompts": prompts,
        "ids": ids,
        "texts": texts,
        "truncated": truncated,
        "logprobs": logprobs,
        "stop_ids": list(engine.stop_ids),
        "model": model,
        "tokenizer": tokenizer,
    }


def weights_against(model, bundle: Path) -> dict[str, Any]:
    """Compare every tensor of the bundle's weight files with the evaluated model's tensor of the same name cast to
    the bundle's dtype: how many are bitwise equal, the largest |difference|, names only one side has."""
    import torch
    from safetensors.torch import load_file

    ours = model.state_dict()
    equal, total, worst, missing = 0, 0, 0.0, []
    for f in sorted(Path(bundle).glob("*.safetensors")):
        for name, t in load_file(str(f)).items():
            total += 1
            if name not in ours:
                missing.append(name)
                continue
            cast = ours[name].to(t.dtype)
            if cast.shape == t.shape and torch.equal(cast, t):
                equal += 1
            else:
                diff = (cast.float() - t.float()).abs().max().item() if cast.shape == t.shape else float("inf")
                worst = max(worst, diff)
    return {"tensors": total, "identical": equal, "max_abs_diff": worst, "only_in_bundle": missing[:5]}


def gguf_file_for(bundle: Path, gguf_type: str) -> Path:
    """Where the serving check writes a bundle's GGUF: beside the bundle, ``gguf/<bundle name>.<type>.gguf``."""
    return Path(bundle).parent / "gguf" / f"{Path(bundle).name}.{gguf_type}.gguf"


def _serve_gguf(
    bundle: Path,
    release: dict[str, Any],
    model,
    requests: list[dict[str, Any]],
    prompts: list[list[int]],
    max_new_tokens: int,
    threads: int,
    gguf_type: str,
    log: Log,
) -> tuple[dict, dict, dict]:
    """Convert the bundle to GGUF (grpolab.serving.gguf), compare the file's tensors with the evaluated model's,
    serve it with llama.cpp; returns (served, weights, conversion). n_ctx: the longest prompt grpolab built, plus
    the longer of max_new_tokens and the longest reference, plus 128 tokens of slack for a template that differs."""
    from ..models.load import DTYPES
    from .gguf import convert_to_gguf, weights_against_gguf

    path = gguf_file_for(bundle, gguf_type)
    conversion = convert_to_gguf(bundle, path, gguf_type)
    log(f"serving check: wrote {path} ({conversion['bytes'] / 1e6:.0f} MB, {gguf_type}, {conversion['seconds']:.1f} s)")
    weights = weights_against_gguf(model, path, DTYPES[release["precision"]["written"]])
    longest_ref = max((len(r.get("reference_ids") or []) for r in requests), default=0)
    n_ctx = max(len(p) for p in prompts) + max(max_new_tokens, longest_ref) + 128
    log("serving check: llama.cpp serves the GGUF file in a separate process")
    served = serve_with_llama_cpp(path, requests, max_new_tokens, threads, n_ctx)
    return served, weights, conversion


def run_serving_check(
    bundle: Path,
    n: int = 0,
    batch_size: int = 16,
    threads: int = 0,
    log: Log = lambda s: None,
    stack: str = "transformers",
    gguf_type: str = "f32",
) -> dict[str, Any]:
    """One stack's serving check (run_serving_checks with ``stacks=(stack,)``): its result."""
    return run_serving_checks(bundle, (stack,), n, batch_size, threads, log, gguf_type)[stack]


def run_serving_checks(
    bundle: Path,
    stacks: tuple[str, ...] = ("transformers",),
    n: int = 0,
    batch_size: int = 16,
    threads: int = 0,
    log: Log = lambda s: None,
    gguf_type: str = "f32",
) -> dict[str, dict[str, Any]]:
    """Serve `bundle` with each of `stacks` -- plain transformers ("transformers": SOURCE_RUN/release/serving.json)
    and/or its GGUF file with llama.cpp ("gguf", gguf_type f32 / bf16 / f16: serving_gguf.json) -- and compare each
    with grpolab's evaluation of the checkpoint on the first n held-out problems (0: all the evaluation had), which
    runs once for all stacks; write each result and return {stack: result}. A result's ``seconds`` is grpolab's
    evaluation plus that stack's own time."""
    for stack in stacks:
        if stack not in STACKS:
            raise GrpolabError(f"--stack: expected one of {', '.join(STACKS)}, got {stack!r}")
    if "gguf" in stacks and importlib.util.find_spec("llama_cpp") is None:
        raise GrpolabError(f"--stack gguf: {LLAMA_CPP_MISSING}")
    bundle = Path(bundle)
    release = read_release(bundle)
    run_dir, ckpt = Path(release["source_run"]), Path(release["checkpoint"])
    held = release["held_out"]
    problems = load_eval_problems(held["task"], held["task_options"], held["split"], n or held["n"] or 0)
    start = time.perf_counter()
    log(f"serving check: grpolab evaluates {ckpt} on {len(problems)} held-out problems ({held['dtype']})")
    ours = grpolab_side(ckpt, problems, held["max_new_tokens"], held["dtype"], batch_size)
    model, requests = ours.pop("model"), serve_requests(problems, ours["ids"])
    evaluated_s, results = time.perf_counter() - start, {}
    release_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for stack in stacks:
        t0, extra = time.perf_counter(), {}
        if stack == "gguf":
            served, weights, conversion = _serve_gguf(
                bundle, release, model, requests, ours["prompts"], held["max_new_tokens"], threads, gguf_type, log
            )
            extra = {"gguf": conversion}
        else:
            weights = weights_against(model, bundle)
            log("serving check: plain transformers serves the bundle in a separate process")
            served = serve_with_transformers(bundle, requests, held["max_new_tokens"], threads, batch_size)
        results[stack] = {
            "grpolab_serving": 1,
            "stack": "llama.cpp" if stack == "gguf" else "transformers",
            **extra,
            **_measures(bundle, problems, ours, served, held, release, weights, run_dir),
            "seconds": evaluated_s + time.perf_counter() - t0,
        }
        write_json_atomic(
            release_dir(run_dir) / (SERVING_GGUF_FILE if stack == "gguf" else SERVING_FILE), results[stack]
        )
    return results


def _measures(
    bundle: Path,
    problems: list[Problem],
    ours: dict[str, Any],
    served: dict[str, Any],
    held: dict[str, Any],
    release: dict[str, Any],
    weights: dict[str, Any],
    run_dir: Path,
) -> dict[str, Any]:
    """What serving.json records of one served stack against grpolab's side (module docstring)."""
    rows, task = served["rows"], held["task"]
    ref_scores = score_answers(problems, ours["texts"], [len(i) for i in ours["ids"]], ours["truncated"], task)
    served_scores = score_answers(
        problems,
        [r["text"] for r in rows],
        [len(r["completion_ids"]) for r in rows],
        [not r["stopped"] for r in rows],
        task,
    )
    divergence = divergence_summary(ours["ids"], [r["completion_ids"] for r in rows])
    stop_ids = {"run": sorted(ours["stop_ids"]), "served": served["eos_token_id"]}
    if "declared_end_ids" in served:  # llama.cpp: the file's eos / eot / eom beside every id it ends on
        stop_ids["declared"] = served["declared_end_ids"]
    return {
        "bundle": str(Path(bundle).resolve()),
        "source_run": str(run_dir),
        "checkpoint": release["checkpoint"],
        "release_weights": release["hashes"]["weights"],
        "n": len(problems),
        "task": task,
        "served": {
            k: served[k] for k in ("stack", "dtype", "eos_token_id", "chat_template_sha256", "load_s", "answer_s")
        },
        "precision": {
            "bundle": served["dtype"],
            "evaluated": held["dtype"],
            **({"written": release["precision"]["written"]} if "declared_end_ids" in served else {}),
        },
        "chat_template": {
            "run": (read_manifest(run_dir).get("hashes") or {}).get("chat_template"),
            "served": served["chat_template_sha256"],
        },
        "prompts_identical": sum(p == r["prompt_ids"] for p, r in zip(ours["prompts"], rows)) / len(rows),
        "stop_ids": stop_ids,
        "stop_rule": release.get("stop_rule", "none"),
        "weights": weights,
        "identical_share": divergence["identical_share"],
        "first_divergence": divergence["first_divergence"],
        "logprob_diff": mean_abs_logprob_diff(ours["logprobs"], [r["reference_logprobs"] for r in rows]),
        "truncated": {
            "evaluated": sum(ours["truncated"]) / len(rows),
            "served": sum(not r["stopped"] for r in rows) / len(rows),
        },
        "metric": {
            "name": "accuracy",
            "evaluated": sum(ref_scores) / len(rows),
            "served": sum(served_scores) / len(rows),
            "diff": paired_change(ref_scores, served_scores),
        },
        "examples": [
            {"uid": problems[i].uid, "evaluated": ours["texts"][i], "served": rows[i]["text"]}
            for i in divergence["diverged"][:3]
        ],
    }


__all__ = [
    "RELEASE_FILE",
    "SERVING_FILE",
    "SERVING_GGUF_FILE",
    "STACKS",
    "gguf_file_for",
    "release_dir",
    "run_serving_check",
    "run_serving_checks",
    "serve_with_llama_cpp",
    "serve_with_transformers",
]
