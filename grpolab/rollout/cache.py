"""The key/value-cache argument of a Hugging Face model's forward, shared by the decode loop and the training
passes (which run a prompt once and its completions against its cache)."""

from __future__ import annotations

import inspect


def cache_kwarg(model, cache) -> dict:
    """transformers >= 5.2x names the argument `cache`; earlier releases `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps forward(*args, **kw)
    params = inspect.signature(base.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}
