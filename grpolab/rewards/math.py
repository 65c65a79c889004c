"""Rule-based rewards for math answers: extract the final answer, normalize it, compare to the gold one.

Every function here runs in linear time in the length of its input (the regexes have no nested
quantifiers and braces are matched in one pass) and never raises on any ``str`` input.
"""

from __future__ import annotations

import re

from grpolab.tasks import answer_checker
from grpolab.tasks.base import Problem
from grpolab.tasks.code import is_code_problem

# One pass over the text: ``\boxed{`` opens a box, a bare ``{`` opens a plain group, ``}`` closes.
_BRACE_TOKEN = re.compile(r"\\boxed\{|[{}]")
# ASCII digits only, so e.g. Arabic-Indic digits are not numbers here. Thousands groups must be
# exactly three digits and not followed by a fourth ("12,3456" is read as 12 and 3456).
_NUMBER = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])(?:\.[0-9]+)?|-?[0-9]+(?:\.[0-9]+)?")
_WHOLE_NUMBER = re.compile(r"([+-]?)([0-9]{1,3}(?:,[0-9]{3})+|[0-9]*)(?:\.([0-9]*))?")


def extract_answer(text: str) -> str | None:
    r"""Return the final answer in ``text``, or None when there is none.

    Rule: the content of the last complete ``\boxed{...}`` (the one that starts last), with
    balanced-brace matching; a box that is never closed is ignored. Only the exact spelling
    ``\boxed{`` counts (not ``\boxed {``). Without any complete box, the last number: optional
    ``-``, ASCII digits with optional thousands commas, optional decimal part.

    >>> extract_answer(r"so \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> extract_answer(r"\boxed{1} then \boxed{2}")
    '2'
    >>> extract_answer(r"\boxed{7} and finally \boxed{8")
    '7'
    >>> extract_answer("it costs 1,234.50 or -3.5 dollars")
    '-3.5'
    >>> extract_answer("no answer") is None
    True
    """
    stack: list[tuple[bool, int]] = []  # (is_box, index just after the opening brace)
    last: tuple[int, int] | None = None  # (start, end) of the content of the last-starting box
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "}":
            if stack:
                is_box, start = stack.pop()
                if is_box and (last is None or start > last[0]):
                    last = (start, m.start())
        else:
            stack.append((tok != "{", m.end()))
    if last is not None:
        return text[last[0] : last[1]]
    number = None
    for number in _NUMBER.finditer(text):
        pass
    return None if number is None else number.group()


def normalize_answer(s: str) -> str:
    r"""Canonical form of an answer string, for exact comparison.

    Rule: strip surrounding whitespace; remove ``$`` signs (and ``\$``); strip one trailing
    period. If what is left is a number (optional sign, digits with optional thousands commas,
    optional decimal part), rewrite it canonically: no ``+``, no commas, no leading zeros, no
    trailing decimal zeros, no ``-`` on zero. Anything else is returned as is (``\text{...}``,
    ``\frac``, spaces inside are not touched).

    >>> normalize_answer(" $1,000.00$ ")
    '1000'
    >>> [normalize_answer(x) for x in ["18.0", "18.50", "-0.0", "+5", "42."]]
    ['18', '18.5', '0', '5', '42']
    >>> normalize_answer(r" \frac{1}{2} ")
    '\\frac{1}{2}'
    """
    s = s.strip().replace("\\$", "").replace("$", "").strip()
    if s.endswith("."):
        s = s[:-1].rstrip()
    m = _WHOLE_NUMBER.fullmatch(s)
    if m is None or not (m.group(2) or m.group(3)):
        return s
    sign, whole, frac = m.group(1), m.group(2), m.group(3) or ""
    whole = whole.replace(",", "").lstrip("0") or "0"
    frac = frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    return "-" + out if sign == "-" and out != "0" else out


def correctness_reward(completion: str, gold: str) -> float:
    r"""1.0 if the extracted answer equals the gold answer after normalization, else 0.0.

    Rule: ``normalize_answer(extract_answer(completion)) == normalize_answer(gold)``; no
    extractable answer gives 0.0.

    >>> correctness_reward(r"The answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}")
    1.0
    >>> correctness_reward("I paid $1,000.00 in total", "1000")
    1.0
    >>> correctness_reward("no idea", "0")
    0.0
    """
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    return 1.0 if normalize_answer(answer) == normalize_answer(gold) else 0.0


def format_reward(completion: str, gold: str | None = None) -> float:
    r"""1.0 if the completion contains the substring ``\boxed{``, else 0.0 (unweighted).

    ``gold`` is optional and ignored; it lets this function be called as ``fn(completion, gold)``
    like every other reward in the registry.

    >>> format_reward(r"\boxed{3}"), format_reward("3")
    (1.0, 0.0)
    """
    return 1.0 if "\\boxed{" in completion else 0.0


def task_correctness_reward(completion: str, problem: Problem) -> float:
    r"""The ``correct`` reward: where the problem's task scores its own answers (grpolab.tasks.answer_checker, e.g.
    reasoning-gym's score_answer, which may give partial credit) that checker on ``extract_answer(completion)``;
    else ``correctness_reward`` against the gold string. A code problem is an error (weight pass_fraction or all_pass).

    >>> task_correctness_reward(r"\boxed{4}", Problem(uid="p", question="2+2?", answer="4"))
    1.0
    """
    if is_code_problem(problem):
        raise TypeError(
            f"compares a final answer, but {problem.uid} is a code problem; weight pass_fraction or all_pass instead"
        )
    checker = answer_checker(problem)
    if checker is None:
        return correctness_reward(completion, problem.answer)
    return float(checker(extract_answer(completion), problem))
