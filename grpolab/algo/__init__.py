"""Pure torch math of the objective (docs/design.md section 4). Every choice point is one registry keyed by a StrEnum:
advantages.BASELINES / SCALINGS, surrogate.SURROGATES, aggregation.AGGREGATIONS, kl.KL_ESTIMATORS,
importance.IS_CORRECTIONS and importance.IS_REJECTIONS (the sampler-mismatch weighting and, orthogonal to it, the sequence
rejection).

- ``loss``: the per-micro-batch GRPO objective over ``surrogate``, ``kl``, ``aggregation`` and ``importance``
  (sampler/trainer mismatch correction), with the off-policy sequence mask; the surrogates include the 2025-26 menu
  (cispo, gmpo, sapo, clip_cov, kl_cov);
- ``advantages``: group-relative advantages; ``gae``: PPO's per-token rewards, GAE and value loss;
- ``logprobs``: token log-probabilities and entropy from logits; ``dpo``: the direct preference losses.

This package imports only torch.
"""
