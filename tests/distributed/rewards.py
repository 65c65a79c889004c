"""Rewards a random tiny model earns, for the data-parallel tests (user reward functions, grpolab.rewards.user)."""


def vowel_share(completion: str, problem) -> float:
    """Share of vowels among the letters of the completion: varies within every group."""
    letters = [c for c in completion.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def has_e(completion: str, problem) -> float:
    """1 when the completion contains an 'e': some groups are all 0 or all 1 (zero variance), some are mixed."""
    return float("e" in completion.lower())
