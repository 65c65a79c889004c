"""The function templates of the pyfunc task (grpolab.tasks.pyfunc): small integer, string, list and two-argument
transformations, each with a reference implementation and the kind of its argument(s).

A template has a key ("int.add"), a family (int, str, list, pair), a level (1: one operation; 2: two steps; 3: a
loop with a condition or several steps), a function-name pattern, an optional parameter kind (k: an integer
2..19, c: a letter, w: a short word), the argument kind and a description. The reference (``make(param)``) is trusted code run in the
trainer to compute the expected outputs of the hidden tests; the program under test never sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

LETTERS = "abcdeilnorst"
WORDS = ("ing", "ed", "er", "ly", "s", "pre", "un", "re")
K_VALUES = tuple(range(2, 20))
VOWELS = "aeiou"


@dataclass(frozen=True)
class Template:
    key: str
    family: str
    level: int
    name: str  # may contain {k} / {c} / {w}
    param: str | None  # "k" | "c" | "w" | None
    arg: str  # argument kind: "n", "n+" (n >= 0), "s", "xs", "xs+" (non-empty), "ab"
    text: str  # description, may contain {k} / {c} / {w}
    make: Callable[[Any], Callable[..., Any]]


def _t(key, level, name, param, arg, text, make) -> Template:
    return Template(key, key.split(".")[0], level, name, param, arg, text, make)


def _second_largest(xs):
    values = sorted(set(xs))
    return values[-2] if len(values) > 1 else values[0]


def _is_prime(n):
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _rotate(seq, k):
    return seq[k % len(seq):] + seq[:k % len(seq)] if len(seq) else seq


def _most_common(s):
    return max(s, key=lambda ch: (s.count(ch), -s.index(ch)))


def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def _running(xs):
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


TEMPLATES: tuple[Template, ...] = (
    # integers
    _t("int.add", 1, "add_{k}", "k", "n", "returns n plus {k}", lambda k: lambda n: n + k),
    _t("int.sub", 1, "subtract_{k}", "k", "n", "returns n minus {k}", lambda k: lambda n: n - k),
    _t("int.mul", 1, "times_{k}", "k", "n", "returns n multiplied by {k}", lambda k: lambda n: n * k),
    _t("int.mod", 1, "mod_{k}", "k", "n+", "returns the remainder of n divided by {k}", lambda k: lambda n: n % k),
    _t("int.div", 1, "div_{k}", "k", "n+", "returns n divided by {k}, rounded down to an integer", lambda k: lambda n: n // k),
    _t("int.multiple", 1, "is_multiple_of_{k}", "k", "n+", "returns True if n is divisible by {k}, else False",
       lambda k: lambda n: n % k == 0),
    _t("int.greater", 1, "greater_than_{k}", "k", "n", "returns True if n is greater than {k}, else False",
       lambda k: lambda n: n > k),
    _t("int.at_most", 1, "at_most_{k}", "k", "n", "returns the smaller of n and {k}", lambda k: lambda n: min(n, k)),
    _t("int.at_least", 1, "at_least_{k}", "k", "n", "returns the larger of n and {k}", lambda k: lambda n: max(n, k)),
    _t("int.distance", 2, "distance_to_{k}", "k", "n", "returns the absolute difference between n and {k}",
       lambda k: lambda n: abs(n - k)),
    _t("int.affine", 2, "double_plus_{k}", "k", "n", "returns two times n plus {k}", lambda k: lambda n: 2 * n + k),
    _t("int.square", 1, "square", None, "n", "returns n squared", lambda _: lambda n: n * n),
    _t("int.cube", 1, "cube", None, "n", "returns n cubed", lambda _: lambda n: n ** 3),
    _t("int.double", 1, "double", None, "n", "returns two times n", lambda _: lambda n: 2 * n),
    _t("int.negate", 1, "negate", None, "n", "returns minus n", lambda _: lambda n: -n),
    _t("int.is_even", 1, "is_even", None, "n", "returns True if n is even, else False", lambda _: lambda n: n % 2 == 0),
    _t("int.is_odd", 1, "is_odd", None, "n", "returns True if n is odd, else False", lambda _: lambda n: n % 2 == 1),
    _t("int.last_digit", 1, "last_digit", None, "n+", "returns the last decimal digit of n", lambda _: lambda n: n % 10),
    _t("int.digit_sum", 2, "digit_sum", None, "n+", "returns the sum of the decimal digits of n",
       lambda _: lambda n: sum(int(d) for d in str(n))),
    _t("int.num_digits", 2, "count_digits", None, "n+", "returns how many decimal digits n has",
       lambda _: lambda n: len(str(n))),
    _t("int.sign", 2, "sign", None, "n", "returns 1 if n is positive, -1 if n is negative and 0 if n is zero",
       lambda _: lambda n: (n > 0) - (n < 0)),
    # strings
    _t("str.repeat", 1, "repeat_{k}", "k", "s", "returns s repeated {k} times", lambda k: lambda s: s * k),
    _t("str.head", 1, "first_{k}_chars", "k", "s", "returns the first {k} characters of s (all of s if it is shorter)",
       lambda k: lambda s: s[:k]),
    _t("str.tail", 1, "last_{k}_chars", "k", "s", "returns the last {k} characters of s (all of s if it is shorter)",
       lambda k: lambda s: s[-k:]),
    _t("str.count", 1, "count_{c}", "c", "s", "returns how many times the letter '{c}' occurs in s",
       lambda c: lambda s: s.count(c)),
    _t("str.remove", 1, "remove_{c}", "c", "s", "returns s with every letter '{c}' removed",
       lambda c: lambda s: s.replace(c, "")),
    _t("str.starts", 1, "starts_with_{c}", "c", "s", "returns True if s starts with the letter '{c}', else False",
       lambda c: lambda s: s.startswith(c)),
    _t("str.ends", 1, "ends_with_{c}", "c", "s", "returns True if s ends with the letter '{c}', else False",
       lambda c: lambda s: s.endswith(c)),
    _t("str.star", 2, "star_{c}", "c", "s", "returns s with every letter '{c}' replaced by '*'",
       lambda c: lambda s: s.replace(c, "*")),
    _t("str.suffix", 1, "add_{w}", "w", "s", "returns s followed by '{w}'", lambda w: lambda s: s + w),
    _t("str.prefix", 1, "prefix_{w}", "w", "s", "returns '{w}' followed by s", lambda w: lambda s: w + s),
    _t("str.upper", 1, "to_upper", None, "s", "returns s in upper case", lambda _: lambda s: s.upper()),
    _t("str.reverse", 1, "reverse_string", None, "s", "returns s reversed", lambda _: lambda s: s[::-1]),
    _t("str.length", 1, "string_length", None, "s", "returns the number of characters in s", lambda _: lambda s: len(s)),
    _t("str.twice", 1, "say_twice", None, "s", "returns s followed by s", lambda _: lambda s: s + s),
    _t("str.first", 1, "first_char", None, "s+", "returns the first character of s", lambda _: lambda s: s[0]),
    _t("str.last", 1, "last_char", None, "s+", "returns the last character of s", lambda _: lambda s: s[-1]),
    _t("str.capitalize", 1, "capitalize_first", None, "s", "returns s with its first letter in upper case",
       lambda _: lambda s: s[:1].upper() + s[1:]),
    _t("str.vowels", 2, "count_vowels", None, "s", "returns how many vowels (a, e, i, o, u) s contains",
       lambda _: lambda s: sum(ch in VOWELS for ch in s)),
    _t("str.palindrome", 2, "is_palindrome", None, "s", "returns True if s reads the same backwards, else False",
       lambda _: lambda s: s == s[::-1]),
    _t("str.reverse_upper", 2, "shout_backwards", None, "s", "returns s reversed and in upper case",
       lambda _: lambda s: s[::-1].upper()),
    # lists of integers
    _t("list.add", 1, "add_{k}_to_each", "k", "xs", "returns a new list with {k} added to every element of xs",
       lambda k: lambda xs: [x + k for x in xs]),
    _t("list.greater", 1, "keep_greater_than_{k}", "k", "xs",
       "returns the elements of xs that are greater than {k}, in their order", lambda k: lambda xs: [x for x in xs if x > k]),
    _t("list.count", 1, "count_{k}s", "k", "xs", "returns how many elements of xs are equal to {k}",
       lambda k: lambda xs: xs.count(k)),
    _t("list.contains", 1, "contains_{k}", "k", "xs", "returns True if {k} is an element of xs, else False",
       lambda k: lambda xs: k in xs),
    _t("list.head", 1, "first_{k}_items", "k", "xs", "returns the first {k} elements of xs (all of xs if it is shorter)",
       lambda k: lambda xs: xs[:k]),
    _t("list.times", 2, "times_{k}_each", "k", "xs", "returns a new list with every element of xs multiplied by {k}",
       lambda k: lambda xs: [x * k for x in xs]),
    _t("list.sum", 1, "list_sum", None, "xs", "returns the sum of the elements of xs", lambda _: lambda xs: sum(xs)),
    _t("list.max", 1, "largest", None, "xs+", "returns the largest element of xs", lambda _: lambda xs: max(xs)),
    _t("list.min", 1, "smallest", None, "xs+", "returns the smallest element of xs", lambda _: lambda xs: min(xs)),
    _t("list.len", 1, "list_length", None, "xs", "returns the number of elements of xs", lambda _: lambda xs: len(xs)),
    _t("list.first", 1, "first_item", None, "xs+", "returns the first element of xs", lambda _: lambda xs: xs[0]),
    _t("list.last", 1, "last_item", None, "xs+", "returns the last element of xs", lambda _: lambda xs: xs[-1]),
    _t("list.reverse", 1, "reversed_list", None, "xs", "returns a new list with the elements of xs in reverse order",
       lambda _: lambda xs: xs[::-1]),
    _t("list.sorted", 1, "sorted_list", None, "xs", "returns a new list with the elements of xs in increasing order",
       lambda _: lambda xs: sorted(xs)),
    _t("list.evens", 1, "keep_evens", None, "xs", "returns the even elements of xs, in their order",
       lambda _: lambda xs: [x for x in xs if x % 2 == 0]),
    _t("list.double", 1, "double_each", None, "xs", "returns a new list with every element of xs doubled",
       lambda _: lambda xs: [2 * x for x in xs]),
    _t("list.desc", 2, "sorted_descending", None, "xs", "returns a new list with the elements of xs in decreasing order",
       lambda _: lambda xs: sorted(xs, reverse=True)),
    _t("list.squares", 2, "sum_of_squares", None, "xs", "returns the sum of the squares of the elements of xs",
       lambda _: lambda xs: sum(x * x for x in xs)),
    _t("list.count_even", 2, "count_evens", None, "xs", "returns how many elements of xs are even",
       lambda _: lambda xs: sum(x % 2 == 0 for x in xs)),
    _t("list.argmax", 2, "index_of_largest", None, "xs+", "returns the index of the first largest element of xs",
       lambda _: lambda xs: xs.index(max(xs))),
    _t("list.unique", 2, "unique_sorted", None, "xs", "returns the distinct elements of xs in increasing order",
       lambda _: lambda xs: sorted(set(xs))),
    _t("list.second", 2, "second_largest", None, "xs+",
       "returns the second largest distinct element of xs (the largest if all elements are equal)",
       lambda _: _second_largest),
    _t("list.range", 2, "value_range", None, "xs+", "returns the largest element of xs minus the smallest",
       lambda _: lambda xs: max(xs) - min(xs)),
    # level 3: loops with conditions, several steps
    _t("int.digit_product", 3, "digit_product", None, "n+", "returns the product of the decimal digits of n",
       lambda _: lambda n: __import__("math").prod(int(d) for d in str(n))),
    _t("int.prime", 3, "is_prime", None, "n+", "returns True if n is a prime number, else False", lambda _: _is_prime),
    _t("int.divisors", 3, "count_divisors", None, "n1", "returns how many positive integers divide n",
       lambda _: lambda n: sum(n % d == 0 for d in range(1, n + 1))),
    _t("int.reverse", 3, "reverse_digits", None, "n+", "returns the integer whose decimal digits are those of n in reverse order",
       lambda _: lambda n: int(str(n)[::-1])),
    _t("int.sum_multiples", 3, "sum_multiples_of_{k}", "k", "n+",
       "returns the sum of the multiples of {k} between 1 and n (inclusive)", lambda k: lambda n: sum(range(k, n + 1, k))),
    _t("int.next_multiple", 3, "next_multiple_of_{k}", "k", "n", "returns the smallest multiple of {k} that is >= n",
       lambda k: lambda n: -(-n // k) * k),
    _t("int.bits", 3, "count_one_bits", None, "n+", "returns how many 1 bits the binary form of n has",
       lambda _: lambda n: bin(n).count("1")),
    _t("int.max_digit", 3, "largest_digit", None, "n+", "returns the largest decimal digit of n",
       lambda _: lambda n: max(int(d) for d in str(n))),
    _t("int.triangle", 3, "sum_up_to", None, "n+", "returns the sum of the integers from 1 to n",
       lambda _: lambda n: n * (n + 1) // 2),
    _t("str.no_vowels", 3, "remove_vowels", None, "s", "returns s with every vowel (a, e, i, o, u) removed",
       lambda _: lambda s: "".join(ch for ch in s if ch not in VOWELS)),
    _t("str.words", 3, "count_words", None, "text", "returns the number of words in s", lambda _: lambda s: len(s.split())),
    _t("str.longest", 3, "longest_word", None, "text+",
       "returns the longest word in s (the first one if several are equally long)",
       lambda _: lambda s: max(s.split(), key=len)),
    _t("str.title", 3, "capitalize_words", None, "text",
       "returns s with the first letter of every word in upper case", lambda _: lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split(" "))),
    _t("str.reverse_words", 3, "reverse_words", None, "text", "returns the words of s in reverse order, separated by single spaces",
       lambda _: lambda s: " ".join(s.split()[::-1])),
    _t("str.acronym", 3, "initials", None, "text", "returns the first letters of the words of s, joined together",
       lambda _: lambda s: "".join(w[0] for w in s.split())),
    _t("str.even_chars", 3, "even_position_chars", None, "s",
       "returns the characters of s at positions 0, 2, 4, ..., joined together", lambda _: lambda s: s[::2]),
    _t("str.stutter", 3, "double_letters", None, "s", "returns s with every character written twice",
       lambda _: lambda s: "".join(ch * 2 for ch in s)),
    _t("str.most_common", 3, "most_common_char", None, "s+",
       "returns the character that occurs most often in s (of those, the one that occurs first in s)", lambda _: _most_common),
    _t("str.unique", 3, "all_different", None, "s", "returns True if no character occurs twice in s, else False",
       lambda _: lambda s: len(set(s)) == len(s)),
    _t("str.find", 3, "position_of_{c}", "c", "s", "returns the index of the first letter '{c}' in s, or -1 if there is none",
       lambda c: lambda s: s.find(c)),
    _t("str.rotate", 3, "rotate_string_{k}", "k", "s",
       "returns s with its first {k} characters moved to its end (rotating by {k} modulo the length of s; '' stays '')",
       lambda k: lambda s: _rotate(s, k)),
    _t("list.sum_greater", 3, "sum_above_{k}", "k", "xs", "returns the sum of the elements of xs that are greater than {k}",
       lambda k: lambda xs: sum(x for x in xs if x > k)),
    _t("list.sum_even", 3, "sum_of_evens", None, "xs", "returns the sum of the even elements of xs",
       lambda _: lambda xs: sum(x for x in xs if x % 2 == 0)),
    _t("list.product", 3, "product", None, "xs", "returns the product of the elements of xs (1 for an empty list)",
       lambda _: lambda xs: __import__("math").prod(xs)),
    _t("list.odd_squares", 3, "squares_of_odds", None, "xs", "returns the squares of the odd elements of xs, in their order",
       lambda _: lambda xs: [x * x for x in xs if x % 2]),
    _t("list.running", 3, "running_sums", None, "xs",
       "returns the list whose i-th element is the sum of the first i + 1 elements of xs", lambda _: _running),
    _t("list.rotate", 3, "rotate_left_{k}", "k", "xs",
       "returns xs rotated left by {k} positions (modulo the length of xs; [] stays [])", lambda k: lambda xs: _rotate(xs, k)),
    _t("list.every", 3, "every_{k}th", "k", "xs", "returns every {k}-th element of xs, starting with the first",
       lambda k: lambda xs: xs[::k]),
    _t("list.index", 3, "index_of_{k}", "k", "xs", "returns the index of the first element of xs equal to {k}, or -1",
       lambda k: lambda xs: xs.index(k) if k in xs else -1),
    _t("list.rises", 3, "count_rises", None, "xs", "returns how many elements of xs are greater than the element before them",
       lambda _: lambda xs: sum(b > a for a, b in zip(xs, xs[1:]))),
    _t("list.dupes", 3, "duplicates", None, "xs",
       "returns the values that occur more than once in xs, each once, in increasing order",
       lambda _: lambda xs: sorted({x for x in xs if xs.count(x) > 1})),
    _t("list.mean", 3, "mean_floor", None, "xs+", "returns the mean of xs rounded down to an integer",
       lambda _: lambda xs: sum(xs) // len(xs)),
    _t("list.even_odd", 3, "even_minus_odd", None, "xs",
       "returns the sum of the even elements of xs minus the sum of its odd elements",
       lambda _: lambda xs: sum(x for x in xs if x % 2 == 0) - sum(x for x in xs if x % 2)),
    _t("list.is_sorted", 3, "is_sorted", None, "xs", "returns True if the elements of xs never decrease, else False",
       lambda _: lambda xs: all(a <= b for a, b in zip(xs, xs[1:]))),
    _t("list.dedupe", 3, "remove_duplicates", None, "xs",
       "returns xs without repeated values, keeping the first occurrence of each, in order",
       lambda _: lambda xs: list(dict.fromkeys(xs))),
    _t("list.diffs", 3, "differences", None, "xs",
       "returns the differences between neighbouring elements of xs (each element minus the one before it)",
       lambda _: lambda xs: [b - a for a, b in zip(xs, xs[1:])]),
    _t("list.top2", 3, "two_largest", None, "xs2", "returns the two largest elements of xs, largest first",
       lambda _: lambda xs: sorted(xs, reverse=True)[:2]),
    _t("pair.gcd", 3, "gcd", None, "ab+", "returns the greatest common divisor of a and b", lambda _: _gcd),
    _t("pair.power", 3, "power", None, "ab0", "returns a to the power b", lambda _: lambda a, b: a ** b),
    _t("pair.range_sum", 3, "sum_between", None, "ab", "returns the sum of the integers from a to b inclusive (0 if a > b)",
       lambda _: lambda a, b: sum(range(a, b + 1))),
    _t("pair.range", 3, "numbers_between", None, "ab", "returns the list of the integers from a to b inclusive ([] if a > b)",
       lambda _: lambda a, b: list(range(a, b + 1))),
    # two integers
    _t("pair.add", 1, "add", None, "ab", "returns a plus b", lambda _: lambda a, b: a + b),
    _t("pair.sub", 1, "subtract", None, "ab", "returns a minus b", lambda _: lambda a, b: a - b),
    _t("pair.mul", 1, "multiply", None, "ab", "returns a multiplied by b", lambda _: lambda a, b: a * b),
    _t("pair.max", 1, "larger", None, "ab", "returns the larger of a and b", lambda _: lambda a, b: max(a, b)),
    _t("pair.min", 1, "smaller", None, "ab", "returns the smaller of a and b", lambda _: lambda a, b: min(a, b)),
    _t("pair.diff", 2, "difference", None, "ab", "returns the absolute difference between a and b",
       lambda _: lambda a, b: abs(a - b)),
    _t("pair.sum_squares", 2, "sum_squares", None, "ab", "returns a squared plus b squared",
       lambda _: lambda a, b: a * a + b * b),
    _t("pair.equal", 1, "same", None, "ab", "returns True if a equals b, else False", lambda _: lambda a, b: a == b),
)
ARG_NAMES = {"n": "n", "n+": "n", "n1": "n", "s": "s", "s+": "s", "text": "s", "text+": "s", "xs": "xs", "xs+": "xs",
             "xs2": "xs", "ab": "a, b", "ab+": "a, b", "ab0": "a, b"}
ARG_NOTES = {"n": "n is an integer", "n+": "n is an integer >= 0", "n1": "n is an integer >= 1",
             "s": "s is a string of lowercase letters", "s+": "s is a non-empty string of lowercase letters",
             "text": "s is a string of lowercase words separated by single spaces",
             "text+": "s is a non-empty string of lowercase words separated by single spaces",
             "xs": "xs is a list of integers", "xs+": "xs is a non-empty list of integers",
             "xs2": "xs is a list of at least two integers", "ab": "a and b are integers",
             "ab+": "a and b are integers >= 1", "ab0": "a and b are integers, b >= 0"}
PARAMS = {"k": K_VALUES, "c": tuple(LETTERS), "w": WORDS, None: (None,)}
