"""Generates the convention task families shipped in trainer/tasks/data/families/: tasks whose correct answer
depends on a convention no model can guess, but one experience (a rule or a worked example) can carry.

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

The output depends only on the seed (random.Random(seed), fixed word lists), so running this again
reproduces the committed files byte for byte (a test checks it). The tasks carry no instruction of their
own: they are asked under the general "end with a line 'Answer: …'" instruction of non-math domains.
"""

from __future__ import annotations

import argparse
import random
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


FAMILIES = {"lengths": lengths, "habitats": habitats}

# Each family's convention as a person would state it: the rule an ideal lesson carries (benchmarks use it
# to measure how far a correct rule moves a model, wherever it sits in the prompt; runs never see it).
CONVENTIONS = {
    "lengths": "When recording a length, convert it to centimetres and write only the number (3 m -> 300).",
    "habitats": "When asked for an animal's label, answer WET if it lives in or by water, otherwise DRY.",
}


def generate(name: str, seed: int = 0) -> dict[str, list[Task]]:
    """The family's tasks cut into its splits (train, validation, test), in a fixed order."""
    tasks = FAMILIES[name](random.Random(f"{name}:{seed}"))
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
    for name in FAMILIES:
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
