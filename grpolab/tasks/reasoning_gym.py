"""reasoning-gym's procedural generators as grpolab tasks: ``task.name: reasoning_gym:<generator>``.

Rules:
- The generator is one of reasoning-gym's registered datasets (``reasoning_gym.create_dataset(<generator>, ...)``);
  an unknown name is a ConfigError listing the close names. The task's options are the generator's own config
  fields (e.g. chain_sum's ``min_terms``, ``max_digits``), passed to ``create_dataset`` unchanged, plus ``seed``
  (0..MAX_SEED), ``num_train`` and ``num_test``. ``size`` is not an option (num_train / num_test are), and an option
  the generator's config does not have is a ConfigError listing the ones it has.
- Disjoint seeds: reasoning-gym draws item ``idx`` of a dataset with seed ``s`` from ``Random(s + idx)``. For task
  seed ``k`` the held-out items use the item seeds ``k * SEED_STRIDE + [0, SPLIT_SPAN)`` and the training items
  ``k * SEED_STRIDE + SPLIT_SPAN + [0, SPLIT_SPAN)``: the two splits never share an item seed, nor does any split of
  one task seed share one with any split of another.
- Disjoint text: a generator with a small problem space draws the same question from different seeds. Questions
  are compared as ``normalise_problem_text`` (lower case, runs of whitespace as one space: the identity the
  manifest's ``train_problem_hashes`` and the held-out overlap refusal use). Within a split a repeat is skipped;
  a training question equal to a held-out one is removed from training (the distinct ones counted in
  ``removed_overlap``) and the next item is drawn instead. Removed from training, not an error: such overlaps come
  from the generator's problem space, not from a user's mistake, and the small spaces are the ones a small model
  learns on. The held-out set is never changed by the training set: it stays the same for every num_train, so
  runs of one task seed are compared on the same problems (and grpolab eval's overlap refusal finds none).
- Each split draws items in order until it has num_train / num_test distinct questions or has spent its attempt
  budget (``4 * count + 1000`` items, at most SPLIT_SPAN); fewer found than asked is fine (a small problem space),
  none is a ConfigError.
- A problem: uid ``reasoning_gym/<generator>/<split>/<idx>``, the generator's question, its gold answer, slice
  ``<generator>``, instruction PROMPT_INSTRUCTION (answer in ``\\boxed{}``, as the other answer tasks), and data
  ``{"kind": "reasoning_gym", "generator", "options", "entry", "heldout_check"}``: ``entry`` is the generator's
  item (question, answer, metadata) made JSON-safe, which the library's scorer reads; the data hash of the run
  (grpolab.manifest.data_hash) covers it, and with it the generator, its options and the gold answers.
- Every problem's gold answer must score 1.0 under the library's own ``score_answer`` given the stored entry
  (checked as the problems are drawn; else DataError): the training reward can reach its maximum. A generator with
  no gold answer (its scorer judges each answer, e.g. boxnet, graph_color, rubiks_cube) or whose items lose what
  its scorer reads in JSON (arc_agi, rearc) is a DataError saying so.
- Training checker (``score_answer``): the library's ``score_answer(answer, entry)`` of a dataset built with the
  task's generator options; the answer is what grpolab's answer extraction takes from the completion.
- Held-out checker (``heldout_check`` of each problem, HELDOUT_CHECKS): ``math-verify`` where the gold answer is a
  number or a fraction (grpolab.evaluation.scoring's math-verify equivalence, no code shared with the library's
  scorer); ``exact`` otherwise (a word, a list, a grid, a time): there is no independent equivalence for such
  answers, so the held-out metric is the exact string after whitespace normalisation -- stricter than a scorer
  that gives partial credit.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import fields
from functools import lru_cache
from importlib import metadata
from typing import Any, Callable

from grpolab.errors import ConfigError, DataError
from grpolab.tasks.base import PROMPT_INSTRUCTION, Problem, normalise_problem_text

TASK_PREFIX = "reasoning_gym:"
KIND = "reasoning_gym"
PACKAGE = "reasoning-gym"
INSTALL_HINT = "pip install 'grpolab[reasoning-gym]'"
SPLIT_SPAN = 2**19  # item seeds of one split of one task seed
SEED_STRIDE = 2 * SPLIT_SPAN  # item seeds of one task seed: held-out first, then training
MAX_SEED = 4095  # keeps every item seed below 2**32 (generators that seed numpy need that)
RESERVED_OPTIONS = ("seed", "size")
SPLITS = ("train", "test")
# The held-out metric of a problem by its gold answer's type (see the module docstring).
HELDOUT_CHECKS = {
    "math-verify": "math-verify equivalence of the final answer (a number or a fraction)",
    "exact": "exact string after whitespace normalisation (no independent checker for this answer type)",
}
_NUMERIC_GOLD = re.compile(r"\$?\s*-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?\s*\$?|\$?-?\\[dt]?frac\{\d+\}\{\d+\}\$?")


def _library():
    """The reasoning_gym package, or a ConfigError naming the install command."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"task.name: reasoning_gym tasks need the {PACKAGE} package: {INSTALL_HINT}") from None
    return reasoning_gym


def library_version() -> str | None:
    """The installed reasoning-gym's version (its distribution's, not its ``__version__``, which lags)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def generator_names() -> list[str]:
    """Every generator reasoning-gym registers, sorted."""
    _library()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _config_class(generator: str) -> type:
    """The generator's config dataclass; ConfigError with the close names for an unknown generator."""
    _library()
    from reasoning_gym.factory import DATASETS

    if generator not in DATASETS:
        close = difflib.get_close_matches(generator, DATASETS, n=5, cutoff=0.6)
        hint = f"close names: {', '.join(close)}" if close else f"one of {', '.join(sorted(DATASETS))}"
        raise ConfigError(f"task.name: unknown reasoning-gym generator {generator!r}; {hint}")
    return DATASETS[generator][1]


def generator_options(generator: str) -> list[str]:
    """The options a generator takes: its config's fields except seed and size."""
    return [f.name for f in fields(_config_class(generator)) if f.name not in RESERVED_OPTIONS]


def _check_int(field: str, value: object, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(f"task.options.{field}: expected an integer from {minimum} to {maximum}, got {value!r}")
    return value


def _dataset(generator: str, options: dict[str, Any], seed: int, size: int):
    """create_dataset(generator, **options, seed=seed, size=size); the library's refusal as a ConfigError."""
    try:
        return _library().create_dataset(generator, **options, seed=seed, size=size)
    except (AssertionError, ValueError, TypeError) as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise ConfigError(
            f"task.options: reasoning-gym's {generator!r} rejected its options ({shown}): {e or type(e).__name__}"
        ) from None


def _json_safe(value: Any) -> Any:
    """``value`` as JSON round-trips it (tuples become lists; what JSON cannot hold becomes its repr)."""
    return json.loads(json.dumps(value, default=repr))


@lru_cache(maxsize=64)
def _scorer(generator: str, options_json: str) -> Callable[[str | None, dict], float]:
    """The library's score_answer of a dataset built with these options (one per generator and options)."""
    return _dataset(generator, json.loads(options_json), seed=0, size=1).score_answer


def heldout_check(gold: str) -> str:
    """The held-out checker a gold answer allows (HELDOUT_CHECKS): math-verify for a number or a fraction.

    >>> [heldout_check(g) for g in ["-128", "4.86", "$244/607$", "$\\\\dfrac{242}{311}$", "Tuesday", "5 × 7"]]
    ['math-verify', 'math-verify', 'math-verify', 'math-verify', 'exact', 'exact']
    """
    return "math-verify" if _NUMERIC_GOLD.fullmatch(gold.strip()) else "exact"


def score_answer(answer: str | None, problem: Problem) -> float:
    """The training checker: reasoning-gym's own ``score_answer(answer, entry)`` for the problem's generator and
    options; ``answer`` is the final answer grpolab extracted from the completion (None: none was found)."""
    data = problem.data
    if data.get("kind") != KIND:
        raise TypeError(f"{problem.uid} is not a reasoning-gym problem")
    options = json.dumps(data["options"], sort_keys=True)
    return float(_scorer(data["generator"], options)(answer, dict(data["entry"])))


def exact_heldout_correct(answer: str | None, gold: str) -> bool:
    """The ``exact`` held-out check: equal strings after whitespace normalisation (runs as one space, ends stripped).

    >>> exact_heldout_correct(" Tuesday ", "Tuesday"), exact_heldout_correct("tuesday", "Tuesday")
    (True, False)
    """
    return answer is not None and " ".join(answer.split()) == " ".join(gold.split())


class ReasoningGymTask:
    """Problems of one reasoning-gym generator; see the module docstring for the rules.

    Attribute after problems("train"): ``removed_overlap``, how many distinct held-out questions the training draw
    met and left out."""

    def __init__(
        self, generator: str, /, seed: int = 0, num_train: int = 2000, num_test: int = 200, **options: Any
    ) -> None:
        accepted = generator_options(generator)
        for option in options:
            if option == "size":
                raise ConfigError(
                    "task.options.size: not an option here; set task.options.num_train and task.options.num_test"
                )
            if option not in accepted:
                raise ConfigError(
                    f"task.options.{option}: unknown option of reasoning-gym generator {generator!r}; accepted: "
                    f"{', '.join(['seed', 'num_train', 'num_test', *accepted])}"
                )
        self.name = TASK_PREFIX + generator
        self.generator = generator
        self.seed = _check_int("seed", seed, 0, MAX_SEED)
        self.num_train = _check_int("num_train", num_train, 1, SPLIT_SPAN)
        self.num_test = _check_int("num_test", num_test, 1, SPLIT_SPAN)
        self.options = _json_safe(options)  # as the manifest records them, and as every dataset is built with them
        _dataset(generator, self.options, seed=self.seed * SEED_STRIDE, size=1)  # the library checks them now
        self.removed_overlap = 0
        self._cache: dict[str, list[Problem]] = {}

    @property
    def source(self) -> dict[str, Any]:
        """The manifest's ``data.source`` (grpolab.training.builders.load_problems): ``describe()``."""
        return self.describe()

    def describe(self) -> dict[str, Any]:
        """What identifies the task's data: generator, options, seed range and the library's version."""
        base = self.seed * SEED_STRIDE
        return {
            "generator": self.generator,
            "options": self.options,
            "library": PACKAGE,
            "version": library_version(),
            "test_item_seeds": [base, base + SPLIT_SPAN - 1],
            "train_item_seeds": [base + SPLIT_SPAN, base + SEED_STRIDE - 1],
        }

    def problems(self, split: str) -> list[Problem]:
        """Up to num_train / num_test problems of `split`, in item order."""
        if split not in SPLITS:
            raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")
        if split not in self._cache:
            held_out = set() if split == "test" else {normalise_problem_text(p.question) for p in self.problems("test")}
            self._cache[split] = self._draw(split, held_out)
        return list(self._cache[split])

    def _draw(self, split: str, held_out: set[str]) -> list[Problem]:
        count = self.num_train if split == "train" else self.num_test
        budget = min(4 * count + 1000, SPLIT_SPAN)
        first_seed = self.seed * SEED_STRIDE + (SPLIT_SPAN if split == "train" else 0)
        dataset = _dataset(self.generator, self.options, seed=first_seed, size=budget)
        seen: set[str] = set()
        found: list[Problem] = []
        for idx in range(budget):
            if len(found) == count:
                break
            item = dataset[idx]
            text = normalise_problem_text(str(item["question"]))
            if text not in seen:
                seen.add(text)
                if text not in held_out:
                    found.append(self._problem(split, idx, item))
        if split == "train":
            self.removed_overlap = len(seen & held_out)
        if not found:
            raise ConfigError(f"task.options.num_{split}: reasoning-gym's {self.generator!r} gave no {split} problems")
        return found

    def _problem(self, split: str, idx: int, item: dict[str, Any]) -> Problem:
        """The problem of the library's item `idx`; DataError when the library's scorer does not give its gold
        answer 1.0 from the recorded (JSON-safe) entry."""
        uid = f"reasoning_gym/{self.generator}/{split}/{idx}"
        if item.get("answer") is None:
            raise DataError(
                f"{uid}: reasoning-gym's {self.generator!r} gives no gold answer (its scorer judges each answer "
                "itself); a grpolab task needs one for its held-out metric"
            )
        gold, entry = str(item["answer"]), _json_safe(item)
        problem = Problem(
            uid=uid,
            question=str(entry["question"]).strip(),
            answer=gold,
            slice=self.generator,
            data={
                "kind": KIND,
                "generator": self.generator,
                "options": self.options,
                "entry": entry,
                "heldout_check": heldout_check(gold),
            },
            instruction=PROMPT_INSTRUCTION,
        )
        top = score_answer(gold, problem)
        if top != 1.0:
            why = (
                "its items do not survive JSON, the form a run records them in"
                if _scorer(self.generator, json.dumps(self.options, sort_keys=True))(gold, item) == 1.0
                else "with these options"
            )
            raise DataError(
                f"{uid}: reasoning-gym's score_answer gives the gold answer {gold[:40]!r} {top}, not 1.0, from the "
                f"recorded entry ({why}); {self.generator!r} cannot be a grpolab task"
            )
        return problem


def reasoning_gym_task(generator: str, /, **options: Any) -> ReasoningGymTask:
    """The task family's factory: ``make_task("reasoning_gym:chain_sum", max_terms=2)``."""
    return ReasoningGymTask(generator, **options)
