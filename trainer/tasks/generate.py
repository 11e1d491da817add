"""Generates the task set shipped in trainer/tasks/data/: small, exactly checkable problems for CPU runs.

    python -m zoo.trainer.tasks.generate [--seed 0] [--out trainer/tasks/data] [--validation-fraction 0.2]

Three domains, chosen so that the bundled 135M model has a chance on some of them and every answer can
be verified without a judge:

- math.arithmetic (60): one- and two-step word problems (add, take away, groups of, share equally,
  buy-then-use) with operands up to 20 and results up to 100; verifier exact_match.
- math.units (40): km <-> m, hours <-> minutes, kg <-> g with whole-number answers; exact_match.
- code.python (8): tiny functions, each with 3-5 unit tests and a reference solution as the answer;
  verifier unit_tests.

The output depends only on the seed (random.Random(seed), fixed template and name lists), so running this
again reproduces the committed files byte for byte (a test checks it). The split is tasks.split with the
same seed: stratified by domain, 20% to validation.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from zoo.trainer.tasks.schema import DATA_DIR, Task, split, write_jsonl

N_ARITHMETIC = 60
N_UNITS = 40
VALIDATION_FRACTION = 0.2

_PEOPLE = [
    ("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Mia", "she"), ("Sam", "he"), ("Lily", "she"),
    ("Omar", "he"), ("Zoe", "she"), ("Leo", "he"), ("Emma", "she"), ("Raj", "he"), ("Nina", "she"),
]  # fmt: skip
_ITEMS = [
    "apples",
    "marbles",
    "stickers",
    "books",
    "pencils",
    "cookies",
    "cards",
    "stamps",
    "shells",
    "balloons",
]


def _add(rng: random.Random) -> tuple[str, int]:
    (name, he), item = rng.choice(_PEOPLE), rng.choice(_ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return (
        f"{name} has {a} {item}. {he.capitalize()} gets {b} more. How many {item} does {name} have now?",
        a + b,
    )


def _subtract(rng: random.Random) -> tuple[str, int]:
    (name, _), item = rng.choice(_PEOPLE), rng.choice(_ITEMS)
    a = rng.randint(5, 20)
    b = rng.randint(1, a - 1)
    return (
        f"{name} has {a} {item} and gives {b} of them to a friend. How many {item} does {name} have left?",
        a - b,
    )


def _multiply(rng: random.Random) -> tuple[str, int]:
    item = rng.choice(_ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"There are {a} boxes with {b} {item} in each box. How many {item} are there in total?", a * b


def _divide(rng: random.Random) -> tuple[str, int]:
    (name, _), item = rng.choice(_PEOPLE), rng.choice(_ITEMS)
    friends, each = rng.randint(2, 6), rng.randint(2, 9)
    question = (
        f"{name} shares {friends * each} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return question, each


def _two_step(rng: random.Random) -> tuple[str, int]:
    (name, he), item = rng.choice(_PEOPLE), rng.choice(_ITEMS)
    a, b = rng.randint(3, 15), rng.randint(2, 10)
    c = rng.randint(1, a + b - 1)
    question = (
        f"{name} has {a} {item}. {he.capitalize()} buys {b} more and then gives away {c}. "
        f"How many {item} does {name} have now?"
    )
    return question, a + b - c


_ARITHMETIC: list[Callable[[random.Random], tuple[str, int]]] = [
    _add,
    _subtract,
    _multiply,
    _divide,
    _two_step,
]

# (question templates, factor, direction): "up" multiplies the drawn value by factor, "down" divides.
_CONVERSIONS = [
    (["How many meters are in {v} kilometers?", "A trail is {v} kilometers long. How long is it in meters?"],
     1000, "up"),
    (["How many kilometers are {v} meters?", "A race is {v} meters long. How many kilometers is that?"],
     1000, "down"),
    (["How many minutes are in {v} hours?", "A trip takes {v} hours. How many minutes is that?"], 60, "up"),
    (["How many hours are {v} minutes?", "A movie marathon lasts {v} minutes. How many hours is that?"],
     60, "down"),
    (["How many grams are in {v} kilograms?", "A bag of rice weighs {v} kilograms. How many grams is that?"],
     1000, "up"),
    (["How many kilograms are {v} grams?", "A parcel weighs {v} grams. How many kilograms is that?"],
     1000, "down"),
]  # fmt: skip


def _unit_task(rng: random.Random, index: int) -> tuple[str, int]:
    templates, factor, direction = _CONVERSIONS[index % len(_CONVERSIONS)]
    whole = rng.randint(1, 12)
    template = rng.choice(templates)
    if direction == "up":
        return template.format(v=whole), whole * factor
    return template.format(v=whole * factor), whole


# name: (description, reference solution, tests)
_CODING: dict[str, tuple[str, str, str]] = {
    "reverse_string": (
        "Write a Python function `reverse_string(s: str) -> str` that returns `s` reversed, "
        'e.g. reverse_string("abc") == "cba".',
        "def reverse_string(s: str) -> str:\n    return s[::-1]\n",
        "from solution import reverse_string\n\n\n"
        'def test_word():\n    assert reverse_string("abc") == "cba"\n\n\n'
        'def test_empty():\n    assert reverse_string("") == ""\n\n\n'
        'def test_palindrome():\n    assert reverse_string("level") == "level"\n\n\n'
        'def test_spaces():\n    assert reverse_string("a b") == "b a"\n',
    ),
    "sum_list": (
        "Write a Python function `sum_list(numbers: list[int]) -> int` that returns the sum of the numbers "
        "(0 for an empty list).",
        "def sum_list(numbers: list[int]) -> int:\n    total = 0\n    for n in numbers:\n        total += n\n"
        "    return total\n",
        "from solution import sum_list\n\n\n"
        "def test_small():\n    assert sum_list([1, 2, 3]) == 6\n\n\n"
        "def test_empty():\n    assert sum_list([]) == 0\n\n\n"
        "def test_negative():\n    assert sum_list([-4, 4, -1]) == -1\n",
    ),
    "is_palindrome": (
        "Write a Python function `is_palindrome(s: str) -> bool` that returns True when `s` reads the same "
        "forwards and backwards, ignoring case.",
        "def is_palindrome(s: str) -> bool:\n    s = s.lower()\n    return s == s[::-1]\n",
        "from solution import is_palindrome\n\n\n"
        'def test_yes():\n    assert is_palindrome("racecar") is True\n\n\n'
        'def test_no():\n    assert is_palindrome("python") is False\n\n\n'
        'def test_case():\n    assert is_palindrome("Anna") is True\n\n\n'
        'def test_empty():\n    assert is_palindrome("") is True\n',
    ),
    "count_vowels": (
        "Write a Python function `count_vowels(s: str) -> int` that returns how many vowels (a, e, i, o, u, "
        "upper or lower case) `s` contains.",
        'def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c in "aeiou")\n',
        "from solution import count_vowels\n\n\n"
        'def test_word():\n    assert count_vowels("banana") == 3\n\n\n'
        'def test_upper():\n    assert count_vowels("AEIOU") == 5\n\n\n'
        'def test_none():\n    assert count_vowels("rhythm") == 0\n',
    ),
    "largest": (
        "Write a Python function `largest(numbers: list[int]) -> int` that returns the largest number in a "
        "non-empty list.",
        "def largest(numbers: list[int]) -> int:\n    best = numbers[0]\n    for n in numbers[1:]:\n"
        "        if n > best:\n            best = n\n    return best\n",
        "from solution import largest\n\n\n"
        "def test_mixed():\n    assert largest([3, 9, 2]) == 9\n\n\n"
        "def test_single():\n    assert largest([7]) == 7\n\n\n"
        "def test_negative():\n    assert largest([-5, -2, -9]) == -2\n",
    ),
    "factorial": (
        "Write a Python function `factorial(n: int) -> int` that returns n! for n >= 0 (factorial(0) == 1).",
        "def factorial(n: int) -> int:\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n"
        "    return result\n",
        "from solution import factorial\n\n\n"
        "def test_zero():\n    assert factorial(0) == 1\n\n\n"
        "def test_one():\n    assert factorial(1) == 1\n\n\n"
        "def test_five():\n    assert factorial(5) == 120\n\n\n"
        "def test_ten():\n    assert factorial(10) == 3628800\n",
    ),
    "fizzbuzz": (
        'Write a Python function `fizzbuzz(n: int) -> str` that returns "FizzBuzz" if n is divisible by 15, '
        '"Fizz" if by 3, "Buzz" if by 5, and otherwise the number as a string.',
        'def fizzbuzz(n: int) -> str:\n    if n % 15 == 0:\n        return "FizzBuzz"\n    if n % 3 == 0:\n'
        '        return "Fizz"\n    if n % 5 == 0:\n        return "Buzz"\n    return str(n)\n',
        "from solution import fizzbuzz\n\n\n"
        'def test_fizz():\n    assert fizzbuzz(9) == "Fizz"\n\n\n'
        'def test_buzz():\n    assert fizzbuzz(10) == "Buzz"\n\n\n'
        'def test_fizzbuzz():\n    assert fizzbuzz(30) == "FizzBuzz"\n\n\n'
        'def test_number():\n    assert fizzbuzz(7) == "7"\n',
    ),
    "word_count": (
        "Write a Python function `word_count(text: str) -> int` that returns the number of words in `text`, "
        "where words are separated by whitespace.",
        "def word_count(text: str) -> int:\n    return len(text.split())\n",
        "from solution import word_count\n\n\n"
        'def test_sentence():\n    assert word_count("the cat sat") == 3\n\n\n'
        'def test_empty():\n    assert word_count("") == 0\n\n\n'
        'def test_extra_spaces():\n    assert word_count("  a   b  ") == 2\n\n\n'
        'def test_newlines():\n    assert word_count("one\\ntwo\\tthree") == 3\n',
    ),
}

CODE_INSTRUCTION = " Reply with the complete function in a ```python code block."


def _unique(make: Callable[[], tuple[str, int]], seen: set[str]) -> tuple[str, int]:
    # Redraw until the question is new; the draws are deterministic, so the result is too.
    for _ in range(1000):
        question, answer = make()
        if question not in seen:
            seen.add(question)
            return question, answer
    raise RuntimeError("could not draw a new question; the templates are too narrow")


def generate(seed: int = 0) -> list[Task]:
    """All shipped tasks, in a fixed order: arithmetic, units, coding."""
    rng = random.Random(seed)
    seen: set[str] = set()
    tasks: list[Task] = []
    for i in range(N_ARITHMETIC):
        template = _ARITHMETIC[i % len(_ARITHMETIC)]
        question, answer = _unique(lambda t=template: t(rng), seen)
        tasks.append(
            Task(id=f"arith-{i + 1:03d}", question=question, answer=str(answer), domain="math.arithmetic")
        )
    for i in range(N_UNITS):
        question, answer = _unique(lambda i=i: _unit_task(rng, i), seen)
        tasks.append(
            Task(id=f"units-{i + 1:03d}", question=question, answer=str(answer), domain="math.units")
        )
    for name, (description, solution, tests) in _CODING.items():
        tasks.append(
            Task(
                id=f"code-{name.replace('_', '-')}",
                question=description + CODE_INSTRUCTION,
                answer=solution,
                domain="code.python",
                verifier="unit_tests",
                verifier_args={"tests": tests},
            )
        )
    return tasks


def write(out_dir: Path, seed: int = 0, validation_fraction: float = VALIDATION_FRACTION) -> tuple[int, int]:
    """Generate, split and write train.jsonl and validation.jsonl; returns (train size, validation size)."""
    train, validation = split(generate(seed), validation_fraction, seed)
    write_jsonl(out_dir / "train.jsonl", train)
    write_jsonl(out_dir / "validation.jsonl", validation)
    return len(train), len(validation)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--validation-fraction", type=float, default=VALIDATION_FRACTION)
    args = parser.parse_args(argv)
    n_train, n_val = write(args.out, args.seed, args.validation_fraction)
    print(f"wrote {n_train} train and {n_val} validation tasks to {args.out}")


if __name__ == "__main__":
    main()
