"""grpolab's in-process rollout engine (``rollout.engine: grpolab``, the default) on a transformers model: grpolab's
own decode loop (rollout/decode.py, ``rollout.decoder: grpolab``) or transformers' `generate` (``rollout.decoder:
hf``, the plain path the loop is tested against).

When the sampler dtype differs from the policy's (bf16 sampling of an fp32 policy) the engine keeps its own
weight copy and `sync_weights` copies the policy into it, parameter by parameter name, after each update -- the
same contract a vLLM engine has. The sampler's logprobs are recorded so the trainer can measure and correct the
mismatch: those of the distribution sampled (after top-k / top-p, for the importance weights) and, when that is
truncated, the untruncated ones too (for the mismatch metric).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..algo.logprobs import token_logprobs
from ..models.load import copy_weights_by_name, eval_mode, frozen_copy
from ..models.lora import is_lora
from .base import Rollout, SamplingParams
from .decode import TextStop, decode_groups
from .stop import stop_rule

DECODERS = ("grpolab", "hf")  # config.RolloutConfig.decoder
REMOVED_DECODERS = ("static", "static_compiled")  # config.REMOVED_CHOICES says why


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
    is_stop = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device))
    seen_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    mask = (seen_before == 0).long()
    return mask, ~is_stop.any(dim=1)


class GrpolabEngine:
    """A RolloutEngine in this process. decoder "grpolab": our decode loop (rollout/decode.py: prefill once per group,
    finished rows leave the batch, inverse-CDF sampling); "hf": transformers' `model.generate`."""

    version = ""  # no library of its own: this process's grpolab and transformers (the manifest's versions)

    def __init__(
        self,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        dtype: torch.dtype,
        decoder: str = "grpolab",
        own_copy: bool = False,
        cpu_fast_paths: bool = True,
        preallocate_kv_cache: bool = True,
    ):
        if decoder not in DECODERS:
            removed = (
                (
                    f" ({decoder!r} was removed: it sampled the same tokens as 'grpolab', no faster in a GRPO step; "
                    f"docs/performance.md keeps its measurement)"
                )
                if decoder in REMOVED_DECODERS
                else ""
            )
            expected = ", ".join(map(repr, DECODERS))
            raise ValueError(f"rollout.decoder: expected one of {expected}, got {decoder!r}{removed}")
        self.decoder, self.cpu_fast_paths, self.preallocate_kv_cache = decoder, cpu_fast_paths, preallocate_kv_cache
        self.tokenizer = tokenizer
        # a LoRA policy always gets a plain copy holding the merged weights W + (alpha / r) B A (grpolab/models/lora.py)
        # (and so does a policy about to be sharded: own_copy=True, train.strategy fsdp2)
        self.own_copy = own_copy or next(policy.parameters()).dtype != dtype or is_lora(policy)
        self.model = frozen_copy(policy, dtype) if self.own_copy else policy
        self.stop_ids = eos_ids(policy, tokenizer)
        self._text_stops: dict[str, TextStop | None] = {}
        self.last_sync: dict[str, float] = {}  # never filled: the copy is made in place, nothing is written

    def close(self) -> None:
        """Nothing to give back: the engine lives in this process (RolloutEngine.close)."""

    def text_stop(self, name: str) -> TextStop | None:
        """The decode loop's form of stop rule `name` (rollout/stop.py): its trigger tokens are found once per
        engine (every vocabulary entry whose text holds one of the rule's characters)."""
        if name not in self._text_stops:
            rule = stop_rule(name)
            if rule is None:
                self._text_stops[name] = None
            else:
                check, chars = rule
                pieces = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
                triggers = [i for i, p in enumerate(pieces) if p and any(c in p for c in chars)]
                decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
                self._text_stops[name] = TextStop(check, torch.tensor(triggers, dtype=torch.long), decode)
        return self._text_stops[name]

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Copy the policy's parameters into the sampler's copy by name (ValueError naming the first mismatch)."""
        if self.own_copy:
            copy_weights_by_name(self.model, policy)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """G completions per prompt. seeds: one per prompt, the seed of that group's own sampling stream (the
        grpolab decoder; `generate` draws from the global RNG and refuses them)."""
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompts, self.tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        g = 1 if params.greedy else params.group_size
        generators = None if seeds is None else [torch.Generator().manual_seed(s) for s in seeds]
        want_logp = params.logprobs and not params.greedy
        if self.decoder != "hf":
            temperature = 1.0 if params.greedy else params.temperature
            args = (
                self.model,
                ids,
                mask,
                g,
                params.max_new_tokens,
                temperature,
                self.stop_ids,
                self.tokenizer.pad_token_id,
            )
            kwargs = dict(
                greedy=params.greedy,
                top_k=params.top_k,
                top_p=params.top_p,
                generators=generators,
                prepack=self.cpu_fast_paths,
                stop_check=self.text_stop(params.stop_rule),
            )
            with eval_mode(self.model):
                d = decode_groups(*args, preallocate_cache=self.preallocate_kv_cache, **kwargs)
            if not want_logp:
                return self._rollout(
                    ids,
                    mask,
                    g,
                    d.tokens,
                    d.mask,
                    torch.full(d.tokens.shape, float("nan"), device=device),
                    None,
                    d.truncated,
                )
            return self._rollout(ids, mask, g, d.tokens, d.mask, d.logprobs, d.logprobs_untruncated, d.truncated)
        if seeds is not None:
            raise ValueError("per-group seeds need rollout.decoder: grpolab (transformers' generate has one RNG)")
        if stop_rule(params.stop_rule) is not None:
            raise ValueError(f"rollout.stop_rule {params.stop_rule!r} needs rollout.decoder: grpolab")
        return self._generate_hf(ids, mask, g, params, want_logp)

    def _generate_hf(self, ids, mask, g: int, params: SamplingParams, want_logp: bool) -> Rollout:
        """`model.generate`; the sampled logprobs come from its processed scores (what it drew from: logits / T,
        top-k, top-p), the untruncated ones from its raw logits -- one and the same when nothing is truncated."""
        cut = want_logp and (params.top_k > 0 or params.top_p < 1.0)
        sampling = (
            {}
            if params.greedy
            else {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k or None,
            }
        )
        with eval_mode(self.model):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=params.max_new_tokens,
                num_return_sequences=g,
                do_sample=not params.greedy,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.stop_ids,
                return_dict_in_generate=True,
                output_logits=want_logp,
                output_scores=cut,
                **sampling,
            )
        comp = out.sequences[:, ids.shape[1] :]
        cmask, truncated = completion_mask(comp, self.stop_ids)
        if not want_logp:
            nan = torch.full(comp.shape, float("nan"), dtype=torch.float32, device=comp.device)
            return self._rollout(ids, mask, g, comp, cmask, nan, None, truncated)

        def per_step(steps, temperature: float) -> torch.Tensor:
            # one decode step at a time: never a [N, Lc, V] copy of the logits; pads (maybe -inf) become 0
            logp = torch.stack(
                [
                    token_logprobs(step.unsqueeze(1), comp[:, t : t + 1], temperature)[:, 0]
                    for t, step in enumerate(steps)
                ],
                dim=1,
            ).float()
            return logp.masked_fill(cmask == 0, 0.0)

        full = per_step(out.logits, params.temperature)
        sampled = per_step(out.scores, 1.0) if cut else full  # the scores are already divided by T
        return self._rollout(ids, mask, g, comp, cmask, sampled, full if cut else None, truncated)

    def _rollout(self, ids, mask, g, comp, cmask, logp, logp_untruncated, truncated) -> Rollout:
        return group_rollout(self.tokenizer, ids, mask, g, comp, cmask, logp, logp_untruncated, truncated)


def group_rollout(tokenizer, ids, mask, g, comp, cmask, logp, logp_untruncated, truncated) -> Rollout:
    """The Rollout of G completions per prompt: prompts (left-padded ids / mask, one row per prompt) repeated G times,
    group-major; the completions' texts decoded with the pads (after each row's mask) left out."""
    pad = tokenizer.pad_token_id
    texts = tokenizer.batch_decode(comp * cmask + pad * (1 - cmask), skip_special_tokens=True)
    return Rollout(
        prompt_ids=ids.repeat_interleave(g, dim=0),
        prompt_mask=mask.repeat_interleave(g, dim=0),
        completion_ids=comp,
        completion_mask=cmask,
        sampler_logprobs=logp,
        truncated=truncated,
        group=torch.arange(len(ids), device=ids.device).repeat_interleave(g),
        texts=texts,
        sampler_logprobs_untruncated=logp_untruncated,
    )
