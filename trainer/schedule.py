"""The order a training job visits its tasks in, and the stable seeds it draws from: shared by every kind of
job so that a run (and a resumed run) is the same on every machine."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def seed_of(*parts: object) -> int:
    """A stable 63-bit seed from the parts (the same on every machine and Python version)."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def batches(train: Sequence[T], batch_size: int, seed: int, epoch: int) -> list[list[T]]:
    """The epoch's batches: the tasks shuffled by (seed, epoch), cut in order; the last may be short."""
    order = list(train)
    random.Random(seed_of("shuffle", seed, epoch)).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def total_steps(n_train: int, batch_size: int, epochs: int) -> int:
    return epochs * math.ceil(n_train / batch_size)
