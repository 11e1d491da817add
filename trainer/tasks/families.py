"""Generates the task families shipped in trainer/tasks/data/families/: two convention families, whose correct
answer depends on a convention no model can guess but one experience (a rule or a worked example) can carry,
and one verifier-only family, whose tasks have unit tests but no reference answer.

    python -m zoo.trainer.tasks.families [--seed 0] [--out trainer/tasks/data/families]

They exist to show learning. Arithmetic a model already half knows moves little with experience; on
these, zero-shot scores are near 0 (or chance for labels) on any model, and what a learned library holds
is exactly what is missing. Three families, each split into train (what a run learns from), validation
(what decides keep or revert) and test (held out: only the benchmark scores it):

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
    ("even_plus_odd_times_{k}",
     "returns x plus {k} when the integer x is even, and x times {k} when it is odd",
     "x + k if x % 2 == 0 else x * k", lambda k: [4, 3, 0]),
    ("drop_multiples_of_{k}", "returns the list x without the items that are multiples of {k}",
     "[v for v in x if v % k != 0]", lambda k: [list(range(1, 13)), [], [k, k + 1]]),
    ("vowels_to_{k}", "returns the string x with every vowel (a, e, i, o, u) replaced by the digit {k}",
     "''.join(str(k) if c in 'aeiou' else c for c in x)", lambda k: ["banana", "", "xyz"]),
    ("digit_sum_times_{k}", "returns the sum of the decimal digits of the non-negative integer x, times {k}",
     "sum(int(d) for d in str(x)) * k", lambda k: [0, 123, 9]),
    ("rotate_left_{k}", "returns the list x rotated left by {k} positions (an empty list stays empty)",
     "x[k % len(x):] + x[:k % len(x)] if x else []", lambda k: [[1, 2, 3, 4, 5], [], [7]]),
    ("long_words_over_{k}", "returns how many words of the string x have more than {k} letters",
     "sum(1 for w in x.split() if len(w) > k)", lambda k: ["a bb ccc dddd eeeee ffffff", "", "hello world"]),
    ("upper_every_{k}", "returns the string x with its characters at indexes divisible by {k} upper-cased",
     "''.join(c.upper() if i % k == 0 else c for i, c in enumerate(x))", lambda k: ["abcdefgh", "", "xy"]),
    ("kth_smallest_{k}", "returns the {k}-th smallest number of the list x (counting from 1), or None when "
     "x has fewer than {k} items", "sorted(x)[k - 1] if len(x) >= k else None",
     lambda k: [[5, 1, 4, 2, 3, 9, 8, 7, 6, 10], [1], [3] * 10]),
    ("clamp_{k}", "returns x clamped to the range from -{k} to {k}", "max(-k, min(k, x))",
     lambda k: [k + 3, -k - 3, 0]),
    ("multiples_up_to_{k}", "returns how many of the integers from 1 to x (inclusive) are divisible by {k}",
     "x // k if x > 0 else 0", lambda k: [30, 0, k]),
    ("dashed_{k}", "returns the string x repeated {k} times with a dash between the copies",
     "'-'.join([x] * k)", lambda k: ["ab", "x", ""]),
    ("running_totals_plus_{k}", "returns the list of the running totals of the list x, each plus {k}",
     "[sum(x[:i + 1]) + k for i in range(len(x))]", lambda k: [[1, 2, 3], [], [5]]),
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


def sums() -> dict[str, list[Task]]:
    """Every single-digit sum once ("What is 7 + 5?", answer 12), in a fixed shuffle: 24 train and 16 test
    tasks (the GSPO learning benchmark's split since issue 13), then 12 for validation. Unlike the families
    above, the bundled model gets these partly right zero-shot, so its own majority answers are partly
    right: the labelled family that label-free learning (majority vote in place of the labels) is measured
    on. Not shipped: the benchmarks write it where they run (`write_sums`)."""
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(13).shuffle(pairs)
    tasks = [Task(id=f"sum-{a}-{b}", question=f"What is {a} + {b}?", answer=str(a + b), domain="math.sums")
             for a, b in pairs]  # fmt: skip
    return {"train": tasks[:24], "validation": tasks[40:52], "test": tasks[24:40]}


def write_sums(out_dir: Path) -> dict[str, Path]:
    """The sums family's splits as sums-<split>.jsonl in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split_name, tasks in sums().items():
        paths[split_name] = path("sums", split_name, out_dir)
        write_jsonl(paths[split_name], tasks)
    return paths


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
