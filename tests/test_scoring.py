import threading

import numpy as np
import pytest

from grpolab.evaluation.scoring import (
    bootstrap_ci,
    extract_final,
    gsm8k_flexible,
    gsm8k_strict,
    is_correct,
    is_equivalent_answers,
    maj_at_k,
    mean_at_k,
    paired_bootstrap_diff,
    pass_at_k,
)

PROSE = "To add 3 and 6 we count up, which is 10. So, 3 + 6 = 9."


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("0.5", r"\frac{1}{2}", True),
        ("1,000", "1000", True),
        ("x=3", "3", True),
        (r"The answer is \boxed{\frac{1}{2}}", "0.5", True),
        ("3", "4", False),
        ("so 4 + 1 = 5.", "5", True),
        (PROSE, "9", True),
        (PROSE, "10", False),
        ("-7", "-7", True),
        ("7", "-7", False),
        ("-7", "7", False),
        ("The answer is 10. Wait, no: I think the answer is 12, then I got 13", "13", True),
        (r"\boxed{18} and then I rambled about 19", "18", True),
        (r"\boxed{1} first, finally \boxed{2}", "2", True),
        ("He pays $1,200.", "1200", True),
        (r"so we get $x = \frac{3}{4}$.", "0.75", True),
        (r"the value is \sqrt{2}", "2", True),  # no delimiters: the last number wins
        (r"the value is $\sqrt{2}$", "2", False),
        ("1/2", "0.5", True),
    ],
)
def test_is_correct(completion, gold, expected):
    assert is_correct(completion, gold) is expected


@pytest.mark.parametrize(
    "garbage",
    ["", "   ", "{{{\\boxed{", "\\boxed{}", "$$$", "\\frac{", "}{}{", "\\boxed{a}b{", "\x00\x01", "1/0", "9" * 400],
)
def test_is_correct_never_raises(garbage):
    assert is_correct(garbage, "3") is False
    assert is_correct("3", garbage) in (False, True)  # must not raise
    assert is_correct(None, "3") is False  # type: ignore[arg-type]


def test_is_correct_off_main_thread():
    out = {}
    t = threading.Thread(target=lambda: out.update(r=is_correct(PROSE, "9"), w=is_correct(PROSE, "10")))
    t.start()
    t.join()
    assert out == {"r": True, "w": False}


def test_extract_final():
    assert extract_final(PROSE) == "9"
    assert extract_final(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_final(r"\boxed{\text{a}{b}} then 7") == r"\text{a}{b}"
    assert extract_final("{{{\\boxed{ 4") == "4"  # unclosed box: fall back to last number
    assert extract_final("3-4") == "4" and extract_final("x = -4") == "-4"
    assert extract_final("paid $5 and $7") == "7"
    assert extract_final(r"we get $-\frac{1}{2}$") == r"-\frac{1}{2}"
    assert extract_final("nothing") is None


def test_gsm8k_strict_and_flexible():
    assert gsm8k_strict(r"blah 3 \boxed{1,000}", "1000")
    assert gsm8k_strict(r"\boxed{\$18}", "18") and gsm8k_strict(r"\boxed{18.00}", "18")
    assert not gsm8k_strict("the answer is 1000", "1000")
    assert not gsm8k_strict(r"\boxed{18} then \boxed{19}", "18")
    assert not gsm8k_strict(r"\boxed{x=18}", "18")
    assert not gsm8k_strict(r"\boxed{18", "18")
    assert gsm8k_flexible(PROSE, "9") and not gsm8k_flexible(PROSE, "10")
    assert gsm8k_flexible("It costs $1,234.", "1,234")
    assert gsm8k_flexible("so -7", "-7") and not gsm8k_flexible("so 7", "-7")
    assert not gsm8k_flexible("no number", "3") and not gsm8k_flexible("3", "three")


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_equals_brute_force_enumeration(n):
    """pass@k = the share of the C(n, k) ways to pick k of the n samples that contain at least one correct one,
    counted by enumerating every subset (for the diversity check: k = 8 of n = 8 samples is 'any correct')."""
    import itertools

    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
    assert pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 0, 8) == 0.0


def test_bootstrap_ci_draws_its_problems_from_bootstrap_indices():
    from grpolab.evaluation.scoring import bootstrap_indices

    v = np.random.default_rng(0).random(30)
    idx = np.concatenate(list(bootstrap_indices(30, 500, seed=4)))
    assert idx.shape == (500, 30) and idx.min() >= 0 and idx.max() <= 29
    means = v[idx].mean(axis=1)
    assert bootstrap_ci(v, n_boot=500, seed=4) == pytest.approx((v.mean(), *np.quantile(means, [0.025, 0.975])))
    big = list(bootstrap_indices(500_000, 20, seed=0))  # chunks bound memory: 8 draws of 500k indices per chunk
    assert [c.shape for c in big] == [(8, 500_000), (8, 500_000), (4, 500_000)]


def test_pass_at_k():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 4, 2) == 1.0  # n - c < k
    assert pass_at_k(200, 13, 10) == pytest.approx(1 - np.prod([(187 - i) / (200 - i) for i in range(10)]))
    for bad in [(3, 1, 4), (3, 4, 1), (3, -1, 1), (3, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_maj_at_k():
    assert maj_at_k(["3", "4", "4", "3"], "3")  # tie: first seen wins
    assert not maj_at_k(["3", "4", "4", "3"], "4")
    # equivalent answers are pooled: {2: 2 votes}, {1/2: 2 votes}; "2" was seen first
    assert maj_at_k(["2", r"\frac{1}{2}", "0.5", "2"], "2")
    assert maj_at_k([r"\frac{1}{2}", "2", "0.5", "2"], "0.5")
    assert maj_at_k([None, None, "5", "6"], "5")
    assert not maj_at_k([None, None], "5") and not maj_at_k([], "5")
    assert maj_at_k(["a", "b", "b"], "b", equal=str.__eq__)


def test_mean_at_k():
    assert mean_at_k([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        mean_at_k([])


def test_bootstrap_ci_width():
    x = (np.random.default_rng(1).random(1000) < 0.3).astype(float)
    mean, lo, hi = bootstrap_ci(x)
    assert mean == pytest.approx(x.mean())
    assert lo < mean < hi
    expected = 2 * 1.96 * np.sqrt(0.3 * 0.7 / 1000)
    assert abs((hi - lo) - expected) < 0.2 * expected
    assert bootstrap_ci(list(x)) == (mean, lo, hi)  # deterministic, list input


def test_bootstrap_ci_coverage():
    rng = np.random.default_rng(123)
    covered = 0
    for i in range(200):
        x = (rng.random(200) < 0.6).astype(float)
        _, lo, hi = bootstrap_ci(x, n_boot=500, seed=i)
        covered += lo <= 0.6 <= hi
    assert 0.90 <= covered / 200 <= 0.99


def test_bootstrap_ci_chunking_and_errors():
    x = np.random.default_rng(0).random(50_000)
    mean, lo, hi = bootstrap_ci(x, n_boot=300)
    assert lo < mean < hi and hi - lo < 0.02
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_paired_bootstrap_diff():
    a = np.random.default_rng(2).random(300)
    assert paired_bootstrap_diff(a, a) == (0.0, 0.0, 0.0)
    assert paired_bootstrap_diff(a, a + 1) == pytest.approx((1.0, 1.0, 1.0))
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        (r"\frac{2}{4}", "0.5", True),
        (r"\sqrt{4}", "2", True),
        ("10^3", "1000", True),
        ("1,000,000", "1000000", True),
        ("-0.5", r"\frac{1}{2}", False),
        ("3.0001", "3", False),
        ("1,000", "100", False),
        ("x=3", "4", False),
        ("0.5", r"\frac{1}{3}", False),
    ],
)
def test_equivalence_beyond_string_match(answer, gold, expected):
    """Equivalent pairs here are all missed by a naive string match; the non-equivalent ones look alike."""
    assert is_equivalent_answers(answer, gold) is expected
    if expected:
        assert answer.strip() != gold.strip()
