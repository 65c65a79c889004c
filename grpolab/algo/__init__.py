"""Pure torch math of the objective. Every choice point is one registry keyed by a StrEnum.

advantages.BASELINES / SCALINGS, surrogate.SURROGATES, aggregation.AGGREGATIONS, kl.KL_ESTIMATORS,
importance.IS_CORRECTIONS. This package imports only torch.
"""
