import math
import random

import pytest

from grpolab.errors import ConfigError
from grpolab.rewards import REWARD_FUNCTIONS, RewardResult, RewardSpec, score_completion
from grpolab.rewards.math import (
    correctness_reward,
    extract_answer,
    format_reward,
    normalize_answer,
    task_correctness_reward,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"x \boxed{{a}{b{c}}} y", r"{a}{b{c}}"),
        (r"\boxed{1} then \boxed{2} then \boxed{3}", "3"),  # last box wins
        (r"\boxed{7} but then \boxed{8", "7"),  # unclosed last box -> earlier complete box
        (r"\boxed{7} but then \boxed{{8}", "7"),
        (r"\boxed{8 and the answer is 12", "12"),  # no complete box -> last number
        (r"\boxed {5} and 6", "6"),  # only the exact spelling \boxed{ counts
        (r"\boxed{}", ""),
        ("first 3 then -3.5", "-3.5"),  # negatives and decimals
        ("total: 1,234,567 items", "1,234,567"),  # thousands commas
        ("I paid $1,000.00.", "1,000.00"),
        ("12,3456", "3456"),  # not a thousands group
        ("answer 42.", "42"),
        ("nothing here", None),
        ("", None),
        ("\\", None),
        ("}}}{{{", None),
        ("\x00\x07\x1b[31m 9 \x7f", "9"),
        ("٣", None),  # Arabic-Indic digit is not an ASCII number, and must not crash
        ("résultat: \\boxed{π/2} ✓", "π/2"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  42 ", "42"),
        ("$1,000.00$", "1000"),
        ("\\$1,000", "1000"),
        ("18.0", "18"),
        ("18.50", "18.5"),
        ("-0.0", "0"),
        ("+5", "5"),
        ("-3.5", "-3.5"),
        ("42.", "42"),
        ("007", "7"),
        (".5", "0.5"),
        ("1,00", "1,00"),  # not a thousands grouping: left as is
        (r" \frac{1}{2} ", r"\frac{1}{2}"),
        (r"\text{cat}", r"\text{cat}"),
        ("", ""),
        ("-", "-"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"so \boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
        ("I paid $1,000.00", "1000", 1.0),
        (r"\boxed{$1,000.00$}", "1,000", 1.0),
        (r"\boxed{18.0}", "18", 1.0),
        (r"\boxed{-4}", "4", 0.0),
        (r"\boxed{5} no wait \boxed{6}", "5", 0.0),
        ("the answer is 17", "17", 1.0),  # no box -> last number
        ("no answer at all", "0", 0.0),  # nothing extracted -> 0
        ("", "", 0.0),
    ],
)
def test_correctness_reward(completion, gold, expected):
    assert correctness_reward(completion, gold) == expected


@pytest.mark.parametrize(
    "completion, expected", [(r"\boxed{1}", 1.0), (r"\boxed{", 1.0), (r"\boxed {1}", 0.0), ("1", 0.0), ("", 0.0)]
)
def test_format_reward(completion, expected):
    assert format_reward(completion) == expected
    assert format_reward(completion, "gold is ignored") == expected


def _huge_random(n: int) -> str:
    rng = random.Random(0)
    alphabet = "0123456789,.-{}\\boxed $\n٣é\x00"
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize(
    "text",
    [
        _huge_random(1_000_000),
        "\\boxed{" * 100_000,
        "{" * 100_000,
        "}" * 100_000,
        "\\" * 100_000,
        "1," * 100_000,
        "1" * 1_000_000,
        "-" * 100_000 + "1",
        "\\boxed{" * 100_000 + "}" * 100_000,
    ],
    ids=[
        "random-1MB",
        "open-boxes",
        "open-braces",
        "close-braces",
        "backslashes",
        "commas",
        "digits",
        "minuses",
        "nested",
    ],
)
def test_pathological_inputs_return(text):
    # Written to be linear; this only checks that every public function returns a value.
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    assert isinstance(normalize_answer(text), str)
    assert correctness_reward(text, "1") in (0.0, 1.0)
    assert format_reward(text) in (0.0, 1.0)


def test_pathological_exact_values():
    assert extract_answer("\\boxed{" * 100_000) is None
    assert extract_answer("\\boxed{" * 3 + "x" + "}" * 3) == "x"  # innermost box starts last
    assert extract_answer("1" * 1_000_000) == "1" * 1_000_000
    assert extract_answer("-" * 10 + "1") == "-1"


def test_registry_entries():
    assert REWARD_FUNCTIONS["correct"].fn is task_correctness_reward and REWARD_FUNCTIONS["correct"].takes_problem
    assert REWARD_FUNCTIONS["format"].fn is format_reward
    for spec in REWARD_FUNCTIONS.values():  # code rewards: the sandbox enforces its own limits, no thread time limit
        assert isinstance(spec, RewardSpec) and spec.description
        assert spec.time_limit_s == 5.0 if spec.batch is None else spec.time_limit_s is None
    with pytest.raises(AttributeError):
        REWARD_FUNCTIONS["correct"].time_limit_s = 1.0  # frozen


@pytest.mark.parametrize(
    "completion, weights, total, components",
    [
        (r"\boxed{4}", {"correct": 1.0, "format": 0.1}, 1.1, {"correct": 1.0, "format": 1.0}),
        (r"\boxed{5}", {"correct": 1.0, "format": 0.1}, 0.1, {"correct": 0.0, "format": 1.0}),
        ("it is 4", {"correct": 1.0, "format": 0.1}, 1.0, {"correct": 1.0, "format": 0.0}),
        ("it is 4", {"correct": 2.0, "format": 0.0}, 2.0, {"correct": 1.0, "format": 0.0}),
        ("nope", {"correct": 1.0, "format": 0.1}, 0.0, {"correct": 0.0, "format": 0.0}),
        (r"\boxed{4}", {"format": -0.5}, -0.5, {"format": 1.0}),
        (r"\boxed{4}", {}, 0.0, {}),
    ],
)
def test_score_completion_weights(completion, weights, total, components):
    result = score_completion(completion, "4", weights)
    assert result == RewardResult(total=pytest.approx(total), components=components, invalid=False, error=None)
    assert result.total == pytest.approx(sum(w * result.components[k] for k, w in weights.items()))


def test_score_completion_unknown_component():
    with pytest.raises(ConfigError) as info:
        score_completion(r"\boxed{4}", "4", {"correct": 1.0, "lenght": 0.1})
    message = str(info.value)
    assert "'lenght'" in message and "'correct'" in message and "'format'" in message


def test_score_completion_raising_reward_is_invalid(monkeypatch):
    def broken(completion, gold):
        raise ValueError("bad gold")

    monkeypatch.setitem(REWARD_FUNCTIONS, "broken", RewardSpec(broken, "always raises"))
    result = score_completion(r"\boxed{4}", "4", {"correct": 1.0, "broken": 0.5})
    assert result.invalid is True
    assert math.isnan(result.total)
    assert result.error == "broken: ValueError: bad gold"
    assert result.components["correct"] == 1.0 and math.isnan(result.components["broken"])
