"""Environment ``calc``: arithmetic word problems with a calculator tool.

Rules:
- A problem is a word problem from one of the templates below with random operands; its gold answer is computed
  exactly. ``difficulty`` 1: one addition or subtraction of numbers 2..30 (a small model solves some in its head;
  the calculator is optional). 2: one operation on two- and three-digit numbers, products included; 3: two
  operations. From 2 on the numbers are beyond what a small model computes reliably in its head: the episode
  ``requires_tools`` (the report flags rewards reached without a calculator call).
- Split: a pure function of the question text, as in the arithmetic task ("test" when the sha256 bucket of the text
  is below 20%), so train and held-out instances never share a question whatever the seed or sizes. Each split has
  its own RNG stream ``random.Random(f"calc:{seed}:{split}:{difficulty}")``.
- Episode: the first observation is the question and the answer format; a turn with a tool call gets the tool's
  result; the first turn without a tool call is the answer and ends the episode.
- Reward: the single-turn ``correct`` rule on the answer turn (grpolab.rewards.math.correctness_reward: the last
  ``\\boxed{}``, else the last number, equal to the gold answer) -- 1.0 or 0.0; 0.0 when a bound ended the episode
  before an answer turn. (An earlier rule waited for a ``\\boxed{}`` and answered other turns with a reminder: the
  bundled model never boxed after a reminder and scored 0/32, so nothing could be learned -- docs/agents.md.)
"""

from __future__ import annotations

import hashlib
import random
import re

from ..tasks.base import PROMPT_INSTRUCTION, Problem
from .answer_env import AnswerEnv
from .env import register_environment
from .tools import CALCULATOR, calculate

# (level, text, expression) -- a, b, c drawn per template; level 0 = small numbers (difficulty 1); the gold
# answer is the calculator's value of the expression, which is also the expert's tool call
SMALL = [
    (0, "What is {a} + {b}?", "{a} + {b}"),
    (0, "What is {a} - {b}?", "{a} - {b}"),
    (0, "Sam has {a} marbles and finds {b} more. How many marbles does Sam have now?", "{a} + {b}"),
    (0, "A bag has {a} sweets. Mia eats {b} of them. How many sweets are left?", "{a} - {b}"),
]
TEMPLATES = SMALL + [
    (1, "A farmer plants {a} rows of trees with {b} trees in each row. How many trees does he plant?", "{a} * {b}"),
    (1, "A box holds {a} pencils. How many pencils are in {b} boxes?", "{a} * {b}"),
    (
        1,
        "A library has {a} books on the first floor and {c} books on the second floor. How many books are there "
        "in total?",
        "{a} + {c}",
    ),
    (1, "A train travels {a} kilometres every hour. How far does it travel in {b} hours?", "{a} * {b}"),
    (
        2,
        "A shop has {a} boxes with {b} apples in each box. It sells {c} apples. How many apples are left?",
        "{a} * {b} - {c}",
    ),
    (
        2,
        "Tom buys {a} tickets at {b} dollars each and pays a {c} dollar fee. How much does he pay in total?",
        "{a} * {b} + {c}",
    ),
    (
        2,
        "A school has {a} classes of {b} students and {c} teachers. How many people are there in the school?",
        "{a} * {b} + {c}",
    ),
    (
        2,
        "A factory makes {a} cars a day for {b} days, and {c} of them fail the test. How many cars pass?",
        "{a} * {b} - {c}",
    ),
]
TEST_SHARE = 0.2


def split_of(question: str) -> str:
    bucket = int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16) % 10_000
    return "test" if bucket < TEST_SHARE * 10_000 else "train"


def make_problems(split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
    """n distinct problems of `split` (fewer when the attempt budget of 20 n + 1000 draws runs out)."""
    levels = {1: {0}, 2: {1}}.get(difficulty, {2})
    templates = [t for t in TEMPLATES if t[0] in levels]
    rng = random.Random(f"calc:{seed}:{split}:{difficulty}")
    seen: set[str] = set()
    out: list[Problem] = []
    for _ in range(20 * n + 1000):
        if len(out) >= n:
            break
        k, text, expression = templates[rng.randrange(len(templates))]
        if k == 0:
            a, b = sorted((rng.randint(2, 30), rng.randint(2, 30)), reverse=True)
            c = 0
        else:
            a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(100, 999)
        question = text.format(a=a, b=b, c=c)
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        uid = f"calc/{hashlib.sha256(question.encode()).hexdigest()[:12]}"
        expr = expression.format(a=a, b=b, c=c)
        out.append(
            Problem(
                uid=uid,
                question=question,
                answer=calculate(expr),
                slice=f"level={k}",
                data={"requires_tools": k > 0, "expression": expr, "expert_calls": int(k > 0)},
                instruction=PROMPT_INSTRUCTION,
            )
        )
    return out


@register_environment("calc")
class CalcEnv(AnswerEnv):
    tools = [CALCULATOR]
    observation_role = "user"

    def reset(self, problem: Problem, rng: random.Random) -> str:
        self.gold, self.final = problem.answer, None
        self.requires_tools = bool(problem.data.get("requires_tools"))
        return f"{problem.question}\n{problem.instruction}"

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        return make_problems(split, n, seed, difficulty)

    @classmethod
    def expert(cls, problem: Problem, turns: list[tuple[str, str]]) -> str:
        """The scripted solver: difficulty 1 answers at once; otherwise one calculator call with the problem's
        expression, then the answer read from the tool's result."""
        calls = problem.data.get("expert_calls", 0)
        if len(turns) < calls:
            return f"<tool>calculator({problem.data['expression']})</tool>"
        value = re.search(r"result: (-?\d+)", turns[-1][1]) if turns else None
        return f"The answer is \\boxed{{{value.group(1) if value else problem.answer}}}."
