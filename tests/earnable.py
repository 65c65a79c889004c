"""A reward the tiny random test model (conftest.tiny_model_dir) can earn, so that tests of training exercise the
policy-gradient term instead of a KL or entropy term.

At temperature 1 that model samples almost uniformly from ~49k tokens (the most likely one has p ~ 3.6e-5), so a
reward for any chosen token or word is never earned, every advantage is 0 and nothing but the KL or entropy terms
moves the weights. Two properties of the model make a reward it can earn:

- with tied embeddings the logit of the token just read gets e_x . e_x / rms(e_x) = sqrt(hidden) |e_x| ~ 0.6 on top
  of the ~N(0, 0.11^2) every other token gets, so the most likely next token is the one just read (measured at the
  end of a prompt: p = 3.55e-5, the runner-up 3.27e-5);
- every prompt ends with the chat template's newline (``<|im_start|>assistant\\n``).

So with ``top_k = 2`` (rollout_config) each completion opens with a run of newlines, each one drawn with p ~ 0.5,
which ends at the first other token. The reward ``newline_share`` is the share of the completion's LENGTH tokens that
are newlines. Measured on the seed-0 model (256 completions, 8 per prompt): mean 0.15, standard deviation 0.22
(0 for 53% of the completions, 1/6 for 25%, up to 1), a standard deviation of 0.21 within a group and no group
of 8 without variance. Every prompt ends in the same newline context, so raising the newline's logit there is
one change that serves every prompt: GRPO at lr 5e-3 takes the mean to ~0.5 in 6 steps, and to 0 in one step
when the advantages' sign is flipped.
"""

from __future__ import annotations

from pathlib import Path

LENGTH = 6  # rollout.max_new_tokens of the configs that use this reward
REFERENCE = f"{Path(__file__).resolve()}:newline_share"


def reward_config() -> dict:
    """The config's `reward` section: this reward alone, named `earn` (metrics: reward/earn/mean)."""
    return {"functions": {"earn": REFERENCE}, "weights": {"earn": 1.0}}


def rollout_config(**fields) -> dict:
    """The config's `rollout` section with the sampling settings this reward needs."""
    return {"top_k": 2, "temperature": 1.0, "max_new_tokens": LENGTH, "dtype": "float32", **fields}


def newline_share(completion: str, problem) -> float:
    """Share of a LENGTH-token completion that is newlines (each newline token is one character).

    >>> newline_share("\\n\\n  Loan porch", None), newline_share("", None), newline_share("\\n" * 9, None)
    (0.3333333333333333, 0.0, 1.0)
    """
    return min(1.0, completion.count("\n") / LENGTH)


def fresh_reward(trainer, num_problems: int = 4, samples: int = 16, seed: int = 1234) -> float:
    """Mean newline_share of `samples` new completions of each of the first `num_problems` training problems,
    drawn by the trainer's current sampler with the run's sampling settings under a fixed seed. The global RNG
    state is restored afterwards, so measuring does not change the run."""
    import torch

    from grpolab.models.checkpoint import rng_state, set_rng_state
    from grpolab.rollout.base import SamplingParams

    r = trainer.cfg.rollout
    params = SamplingParams(
        group_size=samples, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens
    )
    prompts = [trainer.collector.prompt_ids(p) for p in trainer.train_problems[:num_problems]]
    state = rng_state()
    try:
        torch.manual_seed(seed)
        texts = trainer.engine.generate(prompts, params).texts
    finally:
        set_rng_state(state)
    return sum(newline_share(t, None) for t in texts) / len(texts)
