"""Synthetic integer arithmetic: "What is 7 - 3 + 5?" with an exact integer answer.

Rules:
- An expression has `terms` operands joined by operators drawn uniformly from `operators`
  (a subset of "+-*"). Its text is normalised as operands and operators separated by single
  spaces ("7 - 3 + 5"); that text is the problem's identity (uid = "arithmetic/" + text).
- Each operand is drawn in two steps: first its number of digits k, uniform over 1..`digits`,
  then its value, uniform over the k-digit integers (0..9 for k = 1). So with digits=3 a third
  of the operands are single-digit, rather than ~1% as a uniform draw over 0..999 would give.
  With `max_operand` > 0 the operands are instead uniform over 0..max_operand (digits is ignored):
  a finer difficulty knob, e.g. 0..20.
- The answer is evaluated exactly with normal precedence ("*" before "+"/"-", left to right),
  without eval(). Answers may be negative.
- The split of an expression is a pure function of its text:
  "test" if int(sha256(text).hexdigest(), 16) % 10_000 < test_fraction * 10_000 else "train".
  Train and test can therefore never share an expression, whatever the seed or sizes.
- Each split is generated from its own RNG stream, random.Random(f"arithmetic:{seed}:{split}"),
  so the test set does not change when num_train changes (and vice versa). Candidates are
  deduplicated and those whose hash-split differs from the asked split are dropped, until the
  count is reached or the attempt budget (20 * count + 10_000 draws) is spent; then whatever
  was found is returned (ConfigError if nothing was).
- slice = f"digits={k}" with k the largest number of digits among the operands.
"""

from __future__ import annotations

import hashlib
import random

from grpolab.errors import ConfigError
from grpolab.tasks.base import Problem

ALLOWED_OPERATORS = "+-*"
SPLITS = ("train", "test")


def evaluate(tokens: list[str]) -> int:
    """Evaluate ["2", "+", "3", "*", "4"] with "*" binding tighter than "+"/"-", left to right.

    >>> evaluate("2 + 3 * 4".split())
    14
    >>> evaluate("10 - 2 - 3".split())
    5
    """
    total, sign, product = 0, 1, int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            product *= int(operand)
        elif op in "+-":
            total += sign * product
            sign, product = (1 if op == "+" else -1), int(operand)
        else:
            raise ValueError(f"unknown operator {op!r}")
    return total + sign * product


def split_of(expression: str, test_fraction: float) -> str:
    """The split an expression belongs to: a pure function of its normalised text."""
    bucket = int(hashlib.sha256(expression.encode("utf-8")).hexdigest(), 16) % 10_000
    return "test" if bucket < test_fraction * 10_000 else "train"


def _check_int(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"task.options.{field}: expected an integer >= {minimum}, got {value!r}")
    return value


def _check_operators(value: object) -> str:
    if not isinstance(value, str) or not value or any(c not in ALLOWED_OPERATORS for c in value):
        raise ConfigError(
            f"task.options.operators: expected a non-empty string of characters from {ALLOWED_OPERATORS!r}, got {value!r}"
        )
    return "".join(dict.fromkeys(value))  # dedupe, keep order


def _check_fraction(value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1
    if not ok:
        raise ConfigError(f"task.options.test_fraction: expected a number between 0 and 1 (exclusive), got {value!r}")
    return float(value)


class ArithmeticTask:
    """Deterministic arithmetic problems; see the module docstring for the generation rules."""

    name = "arithmetic"

    def __init__(
        self,
        digits: int = 1,
        operators: str = "+-",
        terms: int = 2,
        seed: int = 0,
        test_fraction: float = 0.2,
        num_train: int = 2000,
        num_test: int = 200,
        max_operand: int = 0,
    ) -> None:
        self.digits = _check_int("digits", digits, 1)
        self.max_operand = _check_int("max_operand", max_operand, 0)
        self.operators = _check_operators(operators)
        self.terms = _check_int("terms", terms, 2)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"task.options.seed: expected an integer, got {seed!r}")
        self.seed = seed
        self.test_fraction = _check_fraction(test_fraction)
        self.num_train = _check_int("num_train", num_train, 1)
        self.num_test = _check_int("num_test", num_test, 1)

    def problems(self, split: str) -> list[Problem]:
        """Up to num_train / num_test problems of `split`, in generation order."""
        if split not in SPLITS:
            raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")
        count = self.num_train if split == "train" else self.num_test
        rng = random.Random(f"arithmetic:{self.seed}:{split}")
        seen: set[str] = set()
        found: list[Problem] = []
        for _ in range(20 * count + 10_000):
            if len(found) == count:
                break
            operands, tokens = self._draw(rng)
            text = " ".join(tokens)
            if text in seen:
                continue
            seen.add(text)
            if split_of(text, self.test_fraction) == split:
                found.append(self._problem(text, tokens, operands))
        if not found:
            raise ConfigError(
                f"task.options.test_fraction: no {split} problems could be generated with digits={self.digits}, "
                f"max_operand={self.max_operand}, "
                f"terms={self.terms}, operators={self.operators!r}, test_fraction={self.test_fraction}; "
                "raise task.options.digits or task.options.terms, or move task.options.test_fraction away from 0/1"
            )
        return found

    def _draw(self, rng: random.Random) -> tuple[list[str], list[str]]:
        """One random expression: its operands and its token list (operand, op, operand, ...)."""
        operands: list[str] = []
        tokens: list[str] = []
        for i in range(self.terms):
            if i:
                tokens.append(rng.choice(self.operators))
            if self.max_operand:
                operands.append(str(rng.randint(0, self.max_operand)))
            else:
                k = rng.randint(1, self.digits)
                operands.append(str(rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1)))
            tokens.append(operands[-1])
        return operands, tokens

    @staticmethod
    def _problem(text: str, tokens: list[str], operands: list[str]) -> Problem:
        return Problem(
            uid=f"arithmetic/{text}",
            question=f"What is {text}?",
            answer=str(evaluate(tokens)),
            slice=f"digits={max(len(o) for o in operands)}",
        )
