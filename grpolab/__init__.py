"""grpolab: GRPO post-training with explicit algorithm identity and held-out evidence."""

__version__ = "0.1.0"
