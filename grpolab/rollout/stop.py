"""Stop rules: where a completion ends besides its end-of-turn token (``rollout.stop_rule``; docs/code.md).

A code reward reads the first Python code block of a completion and ignores the rest, so without a rule a policy
is free to keep writing after that block -- and the code quickstart's trained model did: a second block to the
token bound on every answer, the greedy pass rate falling while the sampled one rose. ``code_block`` ends the
completion as soon as the closing fence of that first Python block is written: the text the reward reads is then
the whole answer, nothing after it is sampled, trained on or served.

A rule is a pure function of the completion text so far: True = the completion is finished. The decode loop
(rollout/decode.py) asks it only after a token whose text holds a character the rule reacts to (``TRIGGERS``), so
it costs a decode of one row now and then, not every row every step. ``resolve_stop_rule`` turns the config's
``auto`` into a rule (code_block when the run's reward reads only the first code block).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Iterator

PYTHON_FENCES = ("", "python", "py", "python3")
"""Info strings of a fence that opens a Python block (untagged included); other languages' blocks are skipped."""


class StopRule(str, Enum):
    NONE = "none"  # only the end-of-turn token (and max_new_tokens) ends a completion
    CODE_BLOCK = "code_block"  # ... or the closing fence of its first Python code block


def fenced_blocks(text: str) -> Iterator[tuple[str, int, int | None]]:
    """(info string, opening line, closing line or None while open) of each fenced block of `text`, in order. A
    fence is a line whose stripped text starts with three backticks; a block closes at the next such line.

    >>> list(fenced_blocks("a\\n```bash\\nls\\n```\\n```python\\nx = 1"))
    [('bash', 1, 3), ('python', 4, None)]
    """
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            info = stripped[3:].strip().split(" ")[0].lower()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
            yield info, i, end
            if end is None:
                return
            i = end
        i += 1


def python_block_closed(text: str) -> bool:
    """True once `text` holds a Python (or untagged) fenced block and its closing fence has begun.

    >>> python_block_closed("Sure:\\n```python\\ndef f(): pass\\n```"), python_block_closed("```python\\nx = 1\\n")
    (True, False)
    >>> python_block_closed("```bash\\nls\\n```\\n"), python_block_closed("```bash\\nls\\n```\\n```\\nx\\n``")
    (False, False)
    """
    return any(info in PYTHON_FENCES and end is not None for info, _, end in fenced_blocks(text))


RULES: dict[StopRule, tuple[Callable[[str], bool], str] | None] = {
    StopRule.NONE: None,
    StopRule.CODE_BLOCK: (python_block_closed, "`"),
}
"""Each rule: (is the completion finished?, the characters a token must hold for the answer to change)."""


def stop_rule(name: str | StopRule) -> tuple[Callable[[str], bool], str] | None:
    """The rule registered under `name` (ValueError naming the known ones otherwise)."""
    try:
        return RULES[StopRule(name)]
    except ValueError:
        raise ValueError(f"rollout.stop_rule: expected one of {[r.value for r in StopRule]}, got {name!r}") from None


def resolve_stop_rule(setting: str, reward_reads_first_code_block: bool) -> str:
    """``rollout.stop_rule`` resolved for a run: ``auto`` is ``code_block`` when the run's reward reads only the first
    Python block of a completion (a code reward: nothing after that block is sampled), else ``none``; ``none`` and
    ``code_block`` stay as set.

    >>> resolve_stop_rule("auto", True), resolve_stop_rule("auto", False), resolve_stop_rule("none", True)
    ('code_block', 'none', 'none')
    """
    if setting != "auto":
        return setting
    return StopRule.CODE_BLOCK.value if reward_reads_first_code_block else StopRule.NONE.value
