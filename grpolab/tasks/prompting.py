"""Turn a problem into prompt token ids with the tokenizer's own chat template."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from . import render_prompt
from .base import Problem


def prompt_ids(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> list[int]:
    """Chat template (user turn + generation prompt) rendered to text, then tokenised without extra specials."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": render_prompt(problem)}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]
