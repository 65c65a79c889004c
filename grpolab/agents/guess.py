"""Environment ``guess``: guess-the-number with higher / lower feedback (no tools).

Rules:
- An instance is a range [low, high] and a secret in it; the range holds 4 * 2^difficulty numbers (8, 16, 32 ...),
  so binary search needs difficulty + 3 guesses at most; low is drawn from 1..50.
- Split: a pure function of the instance text ``"low-high:secret"`` (sha256 bucket below 20% = test): train and
  held-out instances are disjoint. RNG stream ``random.Random(f"guess:{seed}:{split}:{difficulty}")``.
- Each model turn is a guess: the last integer in the turn. The reply is "Higher.", "Lower." or "Correct!" (which
  ends the episode); a turn without a number is answered with a reminder. Fully deterministic.
- Reward: 1.0 when the secret was guessed before a bound ended the episode, else 0.0.
"""

from __future__ import annotations

import hashlib
import random
import re

from ..tasks.base import Problem
from .env import AgentEnv, register_environment

INTEGER = re.compile(r"-?\d+")


def make_problems(split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
    rng = random.Random(f"guess:{seed}:{split}:{difficulty}")
    width = 4 * 2**difficulty - 1
    seen: set[str] = set()
    out: list[Problem] = []
    for _ in range(20 * n + 1000):
        if len(out) >= n:
            break
        low = rng.randint(1, 50)
        high, secret = low + width, rng.randint(low, low + width)
        key = f"{low}-{high}:{secret}"
        bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10_000
        if key in seen or ("test" if bucket < 2_000 else "train") != split:
            continue
        seen.add(key)
        question = (
            f"I am thinking of an integer between {low} and {high}. Guess it. Reply with one number; after "
            "each guess I say Higher or Lower."
        )
        out.append(
            Problem(
                uid=f"guess/{key}", question=question, answer=str(secret), slice=f"width={width + 1}", instruction=""
            )
        )
    return out


@register_environment("guess")
class GuessEnv(AgentEnv):
    observation_role = "user"

    def reset(self, problem: Problem, rng: random.Random) -> str:
        self.secret, self.solved = int(problem.answer), False
        return problem.question

    def step(self, action: str) -> tuple[str, bool]:
        numbers = INTEGER.findall(action)
        if not numbers:
            return "Reply with one number.", False
        guess = int(numbers[-1])
        if guess == self.secret:
            self.solved = True
            return "Correct!", True
        return ("Higher." if guess < self.secret else "Lower."), False

    def reward(self) -> float:
        return 1.0 if self.solved else 0.0

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        return make_problems(split, n, seed, difficulty)

    @classmethod
    def expert(cls, problem: Problem, turns: list[tuple[str, str]]) -> str:
        """The scripted solver: binary search -- the middle of the range the replies so far leave (lower middle)."""
        low, high = (int(x) for x in INTEGER.findall(problem.question)[:2])
        for action, reply in turns:
            guess = int(INTEGER.findall(action)[-1])
            low, high = (guess + 1, high) if reply.startswith("Higher") else (low, guess - 1)
        return str((low + high) // 2)
