"""Precision by measurement: ``train.precision: auto`` and ``rollout.dtype: auto``, each resolved on its own for
the update (fp32 | bf16 autocast) and for sampling (the sampler's weight copy: float32 | bfloat16):

- an explicit setting always wins (source ``explicit``); fp16 (train.precision) and float16 (rollout.dtype) are
  explicit only, never what ``auto`` picks (``fp16_note`` warns where a CPU lacks fp16 units);
- ``$GRPOLAB_PRECISION`` (``fp32`` or ``bf16``) forces what ``auto`` resolves to, without probing: how the test
  suite runs every training path in both precisions on any machine;
- on a CUDA device: bf16 when ``torch.cuda.is_bf16_supported()``, without probing;
- on a CPU: a probe times fp32 and bf16 products at the model's shapes (``probe_shapes``: the update's MLP product
  within ``MAX_PROBE_FLOP``, decoding's output head out of cache) and picks bf16 when its rate is clearly above
  fp32's, with a hysteresis band (``choose``). Rate: GFLOP/s = 2 * m * n * k / seconds / 1e9 for [m x k] @ [k x n];
  each dtype's seconds are the median of ``REPEATS`` samples alternated with the other dtype (a drift of the machine
  hits both), each sample filling ``SAMPLE_S`` with back-to-back products.

The decision and its numbers are cached per machine (``<cache>/precision.json``, keyed by CPU model, torch version,
thread count and shapes), stored in the manifest under ``precision`` and in the objective card; a resume passes it
back (``recorded``). Measurements and the rule's history: docs/performance.md, "Precision by measurement".
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

from ..errors import GrpolabError

BF16_MARGIN = 1.15
"""A first decision picks bf16 when its measured rate is >= 1.15 x fp32's: below that the gain would not pay for
bf16's rounding (log-ratios of the policy against its sampler drift further apart; docs/performance.md, "Precision by
measurement")."""

HYSTERESIS = (1.05, 1.25)
"""A later measurement of the same shapes (the cache entry lost or made by an older probe) changes a recorded
decision only when it leaves this band around BF16_MARGIN: fp32 -> bf16 at >= 1.25x, bf16 -> fp32 at <= 1.05x.
Inside it the recorded decision stands, so a speedup that sits near the margin cannot flip between probes."""

FORCE_ENV = "GRPOLAB_PRECISION"
"""Environment variable forcing what ``auto`` resolves to: ``fp32`` or ``bf16`` (any other value is an error)."""

TYPICAL_PROMPT_TOKENS = 64
"""Prompt length assumed for the update's token count (the real prompts are not tokenized yet when the probe runs;
the rate barely depends on it once the product is a few hundred rows tall)."""

MAX_PROBE_FLOP = 1e8
"""Each probed product is shrunk (along the longer of its rows and columns) to at most 0.1 GFLOP: the rate of such
a product is already close to the sustained one, and a single product stays short even on a CPU without bf16 units,
where bf16 runs many times slower than fp32 (docs/performance.md, "Precision by measurement")."""

MAX_SAMPLING_WEIGHT_BYTES = 256 * 2**20
"""The sampling probe's fp32 weight matrix holds at most 256 MiB, and otherwise the model's whole output head. A
decode step reads every weight once per token, so its products are bound by memory, not arithmetic: a head cut to a
FLOP budget sits in the caches and hides bf16's halved bytes (docs/performance.md, "Precision by measurement": the
sampling probe measured out of cache)."""

SAMPLE_S = 0.02
"""Minimum measuring time of one sample: products are repeated back to back until it is filled."""

REPEATS = 5
"""Samples per dtype and use; the median is the rate."""

DTYPE_BUDGET_S = 1.0
"""A dtype stops collecting samples (after the first) once its samples of one use took this long: a product that
runs far slower (bf16 without bf16 units) is still measured, without stretching the probe to many seconds."""

WARMUP_REPS = 2
CACHE_FILE = "precision.json"
UPDATE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}  # train.precision values per kind
SAMPLING = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # rollout.dtype values per kind
AUTO_KINDS = ("fp32", "bf16")  # what auto can resolve to: fp16 is explicit only


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


def streaming_shape(m: int, k: int, n: int, max_bytes: int = MAX_SAMPLING_WEIGHT_BYTES) -> list[int]:
    """[m, k, n] with n reduced (never below 1) so that the fp32 [k x n] weight holds at most max_bytes.

    >>> streaming_shape(8, 576, 49152), streaming_shape(8, 3584, 152064)
    ([8, 576, 49152], [8, 3584, 18724])
    """
    return [m, k, max(1, min(n, max_bytes // (4 * k)))]


def probe_shapes(
    hidden: int, intermediate: int, vocab: int, micro_batch_size: int, max_new_tokens: int, group_size: int
) -> dict[str, list[int]]:
    """The [m, k, n] product measured for each use: the update's MLP product on a micro-batch's tokens (within
    ``MAX_PROBE_FLOP``) and the decoder's output head on one token per completion of a group (its weight out of
    cache: ``streaming_shape``)."""
    tokens = micro_batch_size * (TYPICAL_PROMPT_TOKENS + max_new_tokens)
    return {
        "update": fit_to_budget(tokens, hidden, intermediate),
        "sampling": streaming_shape(group_size, hidden, vocab),
    }


def model_dims(model: torch.nn.Module) -> tuple[int, int, int]:
    """(hidden, intermediate, vocab) of a causal LM: the input embedding's shape, and the config's
    intermediate_size (4 x hidden when the config has none)."""
    vocab, hidden = model.get_input_embeddings().weight.shape
    intermediate = (
        getattr(model.config, "intermediate_size", None) or getattr(model.config, "n_inner", None) or 4 * hidden
    )
    return int(hidden), int(intermediate), int(vocab)


# ----------------------------------------------------------------------------------------------- measuring


def gflops(m: int, k: int, n: int, seconds: float) -> float:
    """Rate of one [m x k] @ [k x n] product that took `seconds`: 2 * m * n * k / seconds / 1e9.

    >>> gflops(1000, 1000, 1000, 0.5)
    4.0
    """
    return 2 * m * n * k / seconds / 1e9 if seconds > 0 else 0.0


def sample_seconds(m: int, k: int, n: int, dtype: torch.dtype, min_s: float = SAMPLE_S) -> float:
    """Seconds per [m x k] @ [k x n] product in `dtype` on the CPU: products repeated back to back until `min_s`
    has passed, total time / count (at least one product). inf when the dtype's product fails on this machine."""
    a, b = torch.full((m, k), 0.5, dtype=dtype), torch.full((k, n), 0.25, dtype=dtype)  # no RNG: the run's is untouched
    count, start = 0, time.perf_counter()
    try:
        while True:
            torch.matmul(a, b)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                return elapsed / count
    except RuntimeError:
        return float("inf")


def time_pair(m: int, k: int, n: int, timer: Callable[..., float] = sample_seconds) -> dict[torch.dtype, float]:
    """Median seconds per product of fp32 and bf16: WARMUP_REPS untimed samples each, then up to REPEATS samples
    taken alternately (fp32, bf16, fp32, ...), a dtype stopping early once its samples passed DTYPE_BUDGET_S."""
    dtypes = (torch.float32, torch.bfloat16)
    for dtype in dtypes:
        for _ in range(WARMUP_REPS):
            if timer(m, k, n, dtype) == float("inf"):
                break
    samples: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    for _ in range(REPEATS):
        for dtype in dtypes:
            if sum(samples[dtype]) < DTYPE_BUDGET_S:
                samples[dtype].append(timer(m, k, n, dtype))
    return {d: statistics.median(v) for d, v in samples.items()}


def measure(shapes: dict[str, list[int]], timer: Callable[..., float] = sample_seconds) -> dict[str, dict[str, Any]]:
    """Per use: its shape, fp32 and bf16 GFLOP/s (median samples, ``time_pair``), and bf16's speedup."""
    out = {}
    for use, (m, k, n) in shapes.items():
        seconds = time_pair(m, k, n, timer)
        fp32, bf16 = gflops(m, k, n, seconds[torch.float32]), gflops(m, k, n, seconds[torch.bfloat16])
        out[use] = {
            "shape": [m, k, n],
            "fp32_gflops": round(fp32, 2),
            "bf16_gflops": round(bf16, 2),
            "speedup": round(bf16 / fp32, 3) if fp32 > 0 else 0.0,
        }
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


FP16_FLAGS = ("avx512_fp16", "amx_fp16")
"""/proc/cpuinfo flags of CPUs that multiply float16 natively (Sapphire Rapids and later; no AMD CPU so far)."""


def cpu_has_fp16_units(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """The CPU multiplies float16 natively: an FP16_FLAGS flag in /proc/cpuinfo, or AMX-FP16 as torch reports it."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    amx = getattr(torch.cpu, "_is_amx_fp16_supported", None)
    return any(flag in flags for flag in FP16_FLAGS) or bool(amx is not None and amx())


def fp16_note(update: str, sampling: str, device: torch.device | str, has_units: bool | None = None) -> str | None:
    """The warning for an fp16 update (`update` 'fp16') or sampler (`sampling` 'float16') on a CPU without fp16
    units (`has_units`: None = cpu_has_fp16_units()), else None. Not an error: the numbers are right, and such a run
    reproduces a GPU's fp16 numerics (tests, benchmarks/precision_mismatch.py); it is slow, since every fp16 product
    there is converted (docs/performance.md, "fp16": on an AMD EPYC with AVX2 a bare fp16 product ran at 0.05-0.09x
    fp32's rate, a linear layer under fp16 autocast at 0.2x)."""
    fields = ["train.precision fp16"] * (update == "fp16") + ["rollout.dtype float16"] * (sampling == "float16")
    if not fields or torch.device(device).type != "cpu":
        return None
    if cpu_has_fp16_units() if has_units is None else has_units:
        return None
    return (
        f"{' and '.join(fields)} on a CPU without fp16 units (AVX512-FP16 or AMX-FP16): fp16 products are converted "
        'there and run 5-20x slower than fp32 (docs/performance.md, "fp16"); fp32 is faster on this CPU, fp16 pays on '
        "a GPU or a CPU with fp16 units"
    )


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


def _recorded_decision(entry: object) -> dict[str, str]:
    """The decision a cache entry holds: its ``decision``, or for an entry of an older probe (numbers only) what
    BF16_MARGIN made of its numbers; {} for none."""
    if not isinstance(entry, dict):
        return {}
    if isinstance(entry.get("decision"), dict):
        return dict(entry["decision"])
    products = entry.get("products") if isinstance(entry.get("products"), dict) else {}
    return {use: choose(p.get("speedup", 0.0)) for use, p in products.items() if isinstance(p, dict)}


def probe(
    shapes: dict[str, list[int]], timer: Callable[..., float] = sample_seconds, refresh: bool = False
) -> dict[str, Any]:
    """The probe's decision and numbers for these shapes on this machine: from the cache when it holds a decision
    (``cached: true``) unless `refresh`, else measured (``measure``), decided (``choose``, with the hysteresis
    around the decision the cache held, if any) and written to it atomically (an unwritable cache only costs a
    re-measurement)."""
    from ..models.load import cache_dir  # transformers: imported only when a probe runs

    key, path = cache_key(shapes), cache_dir() / CACHE_FILE
    old = _read_cache(path).get(key)
    if not refresh and isinstance(old, dict) and "products" in old and isinstance(old.get("decision"), dict):
        return {"key": key, "cached": True, **old}
    previous = _recorded_decision(old)
    t0 = time.perf_counter()
    products = measure(shapes, timer)
    decision = {use: choose(p["speedup"], previous.get(use)) for use, p in products.items()}
    entry = {
        "products": products,
        "decision": decision,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "probe_s": round(time.perf_counter() - t0, 3),
        **({"previous_decision": previous} if previous else {}),
    }
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


def choose(
    s: float, previous: str | None = None, margin: float = BF16_MARGIN, band: tuple[float, float] = HYSTERESIS
) -> str:
    """'bf16' or 'fp32' from bf16's measured speedup s = bf16 rate / fp32 rate (0 when fp32 has no rate). A first
    decision (`previous` None): bf16 when s >= margin. Against a previous decision, the hysteresis band (lo, hi):
    fp32 becomes bf16 only at s >= hi, bf16 becomes fp32 only at s <= lo; inside the band the previous decision
    stands.

    >>> choose(1.3), choose(1.05), choose(0.0)
    ('bf16', 'fp32', 'fp32')
    >>> choose(1.2, "bf16"), choose(1.2, "fp32"), choose(1.25, "fp32"), choose(1.04, "bf16")
    ('bf16', 'fp32', 'bf16', 'fp32')
    """
    if previous == "fp32":
        return "bf16" if s >= band[1] else "fp32"
    if previous == "bf16":
        return "fp32" if s <= band[0] else "bf16"
    return "bf16" if s >= margin else "fp32"


def forced() -> str | None:
    """'fp32' / 'bf16' forced by ``$GRPOLAB_PRECISION`` (either spelling), None when unset or empty."""
    value = os.environ.get(FORCE_ENV, "").strip()
    if not value:
        return None
    if _kind(value) not in AUTO_KINDS:
        raise GrpolabError(f"{FORCE_ENV}: expected fp32 or bf16 (or unset), got {value!r}")
    return _kind(value)


def _kind(setting: str) -> str | None:
    """'fp32' / 'bf16' / 'fp16' of an explicit setting (either spelling), None for 'auto'."""
    spellings = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
    return {**spellings, "fp16": "fp16", "float16": "fp16"}.get(setting)


def resolve(
    update: str,
    sampling: str,
    device: torch.device | str,
    shapes: dict[str, list[int]] | None = None,
    recorded: dict[str, Any] | None = None,
    run_probe: Callable[[dict[str, list[int]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The resolution of train.precision (`update`) and rollout.dtype (`sampling`):
    ``{"update": "fp32"|"bf16", "sampling": "float32"|"bfloat16", "setting": {...}, "source": str, "probe": ...}``.

    `recorded` (a resumed run's manifest ``precision``) is returned unchanged when its settings are these; else an
    ``auto`` it resolved keeps its recorded choice. Explicit settings win; on CUDA: bf16 when supported; on a CPU
    ``$GRPOLAB_PRECISION`` forces it; else on a CPU the probe (``run_probe``, default ``probe``) decides."""
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
    if auto and forced():
        for use in auto:
            kinds[use], sources[use] = forced(), f"auto: forced by {FORCE_ENV}={forced()}"
    elif auto and dev.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        for use in auto:
            kinds[use] = "bf16" if ok else "fp32"
            sources[use] = f"auto: CUDA device {'supports' if ok else 'does not support'} bf16"
    elif auto and dev.type == "cpu":
        if shapes is None:
            raise ValueError("resolve: the probe needs the model's shapes")
        probed = {**(run_probe or probe)(shapes), "margin": BF16_MARGIN, "hysteresis": list(HYSTERESIS)}
        for use in auto:
            p = probed["products"][use]
            kinds[use] = (probed.get("decision") or {}).get(use) or choose(p["speedup"])
            sources[use] = f"auto: probe, bf16 {p['speedup']}x fp32 -> {kinds[use]} (docs/performance.md)"
    else:
        for use in auto:
            kinds[use], sources[use] = "fp32", f"auto: no probe for device type {dev.type}"
    source = (
        sources["update"]
        if sources["update"] == sources["sampling"]
        else f"update {sources['update']}; sampling {sources['sampling']}"
    )
    return {
        "update": UPDATE[kinds["update"]],
        "sampling": SAMPLING[kinds["sampling"]],
        "setting": setting,
        "source": source,
        **({"probe": probed} if probed else {}),
    }


def resolve_update(setting: str, model: torch.nn.Module, batch_size: int, new_tokens: int) -> dict[str, Any]:
    """The resolution of a baseline's update precision (SFT, DPO: no sampler of their own to resolve): `setting`
    ('fp32' / 'bf16' as given, 'auto' by the probe on a CPU, as the trainer resolves train.precision), for a model
    trained on micro-batches of `batch_size` sequences of about `new_tokens` target tokens."""
    if setting != "auto" and _kind(setting) not in AUTO_KINDS:
        raise GrpolabError(
            f"precision: expected fp32, bf16 or auto, got {setting!r} (fp16 is the GRPO update's only: it needs the "
            "loss scaling of grpolab/training/loss_scale.py)"
        )
    shapes = probe_shapes(*model_dims(model), batch_size, new_tokens, 1)
    return resolve(setting, "fp32", next(model.parameters()).device, shapes)


RANK_INVARIANCE = {
    "float32": "yes: 1 and N processes sample the same tokens (tests/test_distributed.py; docs/scaling.md)",
    "bfloat16": "no: bf16 rounding depends on each rank's decode batch shape, so 1 and N processes sample different "
    "tokens once it flips one (measured; docs/scaling.md); set rollout.dtype: float32 for that promise",
    "float16": "no: as bfloat16 (half-precision rounding depends on each rank's decode batch shape); set "
    "rollout.dtype: float32 for that promise",
}
"""Whether the samples of 1 and N data-parallel processes agree, by the sampler's dtype (what the card shows)."""


def card_entry(resolution: dict[str, Any]) -> dict[str, str]:
    """What the objective card shows of a resolution: the choices, their source, and whether samples are the same
    whatever the number of processes (RANK_INVARIANCE)."""
    # grpolab/training/attention.py
    attention = {"attention": resolution["attention"]} if "attention" in resolution else {}
    ranks = (
        {"rank_invariant_samples": RANK_INVARIANCE[resolution["sampling"]]}
        if resolution["sampling"] in RANK_INVARIANCE
        else {}
    )
    return {
        "update": resolution["update"],
        "sampling": resolution["sampling"],
        "source": resolution["source"],
        **attention,
        **ranks,
    }


def unresolved(update: str, sampling: str) -> dict[str, Any]:
    """The resolution of a config no trainer has resolved yet: explicit settings as they are, ``auto`` left open."""
    setting = {"update": update, "sampling": sampling}
    explicit = all(_kind(s) for s in setting.values())
    return {
        "update": update,
        "sampling": sampling,
        "setting": setting,
        "source": "explicit" if explicit else "auto: resolved when the trainer is built",
    }
