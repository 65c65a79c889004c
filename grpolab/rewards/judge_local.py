"""The judge as a causal LM on this machine (reward.judge.model without an endpoint): a hub id, a local directory or
``bundled:<alias>``, loaded with grpolab.models.load on the run's device, in eval mode, under ``torch.no_grad``.

The rendered rubric is the user turn of the judge's chat template, followed by the generation prompt. Two readings:

- ``generate``: the greedy reply (at most ``max_new_tokens``), for the ``tag`` and ``json`` parse rules;
- ``yes_probability``: one forward pass, no sampling. With p_yes = the next-token probability summed over the single
  tokens spelling yes (``Yes``, ``yes``, `` Yes``, `` yes``, ``YES``) and p_no likewise for no, the score is
  p_yes / (p_yes + p_no) and the mass p_yes + p_no says whether the judge answered yes/no at all.

Rows are left-padded with position ids that count real tokens (grpolab.rewards.model.encode / forward rule), so a
row's probabilities do not depend on the batch it is in (up to float rounding; tested).
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from ..errors import ConfigError, GrpolabError
from .model import encode

YES, NO = ("Yes", "yes", " Yes", " yes", "YES"), ("No", "no", " No", " no", "NO")
MAX_PROMPT_TOKENS = 4096


def single_token_ids(tokenizer, spellings: Sequence[str]) -> list[int]:
    """The distinct ids of the spellings that are one token each."""
    ids = [tokenizer.encode(s, add_special_tokens=False) for s in spellings]
    return sorted({t[0] for t in ids if len(t) == 1})


class LocalJudge:
    """A local judge model (module docstring); ``model`` / ``tokenizer`` may be given directly (tests)."""

    def __init__(
        self,
        name: str,
        device: Any = None,
        dtype: str = "float32",
        batch_size: int = 8,
        max_new_tokens: int = 64,
        model=None,
        tokenizer=None,
    ):
        from ..models.load import resolve_model_path

        self.name, self.dtype = name, dtype
        self.device = torch.device(device or "cpu")
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        try:
            self.path = name if model is not None else resolve_model_path(name)
        except GrpolabError as e:
            raise ConfigError(f"reward.judge.model: {e}") from None
        self.model, self.tokenizer = model, tokenizer

    def identity(self) -> dict[str, Any]:
        """What names this judge: its name, where it resolved to and the sha256 of its weights and tokenizer."""
        from ..manifest import hash_model_dir

        return {"kind": "local", "model": self.name, "resolved": self.path, **hash_model_dir(self.path)}

    def _loaded(self):
        if self.model is None:
            from ..models.load import load_causal_lm, load_tokenizer

            self.tokenizer = load_tokenizer(self.path)
            self.model = load_causal_lm(self.path, self.dtype).to(self.device).eval()
        return self.model, self.tokenizer

    def _chat(self, prompts: Sequence[str]) -> list[str]:
        _, tok = self._loaded()
        return [
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]

    @torch.no_grad()
    def yes_probability(self, prompts: Sequence[str]) -> list[tuple[float, float]]:
        """(p_yes / (p_yes + p_no), p_yes + p_no) of every prompt's next token (module docstring)."""
        model, tok = self._loaded()
        yes, no = single_token_ids(tok, YES), single_token_ids(tok, NO)
        if not yes or not no:
            raise ConfigError(
                f"reward.judge.parse: yes_no needs single tokens for yes and no; the tokenizer of "
                f"{self.name} has {len(yes)} and {len(no)}"
            )
        texts, out = self._chat(prompts), []
        for i in range(0, len(texts), self.batch_size):
            ids, mask = encode(tok, texts[i : i + self.batch_size], MAX_PROMPT_TOKENS)
            kwargs: dict[str, Any] = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
            if "position_ids" in inspect.signature(model.forward).parameters:
                kwargs["position_ids"] = (kwargs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            probs = model(**kwargs).logits[:, -1].float().softmax(-1)
            p_yes, p_no = probs[:, yes].sum(-1), probs[:, no].sum(-1)
            mass = p_yes + p_no
            out += [(float(y / m) if m > 0 else float("nan"), float(m)) for y, m in zip(p_yes, mass)]
        return out

    @torch.no_grad()
    def generate(self, prompts: Sequence[str]) -> list[str]:
        """The judge's greedy reply to every prompt, batch_size at a time."""
        model, tok = self._loaded()
        texts, out = self._chat(prompts), []
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        for i in range(0, len(texts), self.batch_size):
            ids, mask = encode(tok, texts[i : i + self.batch_size], MAX_PROMPT_TOKENS)
            gen = model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=pad,
            )
            out += tok.batch_decode(gen[:, ids.shape[1] :], skip_special_tokens=True)
        return out
