"""Held-out evaluation metrics, deliberately independent of the training reward code.

Answer policy (``extract_final``): the content of the *last* ``\\boxed{...}`` if the
completion has a complete one; otherwise the candidate that *ends last* in the text,
where candidates are LaTeX math spans (``$...$``, ``$$...$$``, ``\\(...\\)``,
``\\[...\\]``; only the part after their last ``=`` is kept), bare ``\\frac{a}{b}`` and
plain numbers (sign, thousands commas, decimals, ``a/b``). Equivalence of the extracted
answer with the gold answer is then decided by ``math_verify`` (sympy), both sides being
wrapped as inline LaTeX. We do not let math_verify pick the answer from the raw text:
its priority rules prefer an early "answer is 10" over a later, final "= 9".
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..tasks.base import Problem
from ..tasks.code import entry_points

if TYPE_CHECKING:
    from ..sandbox import Job

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_SPAN = re.compile(
    r"\$\$(?P<a>.+?)\$\$|\\\[(?P<b>.+?)\\\]|(?<!\\)\$(?P<c>[^$\n]+?)(?<!\\)\$|\\\((?P<d>.+?)\\\)",
    re.DOTALL,
)
_FRAC = re.compile(r"-?\\[dt]?frac\{[^{}]+\}\{[^{}]+\}")
_NUM = re.compile(r"(?<![\w.])(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_PLAIN_NUM = re.compile(r"-?\$?\d(?:[\d,]*\d)?(?:\.\d+)?")
_NUMBER_ONLY = re.compile(r"-?\d+(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (balanced braces), else None."""
    for m in reversed(list(_BOXED.finditer(text))):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end() : i - 1].strip()
    return None


def extract_final(completion: str) -> str | None:
    """The final answer of a completion (policy in the module docstring), or None.

    >>> extract_final("so 4 + 1 = 5.")
    '5'
    >>> extract_final(r"It is \\boxed{\\frac{1}{2}}, not 3")
    '\\\\frac{1}{2}'
    >>> extract_final(r"we get $x = -\\sqrt{2}$.")
    '-\\\\sqrt{2}'
    >>> extract_final("no digits here") is None
    True
    """
    if not isinstance(completion, str):
        return None
    boxed = _last_boxed(completion)
    if boxed:
        return boxed
    best: tuple[int, str] | None = None
    for m in _SPAN.finditer(completion):
        body = next(g for g in m.groups() if g is not None).split("=")[-1].strip()
        if body and (best is None or m.end() >= best[0]):
            best = (m.end(), body)
    for pat in (_FRAC, _NUM):
        for m in pat.finditer(completion):
            if best is None or m.end() > best[0]:
                best = (m.end(), m.group(0))
    return best[1] if best else None


def _timeout() -> int | None:
    # math_verify's timeouts use signal.alarm, which raises ValueError off the main
    # thread; there we run without a timeout (math_verify then logs a warning once).
    return 5 if threading.current_thread() is threading.main_thread() else None


def _mv_parse(s: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    s = s.replace("\\$", "").replace("$", "").replace("\n", " ").strip().rstrip(".").strip()
    if not s:
        return []
    cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse("$" + s + "$", extraction_config=cfg, parsing_timeout=_timeout())


def is_equivalent_answers(answer: str | None, gold: str | None) -> bool:
    """``math_verify.verify(parse(gold), parse(answer))`` on ``$``-wrapped strings.

    Never raises: empty/None input, parse failures and timeouts give False.

    >>> is_equivalent_answers("0.5", r"\\frac{1}{2}"), is_equivalent_answers("3", "4")
    (True, False)
    """
    if not answer or not gold or not isinstance(answer, str) or not isinstance(gold, str):
        return False
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        g, p = _mv_parse(gold), _mv_parse(answer)
        return bool(g and p and verify(g, p, timeout_seconds=_timeout()))
    except (Exception, TimeoutException):
        return False


def is_correct(completion: str, gold: str) -> bool:
    """``is_equivalent_answers(extract_final(completion), gold)``.

    >>> is_correct(r"The answer is \\boxed{\\frac{1}{2}}", "0.5")
    True
    >>> is_correct("which is 10. So, 3 + 6 = 9.", "10")
    False
    """
    return is_equivalent_answers(extract_final(completion), gold)


def held_out_correct(completion: str, problem: Problem) -> bool:
    """The held-out check of one completion: ``is_correct`` (math-verify equivalence), or, for a problem whose task
    has no answer type math-verify can compare (``problem.data["heldout_check"] == "exact"``: reasoning-gym's
    non-numeric answers), the whitespace-normalised string equality of its answer with the gold one.

    >>> held_out_correct(r"\\boxed{0.5}", Problem(uid="p", question="?", answer=r"\\frac{1}{2}"))
    True
    """
    data = problem.data
    if hasattr(data, "get") and data.get("heldout_check") == "exact":
        from ..tasks.reasoning_gym import exact_heldout_correct

        return exact_heldout_correct(extract_final(completion), problem.answer)
    return is_correct(completion, problem.answer)


def _to_number(s: str | None) -> float | None:
    if s is None:
        return None
    s = re.sub(r"\\[!,;]|\\\$|[$,\s]", "", str(s)).rstrip(".")
    return float(s) if _NUMBER_ONLY.fullmatch(s) else None


def _num_eq(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))


def gsm8k_strict(completion: str, gold: str) -> bool:
    """Requested format: the final ``\\boxed{}`` must hold a number equal to gold.

    Commas, ``$`` and spaces are removed before a numeric comparison (tol 1e-6, rel.).

    >>> gsm8k_strict(r"... \\boxed{1,000}", "1000"), gsm8k_strict("1000", "1000")
    (True, False)
    """
    if not isinstance(completion, str):
        return False
    return _num_eq(_to_number(_last_boxed(completion)), _to_number(gold))


def gsm8k_flexible(completion: str, gold: str) -> bool:
    """The last number in the text (lm-eval-harness flexible-extract) equals gold.

    >>> gsm8k_flexible("is 10. So, 3 + 6 = 9.", "9"), gsm8k_flexible("costs $1,200.", "1200")
    (True, True)
    """
    if not isinstance(completion, str):
        return False
    nums = _PLAIN_NUM.findall(completion)
    return bool(nums) and _num_eq(_to_number(nums[-1]), _to_number(gold))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i); ValueError if k > n or args invalid.

    >>> round(pass_at_k(5, 2, 1), 12), round(pass_at_k(5, 2, 2), 12)
    (0.4, 0.7)
    """
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"need k >= 1 and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def maj_at_k(
    answers: Sequence[str | None],
    gold: str,
    equal: Callable[[str, str], bool] = is_equivalent_answers,
) -> bool:
    """Majority vote: cluster non-None answers with ``equal``; the largest cluster wins
    (ties: the cluster seen first); correct iff ``equal(winner, gold)``.

    >>> maj_at_k(["3", "4", "4", "3", None], "3", equal=str.__eq__)
    True
    """
    clusters: list[list] = []  # [representative, count]
    for a in answers:
        if a is None:
            continue
        for cl in clusters:
            if a == cl[0] or equal(a, cl[0]):
                cl[1] += 1
                break
        else:
            clusters.append([a, 1])
    if not clusters:
        return False
    best = max(clusters, key=lambda cl: cl[1])  # max keeps the first of equal counts
    return bool(equal(best[0], gold))


def mean_at_k(correct: Sequence[bool]) -> float:
    """Fraction of the k samples that are correct (mean@k); ValueError if empty."""
    if len(correct) == 0:
        raise ValueError("mean_at_k of an empty list")
    return float(np.mean(np.asarray(correct, dtype=float)))


def bootstrap_indices(n_items: int, n_boot: int = 2000, seed: int = 0):
    """The resampled item indices of a percentile bootstrap, in chunks: arrays of shape (m, n_items) whose rows
    together are n_boot draws of n_items indices uniform on 0..n_items-1 with replacement (numpy
    ``default_rng(seed)``; chunks of at most ~4M indices to bound memory). bootstrap_ci and the hierarchical
    bootstrap over runs (grpolab.evaluation.sets) draw their problems here, so one run reduces to the other exactly."""
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // n_items)
    for s in range(0, n_boot, chunk):
        yield rng.integers(0, n_items, (min(chunk, n_boot - s), n_items))


def bootstrap_ci(
    values: np.ndarray | Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap of the mean, resampling items with replacement.

    lo/hi are the alpha/2 and 1-alpha/2 quantiles of n_boot resampled means (indices from bootstrap_indices).
    grpolab eval reports grpolab.evaluation.intervals.score_interval instead (t, or the studentised bootstrap for
    graded scores): this percentile interval covers 0.91-0.93 for pass@k from more samples than k at 30 problems
    (benchmarks/interval_coverage.py).
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("bootstrap_ci of no values")
    means = np.concatenate([v[idx].mean(axis=1) for idx in bootstrap_indices(v.size, n_boot, seed)])
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(v.mean()), float(lo), float(hi)


def paired_bootstrap_diff(
    a: np.ndarray | Sequence[float],
    b: np.ndarray | Sequence[float],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, lo, hi) of per-item d = b - a, items resampled jointly (paired bootstrap)."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired inputs differ in length: {a.size} vs {b.size}")
    return bootstrap_ci(b - a, n_boot=n_boot, alpha=alpha, seed=seed)


# ------------------------------------------------------------------------------------------- code (held out)
#
# Held-out code scoring. It shares the sandbox with the training reward (grpolab.sandbox: where and how a
# program runs) but none of the scoring: the program is taken from the completion, assembled and judged here.
# A sample is correct iff every test of the problem -- the hidden ones and those shown in the prompt -- passes.

_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[^\n]*$|\Z)", re.MULTILINE | re.DOTALL
)
_FENCE_LANGS = {"", "python", "py", "python3"}


def program_text(completion: str) -> str:
    """The code of a completion for held-out scoring: the body of the first fenced block tagged as Python (or
    untagged), else the whole completion.

    >>> program_text("x\\n```text\\nno\\n```\\n```py\\ndef f():\\n    return 1\\n```")
    'def f():\\n    return 1\\n'
    >>> program_text("def f(): return 2")
    'def f(): return 2'
    """
    for m in _FENCE.finditer(completion):
        if m.group(1).lower() in _FENCE_LANGS:
            return m.group(2)
    return completion


def held_out_job(completion: str, problem: Problem) -> "Job":
    """The sandbox job judging one completion against all of a problem's tests (hidden and shown); the names the
    tests call are bound to the program's even where a builtin has the name (grpolab.tasks.code.entry_points)."""
    from ..sandbox import Job

    data = problem.data
    code = program_text(completion)
    prefix, entry = data.get("prefix") or "", data.get("entry_point") or ""
    if prefix:
        defines = bool(entry) and re.search(r"(?m)^\s*def\s+" + re.escape(entry) + r"\s*\(", code) is not None
        code = prefix + ("\n\n" + code if defines else code)
    cases = tuple(dict.fromkeys([*data["tests"], *(data.get("shown") or ())]))
    return Job(code, cases, data.get("setup") or "", data.get("time_limit_s"), entry_points(problem))


def code_passes(jobs_per_item: Sequence[Sequence["Job"]], limits=None) -> list[list[tuple[bool, str | None]]]:
    """(all tests passed, first failure reason) for every job, run in parallel on the shared sandbox pool; a
    sandbox failure counts as not passed (reason "sandbox")."""
    from ..sandbox import SandboxLimits, shared_pool

    pool = shared_pool(limits or SandboxLimits())
    futures = [[pool.submit(job) for job in jobs] for jobs in jobs_per_item]
    out = []
    for row in futures:
        results = [f.result() for f in row]
        out.append([(r.all_passed, "sandbox" if r.infra_error else r.reason) for r in results])
    return out
