"""The Rollout record and the RolloutEngine interface (hf today; vLLM or a remote engine later)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    greedy: bool = False


@dataclass
class Rollout:
    """N = P * G completions, group-major (rows g*G .. g*G+G-1 answer prompt g).

    prompt_ids / prompt_mask:          [N, Lp] left-padded prompt tokens
    completion_ids / completion_mask:  [N, Lc] right-padded; the mask is 1 on every sampled token, the EOS
                                       that ended the completion included (it is trained on)
    sampler_logprobs:                  [N, Lc] float32 log q(o_t) of the sampled token under the sampler's
                                       logits / temperature (before top-k/top-p truncation)
    truncated:                         [N] bool, True when the completion hit max_new_tokens without EOS
    group:                             [N] long, index of the prompt each row answers
    texts:                             decoded completions (special tokens removed)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    truncated: torch.Tensor
    group: torch.Tensor
    texts: list[str]

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: torch.Tensor | list[int]) -> "Rollout":
        """A new Rollout with only the given rows (same order as `rows`)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return Rollout(
            prompt_ids=self.prompt_ids[idx],
            prompt_mask=self.prompt_mask[idx],
            completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx],
            sampler_logprobs=self.sampler_logprobs[idx],
            truncated=self.truncated[idx],
            group=self.group[idx],
            texts=[self.texts[i] for i in idx.tolist()],
        )


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample params.group_size completions for each tokenised prompt."""
        ...

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Make the sampler's weights equal to the policy's (cast to the sampler's dtype)."""
        ...
