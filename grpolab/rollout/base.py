"""The Rollout record and the engines' two interfaces: ``RolloutEngine`` (synchronous: every engine) and
``QueuedEngine`` (an engine in a worker process that also keeps requests in flight: rollout.max_staleness).
grpolab.rollout.engines builds the engine of a run and says which engines are queued."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    greedy: bool = False
    logprobs: bool = True  # record the sampler's logprobs (training); evaluation sampling can skip them
    stop_rule: str = "none"  # what else ends a completion (rollout/stop.py): "none" | "code_block"


def alone(obj) -> list:
    return [obj]


@dataclass(frozen=True)
class Ranks:
    """The trainer's data-parallel processes as an engine sees them (grpolab.training.distributed.engine_ranks): this
    process's rank, how many there are, and ``gather``, a collective every rank calls with an object of its own and
    that returns every rank's, in rank order. One process: rank 0 of 1."""

    rank: int = 0
    size: int = 1
    gather: Callable[[Any], list] = alone

    def first_error(self, error: str | None) -> str | None:
        """The first rank's error message among every rank's `error` (None: none has one); a collective."""
        return next((e for e in self.gather(error) if e is not None), None)


@dataclass
class Rollout:
    """N = P * G completions, group-major (rows g*G .. g*G+G-1 answer prompt g).

    prompt_ids / prompt_mask:          [N, Lp] left-padded prompt tokens
    completion_ids / completion_mask:  [N, Lc] right-padded; the mask is 1 on every sampled token, the EOS
                                       that ended the completion included (it is trained on)
    sampler_logprobs:                  [N, Lc] float32 log q(o_t) of the sampled token under the distribution
                                       the sampler drew from: softmax of its logits / temperature after top-k /
                                       top-p truncation
    truncated:                         [N] bool, True when the completion hit max_new_tokens without EOS
    group:                             [N] long, index of the prompt each row answers
    texts:                             decoded completions (special tokens removed)
    sampler_logprobs_untruncated:      [N, Lc] float32 log softmax(logits / T)(o_t), before truncation: what the
                                       trainer computes, so the importance weights (grpolab.algo.importance) and
                                       the mismatch metrics compare like with like; None when nothing was truncated (then it equals
                                       sampler_logprobs: read it through `untruncated_logprobs()`)
    loss_mask:                         [N, Lc] long, 1 on the tokens the loss trains on: the model's own tokens of
                                       a multi-turn episode (grpolab.agents), 0 on environment / tool tokens it
                                       only attends to; None = completion_mask (single-turn: every sampled token).
                                       Read it through `trained_mask()`
    weight_versions:                   [N] the weight version(s) of the server that sampled each row, comma-joined
                                       in order when a weight sync fell inside the completion (rollout.engine
                                       vllm_server: vLLM's weight_versions); None for the other engines
    token_versions:                    [N, Lc] long, the policy version (updates applied) of the weights that
                                       sampled each completion token, -1 after the completion (vllm_server: from
                                       vLLM's per-token version spans, label - 1); None where one generation has one
                                       version by construction (the worker engines: the pipeline's schedule)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    truncated: torch.Tensor
    group: torch.Tensor
    texts: list[str]
    sampler_logprobs_untruncated: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    weight_versions: list[str] | None = None
    token_versions: torch.Tensor | None = None

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
            sampler_logprobs_untruncated=None
            if self.sampler_logprobs_untruncated is None
            else self.sampler_logprobs_untruncated[idx],
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
            weight_versions=None if self.weight_versions is None else [self.weight_versions[i] for i in idx.tolist()],
            token_versions=None if self.token_versions is None else self.token_versions[idx],
        )

    def trained_mask(self) -> torch.Tensor:
        """[N, Lc] the tokens the loss trains on: loss_mask, or completion_mask when there is none."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    def untruncated_logprobs(self) -> torch.Tensor:
        """[N, Lc] the sampler's untruncated logprobs (sampler_logprobs itself when nothing was truncated)."""
        u = self.sampler_logprobs_untruncated
        return self.sampler_logprobs if u is None else u


class RolloutEngine(Protocol):
    """What the trainer, the held-out eval and the agent episodes call on every engine (grpolab.rollout.engines)."""

    last_sync: dict[str, float]
    """The newest weight load a worker answered: {"total_s": seconds, "bytes": bytes written}; {} for the in-process
    engine, whose copy is made in place."""
    version: str
    """The version of the library the engine runs, as its worker reported it (vLLM's from its own venv); '' in this
    process."""
    stop_ids: list[int]
    """The token ids that end a completion or a turn: the model's generation_config eos ids and the tokenizer's."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """Sample params.group_size completions for each tokenised prompt; seeds (one per prompt) give each group
        its own sampling stream."""
        ...

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Make the sampler's weights equal to the policy's (cast to the sampler's dtype)."""
        ...

    def close(self) -> None:
        """Give back what the engine holds outside this process (its worker); idempotent."""
        ...


class QueuedEngine(RolloutEngine, Protocol):
    """An engine whose requests are answered in the order sent, and may stay in flight (grpolab.rollout.worker_engine;
    the asynchronous pipeline grpolab.training.pipeline builds on it)."""

    def submit(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Any:
        """Send a generation (as ``generate``) and return at once a handle that ``finish`` collects."""
        ...

    def finish(self, pending: Any) -> Rollout:
        """The rollout of a submitted generation (waiting for it and for every request sent before it)."""
        ...

    def wait_all(self) -> None:
        """Wait for every request in flight."""
        ...

    def sync_weights(self, policy: torch.nn.Module, wait: bool = True) -> None:
        """The policy's weights into the engine, behind the requests in flight; wait=False returns once they are
        sent (generations submitted later sample from them)."""
        ...


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts of different widths: prompts re-padded on the left, completions on the right;
    group indices are offset so they stay unique."""
    lp = max(r.prompt_ids.shape[1] for r in parts)
    lc = max(r.completion_ids.shape[1] for r in parts)

    def pad(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    offset, groups = 0, []
    for r in parts:
        groups.append(r.group + offset)
        offset += int(r.group.max()) + 1 if len(r) else 0
    untruncated = None
    if any(r.sampler_logprobs_untruncated is not None for r in parts):
        untruncated = torch.cat([pad(r.untruncated_logprobs(), lc, 0.0, False) for r in parts])
    loss_mask = None
    if any(r.loss_mask is not None for r in parts):
        loss_mask = torch.cat([pad(r.trained_mask(), lc, 0, False) for r in parts])
    versions = None
    if any(r.weight_versions is not None for r in parts):
        versions = [v for r in parts for v in (r.weight_versions or [""] * len(r))]
    token_versions = None
    if any(r.token_versions is not None for r in parts):
        token_versions = torch.cat([pad(version_rows(r), lc, -1, False) for r in parts])
    return Rollout(
        prompt_ids=torch.cat([pad(r.prompt_ids, lp, pad_id, True) for r in parts]),
        prompt_mask=torch.cat([pad(r.prompt_mask, lp, 0, True) for r in parts]),
        completion_ids=torch.cat([pad(r.completion_ids, lc, pad_id, False) for r in parts]),
        completion_mask=torch.cat([pad(r.completion_mask, lc, 0, False) for r in parts]),
        sampler_logprobs=torch.cat([pad(r.sampler_logprobs, lc, 0.0, False) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        group=torch.cat(groups),
        texts=[t for r in parts for t in r.texts],
        sampler_logprobs_untruncated=untruncated,
        loss_mask=loss_mask,
        weight_versions=versions,
        token_versions=token_versions,
    )


def version_rows(rollout: Rollout) -> torch.Tensor:
    """[N, Lc] its token_versions, or -1 everywhere for a rollout without them (concat_rollouts)."""
    if rollout.token_versions is not None:
        return rollout.token_versions
    return torch.full(rollout.completion_ids.shape, -1, dtype=torch.long)
