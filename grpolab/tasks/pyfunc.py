"""pyfunc: a synthetic, seeded set of small Python functions to write, with hidden randomized tests.

Rules:
- A problem is a (template, parameter) pair of grpolab.tasks.pyfunc_templates, e.g. ("int.add", 7): "Write a
  Python function `add_7(n)` that returns n plus 7". Its identity text is f"{key}:{param}" and uid =
  "pyfunc/" + identity. `levels` (1: one operation, 2: two steps, 3: a loop with a condition or several steps)
  and `families` (int, str, list, pair) choose the templates.
- Split: with split_by="problem", "test" if int(sha256(identity).hexdigest(), 16) % 10_000 < test_fraction *
  10_000 else "train"; with split_by="template" the template key is hashed instead, so whole kinds of functions are
  held out. Either way a pure function of the problem: train and test never share one, whatever the seed or sizes.
- Tests: inputs are drawn from random.Random(f"pyfunc:{seed}:{identity}") -- random values and up to two edge
  cases of the argument kind (0, "", [] ...), distinct, chosen so the expected outputs differ (a constant
  function must not pass) -- and the expected outputs are computed by the template's reference in the trainer.
  `shown_tests` of the random inputs are shown in the prompt as asserts; the reward runs the `hidden_tests`
  others, which the prompt never shows (edge cases are always hidden).
- Order: each split's problems are shuffled by random.Random(f"pyfunc:{seed}:{split}"); num_train / num_test
  (0 = all) keep the first ones, so the test set does not change with num_train.
- slice = the family ("int", "str", "list", "pair").
- time_limit_s (default 2): the wall-clock limit of one program run with its tests (the sandbox's own limit when
  that is lower). A correct function runs in microseconds; a looping one costs a sandbox slot this long.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from grpolab.errors import ConfigError
from grpolab.tasks.base import Problem
from grpolab.tasks.code import code_problem
from grpolab.tasks.jsonl import check_split
from grpolab.tasks.pyfunc_templates import ARG_NAMES, ARG_NOTES, PARAMS, TEMPLATES, Template

FAMILIES = ("int", "str", "list", "pair")
WORDS = (
    "apple",
    "banana",
    "cat",
    "level",
    "noon",
    "stars",
    "tree",
    "river",
    "lemon",
    "radar",
    "idea",
    "sister",
    "letter",
    "coconut",
    "dolls",
    "test",
    "rotor",
    "bread",
    "salt",
    "tonic",
    "ocean",
    "lion",
    "data",
    "code",
)
EDGES = {
    "n": [0, 1, -1, -7],
    "n+": [0, 1, 10],
    "n1": [1, 2, 12],
    "s": ["", "a"],
    "s+": ["a"],
    "text": ["", "a"],
    "text+": ["a"],
    "xs": [[], [0]],
    "xs+": [[5], [3, 3]],
    "xs2": [[1, 1], [0, -2]],
    "ab": [(0, 0), (3, -3)],
    "ab+": [(1, 1), (12, 18)],
    "ab0": [(2, 0), (-3, 3)],
}


def split_of(text: str, test_fraction: float) -> str:
    """'test' or 'train': a pure function of the text (see the module docstring)."""
    bucket = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % 10_000
    return "test" if bucket < test_fraction * 10_000 else "train"


def draw_input(kind: str, rng: random.Random, param: Any) -> Any:
    """One random argument of `kind`. Draws lean towards the template's parameter so that both answers of a yes/no
    function occur: integers are sometimes a multiple of k or next to it, strings start, end or contain the
    letter c, lists contain k."""
    k = param if isinstance(param, int) else None
    c = param if isinstance(param, str) and len(param) == 1 else None
    if kind in ("n", "n+", "n1"):
        low = {"n": -30, "n+": 0, "n1": 1}[kind]
        roll = rng.random()
        if k and roll < 0.25:
            return max(low, k * rng.randint(0 if kind == "n" else 1, 40 if kind != "n" else 4))
        if k and roll < 0.4:
            return max(low, k + rng.choice((-1, 1)))
        if kind == "n":
            return rng.randint(-30, 60)
        return rng.randint(low, 20) if rng.random() < 0.5 else rng.randint(21, 999)
    if kind in ("s", "s+"):
        s = (
            rng.choice(WORDS)
            if rng.random() < 0.6
            else "".join(rng.choice("abcdeilnorstuy") for _ in range(rng.randint(1, 7)))
        )
        if c:
            where = rng.random()
            s = c + s if where < 0.25 else s + c if where < 0.5 else s if where < 0.7 else _insert(s, c, rng)
        return s
    if kind in ("text", "text+"):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    if kind in ("xs", "xs+", "xs2"):
        xs = [rng.randint(-9, 25) for _ in range(rng.randint({"xs": 0, "xs+": 1, "xs2": 2}[kind], 6))]
        if k is not None and rng.random() < 0.5:
            xs.insert(rng.randint(0, len(xs)), k)
        return xs
    if kind == "ab":
        return (rng.randint(-20, 30), rng.randint(-20, 30)) if rng.random() < 0.85 else (rng.randint(-9, 9),) * 2
    if kind == "ab+":
        return (rng.randint(1, 60), rng.randint(1, 60))
    if kind == "ab0":
        return (rng.randint(-9, 12), rng.randint(0, 6))
    raise ValueError(f"unknown argument kind {kind!r}")


def _insert(s: str, c: str, rng: random.Random) -> str:
    i = rng.randint(0, len(s))
    return s[:i] + c + s[i:]


def call_text(name: str, kind: str, value: Any) -> str:
    """The call expression, e.g. "add_7(-3)" or "add(2, 5)".

    >>> call_text("larger", "ab", (2, -1)), call_text("f", "xs", [1, 2])
    ('larger(2, -1)', 'f([1, 2])')
    """
    args = value if kind.startswith("ab") else (value,)
    return f"{name}({', '.join(repr(a) for a in args)})"


def choose_tests(
    template: Template, param: Any, rng: random.Random, shown: int, hidden: int, output: Any
) -> tuple[list, list]:
    """(shown inputs, hidden inputs), distinct by repr, chosen so that the expected outputs differ as much as
    possible (a constant function must not pass): from 60 random draws, the shown ones are the first with outputs
    not seen yet; the hidden ones are up to two edge cases, then draws with new outputs, then any other draws."""
    seen, draws = set(), []
    for _ in range(300):
        if len(draws) >= 60:
            break
        value = draw_input(template.arg, rng, param)
        if repr(value) not in seen:
            seen.add(repr(value))
            draws.append(value)
    edges = [e for e in EDGES[template.arg] if repr(e) not in {repr(d) for d in draws}][:2]

    def pick(pool: list, count: int, outputs: set) -> list:
        """Up to `count` values of `pool` with outputs not in `outputs` yet, then any; removed from the pool."""
        out = []
        for fresh_only in (True, False):
            for value in list(pool):
                if len(out) == count:
                    break
                key = repr(output(value))
                if not fresh_only or key not in outputs:
                    outputs.add(key)
                    out.append(value)
                    pool.remove(value)
        return out

    shown_inputs = pick(draws, shown, set())
    hidden_inputs = edges[: max(0, hidden - 1)]
    hidden_inputs += pick(draws, hidden - len(hidden_inputs), {repr(output(v)) for v in hidden_inputs})
    return shown_inputs, hidden_inputs


def _choices(field: str, value: Any, allowed: tuple, cast) -> tuple:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        out = tuple(dict.fromkeys(cast(str(v).strip()) for v in items))
    except ValueError:
        out = ()
    if not out or any(v not in allowed for v in out):
        raise ConfigError(
            f"task.options.{field}: expected a comma-separated subset of {', '.join(map(str, allowed))}, got {value!r}"
        )
    return out


def _int(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"task.options.{field}: expected an integer >= {minimum}, got {value!r}")
    return value


class PyFuncTask:
    """Deterministic small-function problems; see the module docstring for the rules."""

    name = "pyfunc"

    def __init__(
        self,
        seed: int = 0,
        levels: Any = "1,2,3",
        families: Any = "int,str,list,pair",
        test_fraction: float = 0.3,
        split_by: str = "problem",
        shown_tests: int = 2,
        hidden_tests: int = 6,
        num_train: int = 0,
        num_test: int = 0,
        time_limit_s: float = 2.0,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"task.options.seed: expected an integer, got {seed!r}")
        self.seed = seed
        self.levels = _choices("levels", levels, (1, 2, 3), int)
        self.families = _choices("families", families, FAMILIES, str)
        ok = isinstance(test_fraction, (int, float)) and not isinstance(test_fraction, bool) and 0 < test_fraction < 1
        if not ok:
            raise ConfigError(
                f"task.options.test_fraction: expected a number between 0 and 1 (exclusive), got {test_fraction!r}"
            )
        self.test_fraction = float(test_fraction)
        if split_by not in ("problem", "template"):
            raise ConfigError(f"task.options.split_by: expected 'problem' or 'template', got {split_by!r}")
        self.split_by = split_by
        self.shown_tests, self.hidden_tests = _int("shown_tests", shown_tests, 0), _int("hidden_tests", hidden_tests, 1)
        self.num_train, self.num_test = _int("num_train", num_train, 0), _int("num_test", num_test, 0)
        if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
            raise ConfigError(f"task.options.time_limit_s: expected a number > 0 (seconds), got {time_limit_s!r}")
        self.time_limit_s = float(time_limit_s)

    def identities(self) -> list[tuple[Template, Any, str]]:
        """Every (template, parameter, identity text) the options allow, in template order."""
        return [
            (t, p, f"{t.key}:{p}" if t.param else t.key)
            for t in TEMPLATES
            if t.level in self.levels and t.family in self.families
            for p in PARAMS[t.param]
        ]

    def problems(self, split: str) -> list[Problem]:
        """The problems of `split` in their seeded order (num_train / num_test of them; 0 = all)."""
        check_split(split)
        chosen = [
            (t, p, ident)
            for t, p, ident in self.identities()
            if split_of(t.key if self.split_by == "template" else ident, self.test_fraction) == split
        ]
        random.Random(f"pyfunc:{self.seed}:{split}").shuffle(chosen)
        limit = self.num_train if split == "train" else self.num_test
        chosen = chosen[:limit] if limit else chosen
        if not chosen:
            raise ConfigError(
                f"task.options.test_fraction: no {split} problems with levels={self.levels}, families="
                f"{self.families}, test_fraction={self.test_fraction}, split_by={self.split_by!r}"
            )
        return [self.problem(t, p, ident) for t, p, ident in chosen]

    def problem(self, template: Template, param: Any, identity: str) -> Problem:
        """One problem with its shown examples and hidden tests (expected outputs from the reference)."""
        fmt = {"k": param, "c": param, "w": param}
        name = template.name.format(**fmt)
        reference = template.make(param)
        rng = random.Random(f"pyfunc:{self.seed}:{identity}")

        def output(value: Any) -> Any:
            return reference(*value) if template.arg.startswith("ab") else reference(value)

        def check(value: Any) -> str:
            return f"assert {call_text(name, template.arg, value)} == {output(value)!r}"

        shown, hidden = choose_tests(template, param, rng, self.shown_tests, self.hidden_tests, output)

        shown_asserts = [check(v) for v in shown]
        signature = f"{name}({ARG_NAMES[template.arg]})"
        question = f"Write a Python function `{signature}` that {template.text.format(**fmt)}, where {ARG_NOTES[template.arg]}."
        if shown_asserts:
            question += "\nExamples:\n" + "\n".join(shown_asserts)
        return code_problem(
            f"pyfunc/{identity}",
            question,
            f"# reference: {template.key} with parameter {param!r}",
            [check(v) for v in hidden],
            shown=shown_asserts,
            entry_point=name,
            slice=template.family,
            time_limit_s=self.time_limit_s,
        )
