"""Preference pairs for reward-model training: read from JSONL, or built from a task's own samples and its verifier.

JSONL: one object per line with string fields ``prompt`` (the user turn), ``chosen`` and ``rejected`` (two answers
to it, the first preferred), and optionally ``uid`` (the prompt's problem); anything else on the row is ignored.
A row without a uid gets ``prompt_uid(prompt)``, a hash of the normalised prompt (lower case, runs of white space
as one space), so the pairs of one prompt are split and bootstrapped together. A bad row is a DataError naming the
file, the row (1-based line number) and the field.

From a task: a model samples G completions for each of N training problems (never the held-out split), the task's
verifier (the ``correct`` reward; ``all_pass`` for code problems) marks each right or wrong, and within every problem
the k-th distinct correct completion is paired with the k-th distinct wrong one (correct preferred), at most
``max_pairs`` per problem -- the rule DPO pairs are built by. Problems whose samples are all right or all wrong give
no pair. ``check_disjoint`` refuses pairs whose prompt is a held-out problem.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import DataError
from ..manifest import normalise_problem_text, sha256_bytes
from ..tasks.base import Problem
from ..tasks.jsonl import read_jsonl

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One preference: `chosen` is a better answer to `prompt` than `rejected`. `uid` names the prompt's problem
    (``prompt_uid`` of the prompt for a JSONL row without one): pairs of one uid are split together."""

    prompt: str
    chosen: str
    rejected: str
    uid: str = ""


def prompt_uid(prompt: str) -> str:
    """The uid of a prompt's pairs when the data gives none: "prompt-" + sha256 of the normalised prompt[:16].

    >>> prompt_uid("What is 2+2?") == prompt_uid("  what is   2+2?\\n") != prompt_uid("What is 2+3?")
    True
    """
    return "prompt-" + sha256_bytes(normalise_problem_text(prompt).encode())[:16]


def load_pairs_jsonl(path: str | Path) -> list[PreferencePair]:
    """Every pair of a JSONL file (module docstring); DataError naming file, row and field for a bad row."""
    p = Path(path)
    pairs = []
    for row, obj in read_jsonl(p, "JSONL rows with prompt, chosen, rejected"):
        for name in FIELDS:
            value = obj.get(name)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{p}: row {row}: field '{name}': expected a non-empty string, got {value!r:.60}")
        if obj["chosen"] == obj["rejected"]:
            raise DataError(f"{p}: row {row}: field 'rejected': identical to 'chosen' (a pair needs two answers)")
        uid = obj.get("uid")
        uid = str(uid) if uid not in (None, "") else prompt_uid(obj["prompt"])
        pairs.append(PreferencePair(obj["prompt"], obj["chosen"], obj["rejected"], uid))
    if not pairs:
        raise DataError(f"{p}: no preference pairs (expected JSONL rows with {', '.join(FIELDS)})")
    return pairs


def write_pairs_jsonl(pairs: Sequence[PreferencePair], path: Path) -> None:
    path.write_text("".join(json.dumps(asdict(q)) + "\n" for q in pairs), encoding="utf-8")


def pairs_hash(pairs: Sequence[PreferencePair]) -> str:
    """sha256 of every pair's fields, in order."""
    return sha256_bytes(json.dumps([asdict(q) for q in pairs], sort_keys=True).encode())


def pairs_from_verdicts(
    prompt: str, uid: str, completions: Sequence[str], correct: Sequence[bool], max_pairs: int
) -> list[PreferencePair]:
    """The k-th distinct correct completion paired with the k-th distinct wrong one, k < max_pairs.

    >>> [(q.chosen, q.rejected) for q in pairs_from_verdicts("p", "u", ["a", "b", "a", "c", "d"],
    ...                                                     [True, False, True, True, False], 4)]
    [('a', 'b'), ('c', 'd')]
    """
    right = list(dict.fromkeys(c for c, ok in zip(completions, correct) if ok))
    wrong = list(dict.fromkeys(c for c, ok in zip(completions, correct) if not ok))
    return [PreferencePair(prompt, c, w, uid) for c, w in list(zip(right, wrong))[:max_pairs]]


def training_problems(task, num_problems: int, seed: int) -> list[Problem]:
    """`num_problems` problems of the task's TRAIN split, drawn with `seed` (all of them when there are fewer)."""
    problems = list(task.problems("train"))
    if not problems:
        raise DataError("the task has no training problems to build preference pairs from")
    random.Random(seed).shuffle(problems)
    return problems[:num_problems]


def check_disjoint(pairs: Sequence[PreferencePair], held_out: Sequence[Problem]) -> int:
    """The number of held-out problems checked; DataError when a pair's prompt is one of them (the reward model
    must never see a held-out problem, or the held-out metric stops being independent of the reward)."""
    from ..tasks import render_prompt

    held = {normalise_problem_text(render_prompt(p)): p.uid for p in held_out}
    for q in pairs:
        uid = held.get(normalise_problem_text(q.prompt))
        if uid is not None:
            raise DataError(
                f"preference pair of {q.uid or q.prompt[:40]!r}: its prompt is the held-out problem {uid!r}; "
                "a reward model must be trained on training problems only"
            )
    return len(held)


Generate = Callable[[list[Problem]], list[list[str]]]


def verify(problem: Problem, completions: Sequence[str]) -> list[bool]:
    """The task's verifier on each completion: the `correct` reward (code problems: `all_pass`) equals 1."""
    from ..rewards import RewardSet
    from ..tasks.code import is_code_problem

    name = "all_pass" if is_code_problem(problem) else "correct"
    results = RewardSet({name: 1.0}).score_many(list(completions), [problem] * len(completions))
    return [not r.invalid and r.components[name] >= 1.0 for r in results]


def task_pairs(
    problems: Sequence[Problem], generate: Generate, max_pairs: int
) -> tuple[list[PreferencePair], dict[str, Any]]:
    """(pairs, summary) from `generate(problems) -> G completions per problem` and the verifier (module docstring)."""
    from ..tasks import render_prompt

    samples = generate(list(problems))
    pairs: list[PreferencePair] = []
    n_correct = n_total = mixed = 0
    for problem, completions in zip(problems, samples):
        correct = verify(problem, completions)
        n_correct, n_total = n_correct + sum(correct), n_total + len(correct)
        found = pairs_from_verdicts(render_prompt(problem), problem.uid, completions, correct, max_pairs)
        mixed += bool(found)
        pairs += found
    return pairs, {
        "problems": len(problems),
        "samples": n_total,
        "sample_accuracy": n_correct / max(1, n_total),
        "problems_with_pairs": mixed,
        "pairs": len(pairs),
    }


def split_by_prompt(pairs: Sequence[PreferencePair], val_fraction: float, seed: int) -> tuple[list, list]:
    """(train, validation) pairs; whole prompts (uids) go to one side, a `val_fraction` share of them (at least one
    when there are two or more) to validation, drawn with `seed`."""
    uids = list(dict.fromkeys(q.uid for q in pairs))
    random.Random(seed).shuffle(uids)
    n_val = min(len(uids) - 1, max(1, round(val_fraction * len(uids)))) if len(uids) > 1 and val_fraction > 0 else 0
    val_uids = set(uids[:n_val])
    return [q for q in pairs if q.uid not in val_uids], [q for q in pairs if q.uid in val_uids]
