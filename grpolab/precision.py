"""Precision by measurement: ``train.precision: auto`` and ``rollout.dtype: auto`` (docs/performance.md).

The rule, applied separately to the update (train.precision: fp32 | bf16 autocast) and to sampling (rollout.dtype
of the sampler's weight copy: float32 | bfloat16):

- an explicit setting always wins (source ``explicit``);
- on a CUDA device: bf16 when ``torch.cuda.is_bf16_supported()``, without probing;
- on a CPU: a short probe times this machine's fp32 and bf16 matrix products at the model's shapes and picks bf16
  only when its rate is at least ``BF16_MARGIN`` times fp32's.

The probe measures one product per use: the update's ``[tokens x hidden] @ [hidden x intermediate]`` (tokens =
micro_batch_size x (TYPICAL_PROMPT_TOKENS + max_new_tokens)) and decoding's ``[group_size x hidden] @ [hidden x
vocab]`` (one new token for each completion of a group), each shrunk to at most ``MAX_PROBE_FLOP``. Its rate is
GFLOP/s = 2 * m * n * k / seconds / 1e9 for an [m x k] @ [k x n] product, with the best of ``TIMED_REPS`` timed
repetitions after ``WARMUP_REPS`` warm-up ones (fewer when they would overrun ``PRODUCT_BUDGET_S``). The result
is cached per machine in ``<cache>/precision.json`` (``$GRPOLAB_CACHE`` or ``~/.cache/grpolab``), keyed by CPU
model, torch version, thread count and the shapes, so it is measured once. The resolution (a plain dict, see ``resolve``) is stored in the run's manifest under
``precision`` and in the objective card's choices; a resume passes it back (``recorded``) instead of re-probing.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from typing import Any, Callable

import torch

from .errors import GrpolabError

BF16_MARGIN = 1.15
"""bf16 is chosen only when its measured rate is >= 1.15 x fp32's: below that the gain is within the noise of a
short probe on a shared machine, and it would not pay for bf16's rounding (log-ratios of the policy against its
sampler drift further apart; docs/performance.md)."""

TYPICAL_PROMPT_TOKENS = 64
"""Prompt length assumed for the update's token count (the real prompts are not tokenized yet when the probe runs;
the rate barely depends on it once the product is a few hundred rows tall)."""

MAX_PROBE_FLOP = 1e8
"""Each probed product is shrunk (along the longer of its rows and columns) to at most 0.1 GFLOP: the rate of such
a product is already close to the sustained one, and a single product stays short (~0.3 s) even where bf16 runs
30-60x slower than fp32 (CPUs without bf16 units, measured in docs/performance.md)."""

PRODUCT_BUDGET_S = 0.25
"""Repetitions of one product stop when the next would end past 0.25 s, so the probe (2 uses x 2 dtypes) stays
around a second. A product too slow for any timed repetition is rated by its last warm-up, which can only
under-rate it, so a budget cut never tips the choice towards bf16."""

WARMUP_REPS, TIMED_REPS = 2, 3
CACHE_FILE = "precision.json"
UPDATE = {"fp32": "fp32", "bf16": "bf16"}  # train.precision values per kind
SAMPLING = {"fp32": "float32", "bf16": "bfloat16"}  # rollout.dtype values per kind


# ----------------------------------------------------------------------------------------------- shapes


def fit_to_budget(m: int, k: int, n: int, max_flop: float = MAX_PROBE_FLOP) -> list[int]:
    """[m, k, n] with the longer of m and n (then the other) reduced so that 2 * m * k * n <= max_flop; never
    below 1. The update keeps its hidden sizes and loses tokens; decoding keeps its rows and loses vocabulary.

    >>> fit_to_budget(1792, 576, 1536), fit_to_budget(8, 576, 49152), fit_to_budget(8, 4096, 152064)
    ([56, 576, 1536], [8, 576, 10850], [8, 4096, 1525])
    """
    def cut(x: int, y: int) -> int:  # x so that 2 * x * k * y <= max_flop
        return max(1, min(x, int(max_flop // (2 * k * y))))

    if m >= n:
        m = cut(m, n)
        n = cut(n, m)
    else:
        n = cut(n, m)
        m = cut(m, n)
    return [m, k, n]


def probe_shapes(hidden: int, intermediate: int, vocab: int, micro_batch_size: int, max_new_tokens: int,
                 group_size: int) -> dict[str, list[int]]:
    """The [m, k, n] product measured for each use: the update's MLP product on a micro-batch's tokens and the
    decoder's output head on one token per completion of a group (both within ``MAX_PROBE_FLOP``)."""
    tokens = micro_batch_size * (TYPICAL_PROMPT_TOKENS + max_new_tokens)
    return {"update": fit_to_budget(tokens, hidden, intermediate), "sampling": fit_to_budget(group_size, hidden, vocab)}


def model_dims(model: torch.nn.Module) -> tuple[int, int, int]:
    """(hidden, intermediate, vocab) of a causal LM: the input embedding's shape, and the config's
    intermediate_size (4 x hidden when the config has none)."""
    vocab, hidden = model.get_input_embeddings().weight.shape
    intermediate = getattr(model.config, "intermediate_size", None) or getattr(model.config, "n_inner", None) or 4 * hidden
    return int(hidden), int(intermediate), int(vocab)


# ----------------------------------------------------------------------------------------------- measuring


def gflops(m: int, k: int, n: int, seconds: float) -> float:
    """Rate of one [m x k] @ [k x n] product that took `seconds`: 2 * m * n * k / seconds / 1e9.

    >>> gflops(1000, 1000, 1000, 0.5)
    4.0
    """
    return 2 * m * n * k / seconds / 1e9 if seconds > 0 else 0.0


def time_product(m: int, k: int, n: int, dtype: torch.dtype, budget_s: float = PRODUCT_BUDGET_S) -> float:
    """Seconds of one [m x k] @ [k x n] product in `dtype` on the CPU: the best of TIMED_REPS after WARMUP_REPS,
    cut short when the next repetition would end past `budget_s` (then the last one done counts, see
    PRODUCT_BUDGET_S); inf when the dtype's product fails on this machine."""
    a, b = torch.full((m, k), 0.5, dtype=dtype), torch.full((k, n), 0.25, dtype=dtype)  # no RNG: the run's is untouched
    timed: list[float] = []
    start = time.perf_counter()
    try:
        for i in range(WARMUP_REPS + TIMED_REPS):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            last = time.perf_counter() - t0
            if i >= WARMUP_REPS:
                timed.append(last)
            if time.perf_counter() - start + last > budget_s:
                break
    except RuntimeError:
        return float("inf")
    return min(timed) if timed else last


def measure(shapes: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """Per use: its shape, fp32 and bf16 GFLOP/s, and bf16's speedup (bf16 rate / fp32 rate)."""
    out = {}
    for use, (m, k, n) in shapes.items():
        fp32 = gflops(m, k, n, time_product(m, k, n, torch.float32))
        bf16 = gflops(m, k, n, time_product(m, k, n, torch.bfloat16))
        out[use] = {"shape": [m, k, n], "fp32_gflops": round(fp32, 2), "bf16_gflops": round(bf16, 2),
                    "speedup": round(bf16 / fp32, 3) if fp32 > 0 else 0.0}
    return out


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_key(shapes: dict[str, list[int]], threads: int | None = None) -> str:
    """What a cached probe is valid for: CPU model, torch version, intra-op threads and the probed shapes."""
    threads = torch.get_num_threads() if threads is None else threads
    dims = ", ".join(f"{use} {'x'.join(map(str, s))}" for use, s in sorted(shapes.items()))
    return f"{cpu_name()} | torch {torch.__version__} | {threads} threads | {dims}"


def _read_cache(path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def probe(shapes: dict[str, list[int]]) -> dict[str, Any]:
    """The probe's numbers for these shapes on this machine: from the cache when present (``cached: true``), else
    measured and written to it (atomically; an unwritable cache only costs a re-measurement next time)."""
    from .models import cache_dir  # transformers: imported only when a probe runs

    key, path = cache_key(shapes), cache_dir() / CACHE_FILE
    entries = _read_cache(path)
    if isinstance(entries.get(key), dict) and "products" in entries[key]:
        return {"key": key, "cached": True, **entries[key]}
    t0 = time.perf_counter()
    entry = {"products": measure(shapes), "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    entry["probe_s"] = round(time.perf_counter() - t0, 3)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".precision-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({**_read_cache(path), key: entry}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
    return {"key": key, "cached": False, **entry}


# ----------------------------------------------------------------------------------------------- the rule


def choose(fp32_gflops: float, bf16_gflops: float, margin: float = BF16_MARGIN) -> str:
    """'bf16' when bf16's rate is at least `margin` times fp32's, else 'fp32'.

    >>> choose(100, 130), choose(100, 105), choose(0, 0)
    ('bf16', 'fp32', 'fp32')
    """
    return "bf16" if fp32_gflops > 0 and bf16_gflops >= margin * fp32_gflops else "fp32"


def _kind(setting: str) -> str | None:
    """'fp32' / 'bf16' of an explicit setting (either spelling), None for 'auto'."""
    return {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}.get(setting)


def resolve(update: str, sampling: str, device: torch.device | str, shapes: dict[str, list[int]] | None = None,
            recorded: dict[str, Any] | None = None,
            run_probe: Callable[[dict[str, list[int]]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The resolution of train.precision (`update`) and rollout.dtype (`sampling`):
    ``{"update": "fp32"|"bf16", "sampling": "float32"|"bfloat16", "setting": {...}, "source": str, "probe": ...}``.

    `recorded` (a resumed run's manifest ``precision``) is returned unchanged when its settings are these; else an
    ``auto`` it resolved keeps its recorded choice. Explicit settings win; on CUDA: bf16 when supported; on a CPU
    the probe (``run_probe``, default ``probe``) decides with ``choose``."""
    setting = {"update": update, "sampling": sampling}
    if recorded and recorded.get("setting") == setting:
        return recorded
    kinds = {use: _kind(s) for use, s in setting.items()}
    sources = {use: "explicit" for use, k in kinds.items() if k}
    probed = None
    for use in [u for u, k in kinds.items() if k is None]:
        if recorded and (recorded.get("setting") or {}).get(use) == "auto" and use in recorded:
            kinds[use], sources[use] = _kind(recorded[use]), "auto: recorded by the run"
            probed = recorded.get("probe")  # the numbers that choice was made on
    auto = [u for u, k in kinds.items() if k is None]
    dev = torch.device(device)
    if auto and dev.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        for use in auto:
            kinds[use] = "bf16" if ok else "fp32"
            sources[use] = f"auto: CUDA device {'supports' if ok else 'does not support'} bf16"
    elif auto and dev.type == "cpu":
        if shapes is None:
            raise ValueError("resolve: the probe needs the model's shapes")
        probed = {**(run_probe or probe)(shapes), "margin": BF16_MARGIN}
        for use in auto:
            p = probed["products"][use]
            kinds[use] = choose(p["fp32_gflops"], p["bf16_gflops"])
            sources[use] = (f"auto: probe, bf16 {p['speedup']}x fp32 "
                            f"({'>=' if kinds[use] == 'bf16' else '<'} {BF16_MARGIN}x)")
    else:
        for use in auto:
            kinds[use], sources[use] = "fp32", f"auto: no probe for device type {dev.type}"
    source = sources["update"] if sources["update"] == sources["sampling"] else \
        f"update {sources['update']}; sampling {sources['sampling']}"
    return {"update": UPDATE[kinds["update"]], "sampling": SAMPLING[kinds["sampling"]], "setting": setting,
            "source": source, **({"probe": probed} if probed else {})}


def resolve_update(setting: str, model: torch.nn.Module, batch_size: int, new_tokens: int) -> dict[str, Any]:
    """The resolution of a baseline's update precision (SFT, DPO: no sampler of their own to resolve): `setting`
    ('fp32' / 'bf16' as given, 'auto' by the probe on a CPU, as the trainer resolves train.precision), for a model
    trained on micro-batches of `batch_size` sequences of about `new_tokens` target tokens."""
    if setting != "auto" and _kind(setting) is None:
        raise GrpolabError(f"precision: expected fp32, bf16 or auto, got {setting!r}")
    shapes = probe_shapes(*model_dims(model), batch_size, new_tokens, 1)
    return resolve(setting, "fp32", next(model.parameters()).device, shapes)


def card_entry(resolution: dict[str, Any]) -> dict[str, str]:
    """What the objective card shows of a resolution: the choices and their source."""
    attention = {"attention": resolution["attention"]} if "attention" in resolution else {}  # grpolab/attention.py
    return {"update": resolution["update"], "sampling": resolution["sampling"], "source": resolution["source"], **attention}


def unresolved(update: str, sampling: str) -> dict[str, Any]:
    """The resolution of a config no trainer has resolved yet: explicit settings as they are, ``auto`` left open."""
    setting = {"update": update, "sampling": sampling}
    explicit = all(_kind(s) for s in setting.values())
    return {"update": update, "sampling": sampling, "setting": setting,
            "source": "explicit" if explicit else "auto: resolved when the trainer is built"}
