"""Generates the task families shipped in trainer/tasks/data/families/: two convention families, whose correct
answer depends on a convention no model can guess but one experience (a rule or a worked example) can carry,
and one verifier-only family, whose tasks have unit tests but no reference answer.

    python -m zoo.trainer.tasks.families [--seed 0] [--out trainer/tasks/data/families]

They exist to show learning. Arithmetic a model already half knows moves little with experience; on
these, zero-shot scores are near 0 (or chance for labels) on any model, and what a learned library holds
is exactly what is missing. Two families, each split into train (what a run learns from), validation (what
decides keep or revert) and test (held out: only the benchmark scores it):

- conventions.lengths (`lengths-*.jsonl`): lengths are recorded in centimetres. "A shelf is 3 m long. How
  long is the shelf in the record?" has the answer 300 (exact_match reads "300 cm" as 300, "3 m" as 3).
  Each task carries its working as `reasoning` ("3 m 25 cm = 3 × 100 + 25 = 325 cm."), as a dataset with
  worked solutions does: three quarters of the tasks add centimetres to metres, arithmetic the bundled
  model gets wrong from a bare answer but copies from shown working.
- conventions.habitats (`habitats-*.jsonl`): animals are filed under one of two labels, WET (lives in or
  by water) or DRY. "Under which label is the otter filed?" has the answer WET.
- code.functions (`functions-*.jsonl`): "Write a Python function `add_7(x)` that returns x plus 7",
  checked by three unit tests in the sandbox (unit_tests: the share that pass) and with no reference
  answer, so plain SFT has nothing to learn from: what TF-GRPO, GSPO and rejection-sampling fine-tuning
  (sample, keep what passes, fine-tune) compete on. Twelve templates, each with parameters 2 to 9.

The output depends only on the seed (random.Random(seed), fixed word lists), so running this again
reproduces the committed files byte for byte (a test checks it). The tasks carry no instruction of their
own: they are asked under the general "end with a line 'Answer: …'" instruction of non-math domains.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from zoo.trainer.tasks.schema import DATA_DIR, Task, write_jsonl

FAMILIES_DIR = DATA_DIR / "families"
SPLITS = (("train", 24), ("validation", 12), ("test", 16))

_OBJECTS = [
    "shelf", "rope", "ribbon", "plank", "table", "curtain", "ladder", "carpet", "hose", "fence",
    "bench", "pole", "scarf", "cable", "banner", "desk", "mirror", "board", "tent", "kite",
]  # fmt: skip
_WET = [
    "otter", "dolphin", "frog", "salmon", "seal", "duck", "crab", "beaver", "whale", "newt", "eel",
    "penguin", "walrus", "jellyfish", "turtle", "heron", "octopus", "pelican", "shark", "swan", "toad",
    "lobster", "manatee", "hippo", "flamingo", "catfish",
]  # fmt: skip
_DRY = [
    "camel", "lion", "goat", "eagle", "zebra", "lizard", "fox", "horse", "owl", "rabbit", "cheetah",
    "scorpion", "wolf", "sheep", "giraffe", "squirrel", "hawk", "tortoise", "badger", "ostrich", "bison",
    "falcon", "hedgehog", "kangaroo", "armadillo", "meerkat",
]  # fmt: skip


def lengths(rng: random.Random) -> list[Task]:
    """Lengths in metres (and metres with centimetres) whose recorded answer is in centimetres."""
    pairs: set[tuple[str, int, str]] = set()
    while len(pairs) < sum(n for _, n in SPLITS):
        thing = rng.choice(_OBJECTS)
        metres = rng.randint(1, 9)
        extra = rng.choice([0, 0, 10, 20, 25, 40, 50, 75])
        said = f"{metres} m" if not extra else f"{metres} m {extra} cm"
        working = f"{metres} × 100" if not extra else f"{metres} × 100 + {extra}"
        answer = 100 * metres + extra
        question = f"A {thing} is {said} long. How long is the {thing} in the record?"
        pairs.add((question, answer, f"{said} = {working} = {answer} cm."))
    ordered = sorted(pairs)
    rng.shuffle(ordered)
    return [
        Task(id=f"len-{i + 1:03d}", question=q, answer=str(a), domain="conventions.lengths", reasoning=r)
        for i, (q, a, r) in enumerate(ordered)
    ]


def habitats(rng: random.Random) -> list[Task]:
    """Animals filed under WET or DRY, half of each in every split (copying one label scores 0.5)."""
    total = sum(n for _, n in SPLITS)
    wet, dry = rng.sample(_WET, total // 2), rng.sample(_DRY, total // 2)
    animals: list[tuple[str, str]] = []
    for _, n in SPLITS:
        part = [(wet.pop(), "WET") for _ in range(n // 2)] + [(dry.pop(), "DRY") for _ in range(n // 2)]
        rng.shuffle(part)
        animals += part
    return [
        Task(id=f"hab-{i + 1:03d}", question=f"Under which label is the {animal} filed?", answer=label,
             domain="conventions.habitats")
        for i, (animal, label) in enumerate(animals)
    ]  # fmt: skip


# Small Python functions, each named for its own parameter k ("add_7"), described in a sentence and checked
# by three unit tests: (name, description, the result as a Python expression of x and k, test inputs of k).
_FUNCTIONS: list[tuple[str, str, str, Callable[[int], list[object]]]] = [
    ("add_{k}", "returns x plus {k}", "x + k", lambda k: [0, 5, -3]),
    ("times_{k}", "returns x multiplied by {k}", "x * k", lambda k: [0, 3, -2]),
    ("minus_{k}", "returns x minus {k}", "x - k", lambda k: [0, 10, -4]),
    ("square_plus_{k}", "returns the square of x plus {k}", "x * x + k", lambda k: [0, 3, -2]),
    ("is_multiple_of_{k}", "returns True when the integer x is divisible by {k}, else False", "x % k == 0",
     lambda k: [0, k, k + 1]),
    ("at_most_{k}", "returns the smaller of x and {k}", "min(x, k)", lambda k: [k - 5, k, k + 7]),
    ("repeat_{k}", "returns the string x repeated {k} times", "x * k", lambda k: ["ab", "", "z"]),
    ("first_{k}", "returns a list of the first {k} items of the list x", "x[:k]",
     lambda k: [list(range(1, 11)), [], [5]]),
    ("count_over_{k}", "returns how many numbers in the list x are greater than {k}",
     "sum(1 for v in x if v > k)", lambda k: [[k, k + 1, k + 2], [], [k - 1, k + 10]]),
    ("sum_over_{k}", "returns the sum of the numbers in the list x that are greater than {k}",
     "sum(v for v in x if v > k)", lambda k: [[k, k + 1, k + 2], [], [k - 1, k + 10]]),
    ("pad_{k}", "returns the string x followed by {k} dots", "x + '.' * k", lambda k: ["a", "", "xyz"]),
    ("last_digit_times_{k}", "returns the last decimal digit of the non-negative integer x, times {k}",
     "(x % 10) * k", lambda k: [7, 120, 45]),
]  # fmt: skip


def functions(rng: random.Random) -> list[Task]:
    """Small Python functions checked by unit tests, with no reference answer (a verifier-only family):
    each template with several parameters, no two tasks the same function."""
    total = sum(n for _, n in SPLITS)
    combos = [(i, k) for i in range(len(_FUNCTIONS)) for k in range(2, 10)]
    rng.shuffle(combos)
    out = []
    for n, (i, k) in enumerate(combos[:total]):
        name, said, result, inputs = _FUNCTIONS[i]
        fn = name.format(k=k)
        tests = f"from solution import {fn}\n"
        for j, x in enumerate(inputs(k)):
            expected = eval(result, {"x": x, "k": k})  # this module's own templates, never task input
            tests += f"\n\ndef test_{j}():\n    assert {fn}({x!r}) == {expected!r}\n"
        question = (f"Write a Python function `{fn}(x)` that {said.format(k=k)}. Reply with the complete "
                    "function in a ```python code block.")  # fmt: skip
        out.append(Task(id=f"fn-{n + 1:03d}", question=question, domain="code.functions",
                        verifier="unit_tests", verifier_args={"tests": tests}))  # fmt: skip
    return out


FAMILIES = {"lengths": lengths, "habitats": habitats}
# Families whose tasks have a verifier but no reference answer: what SFT cannot learn from, and where
# TF-GRPO, GSPO and rejection-sampling fine-tuning compete.
VERIFIER_ONLY = {"functions": functions}

# Each family's convention as a person would state it: the rule an ideal lesson carries (benchmarks use it
# to measure how far a correct rule moves a model, wherever it sits in the prompt; runs never see it).
CONVENTIONS = {
    "lengths": "When recording a length, convert it to centimetres and write only the number (3 m -> 300).",
    "habitats": "When asked for an animal's label, answer WET if it lives in or by water, otherwise DRY.",
}


def generate(name: str, seed: int = 0) -> dict[str, list[Task]]:
    """The family's tasks cut into its splits (train, validation, test), in a fixed order."""
    tasks = {**FAMILIES, **VERIFIER_ONLY}[name](random.Random(f"{name}:{seed}"))
    out: dict[str, list[Task]] = {}
    start = 0
    for split_name, n in SPLITS:
        out[split_name] = tasks[start : start + n]
        start += n
    return out


def path(name: str, split_name: str, root: Path = FAMILIES_DIR) -> Path:
    """Where a family's split is shipped, e.g. trainer/tasks/data/families/lengths-test.jsonl."""
    return root / f"{name}-{split_name}.jsonl"


def write(out_dir: Path = FAMILIES_DIR, seed: int = 0) -> dict[str, dict[str, int]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, dict[str, int]] = {}
    for name in (*FAMILIES, *VERIFIER_ONLY):
        for split_name, tasks in generate(name, seed).items():
            write_jsonl(path(name, split_name, out_dir), tasks)
            sizes.setdefault(name, {})[split_name] = len(tasks)
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=FAMILIES_DIR)
    args = parser.parse_args(argv)
    for name, sizes in write(args.out, args.seed).items():
        print(f"{name}: " + ", ".join(f"{n} {s}" for s, n in sizes.items()) + f" tasks in {args.out}")


if __name__ == "__main__":
    main()
