"""A scripted rollout engine for the OpenAI-endpoint tests: it answers each prompt with the texts a script gives,
as exact token ids (or the ids the script names), with known logprobs, through the engine protocol
(grpolab.rollout.base.RolloutEngine.generate) -- so every token the endpoint records can be checked."""

from __future__ import annotations

import torch

from grpolab.rollout.base import Rollout


class ScriptedEngine:
    """generate() answers prompt p's k-th sample with ``script(prompt_ids, k)``: a text (tokenized, then the
    end-of-turn id appended) or a list of ids (taken as they are). Logprob of the i-th token of a turn drawn on call
    c: -(c + 1) / 100 - i / 1000. Cut at params.max_new_tokens (truncated)."""

    version, last_sync = "", {}

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.stop_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.prompts: list[list[int]] = []
        self.calls = 0

    def generate(self, prompts, params, seeds=None) -> Rollout:
        g = params.group_size
        rows, logps, cut = [], [], []
        for p in prompts:
            self.prompts.append(list(p))
            for k in range(g):
                out = self.script(list(p), k)
                ids = (
                    list(out)
                    if isinstance(out, list)
                    else self.tokenizer(out, add_special_tokens=False)["input_ids"] + self.stop_ids
                )
                cut.append(len(ids) > params.max_new_tokens)
                ids = ids[: params.max_new_tokens]
                rows.append(ids)
                logps.append([-(self.calls + 1) / 100 - i / 1000 for i in range(len(ids))])
        self.calls += 1
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        return Rollout(
            prompt_ids=torch.zeros(len(rows), 1, dtype=torch.long),
            prompt_mask=torch.ones(len(rows), 1, dtype=torch.long),
            completion_ids=torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            completion_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            sampler_logprobs=torch.tensor([lp + [0.0] * (width - len(lp)) for lp in logps]),
            truncated=torch.tensor(cut),
            group=torch.arange(len(prompts)).repeat_interleave(g),
            texts=[self.tokenizer.decode(r, skip_special_tokens=True) for r in rows],
        )

    def sync_weights(self, policy) -> None:
        pass

    def close(self) -> None:
        pass
