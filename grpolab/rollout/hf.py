"""The rollout engine for Hugging Face models (CPU default): grpolab's decode loop (rollout/decode.py, the
default) or transformers' `generate` (`rollout.decoder: hf`).

When the sampler dtype differs from the policy's (bf16 sampling of an fp32 policy) the engine keeps its own
weight copy and `sync_weights` copies the policy into it after each update -- the same contract a vLLM
engine has. The sampler's logprobs are recorded so the trainer can measure and correct the mismatch.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..algo.logprobs import token_logprobs
from ..models import frozen_copy
from .base import Rollout, SamplingParams
from .decode import decode_groups


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[[...], ...] -> (ids [N, L], mask [N, L]) left-padded to the longest."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return sorted(set(ids) | {tokenizer.eos_token_id})


def completion_mask(completion_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask up to and including the first stop token; truncated = no stop token in the row."""
    is_stop = torch.isin(completion_ids, torch.tensor(stop_ids))
    seen_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    mask = (seen_before == 0).long()
    return mask, ~is_stop.any(dim=1)


class HFEngine:
    """decoder "grpolab": our decode loop (rollout/decode.py: prefill once per group, finished rows leave the
    batch, inverse-CDF sampling); "hf": `model.generate`, the plain path it is tested against."""

    def __init__(self, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype,
                 decoder: str = "grpolab"):
        if decoder not in ("grpolab", "hf"):
            raise ValueError(f"rollout.decoder: expected 'grpolab' or 'hf', got {decoder!r}")
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.own_copy = next(policy.parameters()).dtype != dtype
        self.model = frozen_copy(policy, dtype) if self.own_copy else policy
        self.stop_ids = eos_ids(policy, tokenizer)

    def sync_weights(self, policy: torch.nn.Module) -> None:
        if self.own_copy:
            with torch.no_grad():
                for dst, src in zip(self.model.parameters(), policy.parameters()):
                    dst.copy_(src)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        ids, mask = left_pad(prompts, self.tokenizer.pad_token_id)
        g = 1 if params.greedy else params.group_size
        want_logp = params.logprobs and not params.greedy
        was_training = self.model.training
        self.model.eval()
        if self.decoder == "grpolab":
            temperature = 1.0 if params.greedy else params.temperature
            d = decode_groups(self.model, ids, mask, g, params.max_new_tokens, temperature, self.stop_ids,
                              self.tokenizer.pad_token_id, greedy=params.greedy, top_k=params.top_k, top_p=params.top_p)
            self.model.train(was_training)
            logp = d.logprobs if want_logp else torch.full(d.tokens.shape, float("nan"))
            return self._rollout(ids, mask, g, d.tokens, d.mask, logp, d.truncated)
        sampling = {} if params.greedy else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or None,
        }
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens,
            num_return_sequences=g, do_sample=not params.greedy, pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_ids, return_dict_in_generate=True, output_logits=want_logp,
            **{k: v for k, v in sampling.items() if k != "do_sample"},
        )
        self.model.train(was_training)
        comp = out.sequences[:, ids.shape[1] :]
        cmask, truncated = completion_mask(comp, self.stop_ids)
        if not want_logp:
            logp = torch.full(comp.shape, float("nan"), dtype=torch.float32)
        else:
            # one decode step at a time: never a [N, Lc, V] copy of the logits
            logp = torch.stack([token_logprobs(step.unsqueeze(1), comp[:, t : t + 1], params.temperature)[:, 0]
                                for t, step in enumerate(out.logits)], dim=1).float() * cmask
        return self._rollout(ids, mask, g, comp, cmask, logp, truncated)

    def _rollout(self, ids, mask, g, comp, cmask, logp, truncated) -> Rollout:
        texts = self.tokenizer.batch_decode(comp * cmask + self.tokenizer.pad_token_id * (1 - cmask), skip_special_tokens=True)
        return Rollout(
            prompt_ids=ids.repeat_interleave(g, dim=0),
            prompt_mask=mask.repeat_interleave(g, dim=0),
            completion_ids=comp,
            completion_mask=cmask,
            sampler_logprobs=logp,
            truncated=truncated,
            group=torch.arange(len(ids)).repeat_interleave(g),
            texts=texts,
        )
