"""Environment ``lookup``: follow a chain of boxes to a code -- the model must read before it can act, one tool call
per box (docs/agents.md).

Rules:
- A box has a label ``<colour>-<3 digits>`` (12 colours x 900 numbers). What a box holds is a pure function of its
  label, the ``directory``: with the sha256 of ``"lookup:" + label`` read as an integer h, an even h holds the code
  ``1000 + (h // 2) % 9000`` ("The code is 4821."), an odd h holds a note naming the next box ("A note: open box
  amber-412."). The tool ``open(label)`` shows a box; a malformed label is a ToolError (an error observation). The
  tool is stateless, so it runs in the killable tool worker like any other.
- Split: a pure function of the label (sha256 bucket below 20% = test). A note names a box of its own box's split
  (the candidates derived from h are tried in order until one is), so a training chain never passes through a box of
  a held-out chain: train and test share no box.
- An instance is a start label whose chain reaches a code after ``hops`` boxes (no box twice); an expert needs exactly
  ``hops`` tool calls, then answers. ``difficulty`` d: hops 1 .. d + 2, in equal shares (problem i of a split
  gets hops ``i % (d + 2) + 1``). Slices: ``hops=<n>``; horizon slice ``calls=1|2|3+`` (data["expert_calls"]).
  RNG stream ``random.Random(f"lookup:{seed}:{split}:{difficulty}")``.
- Episode: the first observation names the start box; a turn with a tool call gets the box's content; the first turn
  without a tool call is the answer and ends the episode.
- Reward: the single-turn ``correct`` rule on the answer turn (the last ``\\boxed{}``, else the last number, equal
  to the code): 1.0 or 0.0; 0.0 when a bound ended the episode first. The code is four random digits: guessing it
  succeeds with probability 1/9000, so the episode ``requires_tools``.
"""

from __future__ import annotations

import hashlib
import random
import re

from ..tasks.base import Problem
from .answer_env import AnswerEnv
from .env import register_environment
from .tools import Tool, ToolError

COLOURS = ("amber", "blue", "coral", "green", "grey", "lime", "navy", "olive", "pink", "red", "teal", "white")
LABEL = re.compile(r"^([a-z]+)-(\d{3})$")
TEST_SHARE = 0.2
MAX_HOPS = 12


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)


def split_of(label: str) -> str:
    return "test" if _hash(label) % 10_000 < TEST_SHARE * 10_000 else "train"


def directory(label: str) -> tuple[str, str]:
    """What box `label` holds: ("code", "4821") or ("box", next label of the same split)."""
    h = _hash("lookup:" + label)
    if h % 2 == 0:
        return "code", str(1000 + (h // 2) % 9000)
    rest, split = h // 2, split_of(label)
    while True:  # each candidate is in the same split with probability >= 0.2: a handful of tries
        rest, pick = divmod(rest, len(COLOURS) * 900)
        candidate = f"{COLOURS[pick % len(COLOURS)]}-{100 + pick // len(COLOURS)}"
        if split_of(candidate) == split:
            return "box", candidate
        if rest == 0:
            rest = _hash("lookup:" + candidate)


def chain(label: str) -> tuple[list[str], str] | None:
    """(the boxes opened from `label` on, the code at the end); None when a box repeats or MAX_HOPS pass."""
    boxes = [label]
    while len(boxes) <= MAX_HOPS:
        kind, value = directory(boxes[-1])
        if kind == "code":
            return boxes, value
        if value in boxes:
            return None
        boxes.append(value)
    return None


def open_box(argument: str) -> str:
    """The tool: the content of the box labelled `argument` (quotes and spaces around it are ignored).

    >>> open_box("'navy-100'") == open_box("navy-100")
    True
    """
    label = argument.strip().strip("'\"").strip().lower()
    match = LABEL.match(label)
    if match is None or match.group(1) not in COLOURS or not 100 <= int(match.group(2)) <= 999:
        raise ToolError(f"no box labelled {argument.strip()[:40]!r}; a label looks like amber-412")
    kind, value = directory(label)
    return f"The code is {value}." if kind == "code" else f"A note: open box {value}."


OPEN = Tool(
    "open", "open(label) shows what is inside the box with that label, e.g. <tool>open(amber-412)</tool>", open_box
)


def make_problems(split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
    """n distinct instances of `split`, hops cycling 1 .. difficulty + 2 (rules in the module docstring)."""
    rng = random.Random(f"lookup:{seed}:{split}:{difficulty}")
    seen: set[str] = set()
    out: list[Problem] = []
    for i in range(n):
        hops = i % (difficulty + 2) + 1
        for _ in range(100_000):
            label = f"{rng.choice(COLOURS)}-{rng.randint(100, 999)}"
            if label in seen or split_of(label) != split:
                continue
            found = chain(label)
            if found is not None and len(found[0]) == hops:
                break
        else:  # pragma: no cover - 100,000 draws find a chain of <= 14 hops with certainty in practice
            raise RuntimeError(f"lookup: no {split} chain of {hops} boxes found")
        seen.add(label)
        boxes, code = found
        question = (
            f"Box {label} holds a four-digit code, or a note naming another box to open. Find the code. "
            "Reply with just the code."
        )
        out.append(
            Problem(
                uid=f"lookup/{label}",
                question=question,
                answer=code,
                slice=f"hops={hops}",
                instruction="",
                data={"requires_tools": True, "expert_calls": hops, "start": label},
            )
        )
    return out


@register_environment("lookup")
class LookupEnv(AnswerEnv):
    tools = [OPEN]
    requires_tools = True
    observation_role = "user"

    def reset(self, problem: Problem, rng: random.Random) -> str:
        self.gold, self.final = problem.answer, None
        return problem.question

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        return make_problems(split, n, seed, difficulty)

    @classmethod
    def expert(cls, problem: Problem, turns: list[tuple[str, str]]) -> str:
        """The scripted solver: open the start box, then each box a note names; answer with the code."""
        if not turns:
            return f"<tool>open({problem.data['start']})</tool>"
        last = turns[-1][1]
        note = re.search(r"open box ([a-z]+-\d{3})", last)
        if note:
            return f"<tool>open({note.group(1)})</tool>"
        code = re.search(r"The code is (\d+)", last)
        return f"The code is {code.group(1) if code else '?'}."
