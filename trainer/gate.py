"""Calibrating the relevance gate (inference.min_similarity) of a library on its own validation tasks.

Retrieval puts the top k experiences in a prompt however unrelated they are, and unrelated worked examples
cost a small model dearly (issue 37: a conventions library lowered small Python functions from 0.812 to
0.573). The gate leaves out experiences less similar to the question than a threshold. Calibrated here from
embeddings alone, no generation: each validation task's best match in the library is found, and the
threshold sits `margin` below the weakest of those, so every task the library was validated on keeps its
experiences while questions the library is far from get none. With tasks from outside the library, the
report says how many of them the threshold gates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.inference.retrieval import RetrievalIndex
from zoo.registry.library import Library
from zoo.trainer.tasks.schema import Task

DEFAULT_MARGIN = 0.1


@dataclass(frozen=True)
class GateCalibration:
    threshold: float
    inside: list[float]  # best-match similarity of each validation task
    outside: list[float]  # best-match similarity of each outside task

    @property
    def inside_kept(self) -> float:
        return float(np.mean([s >= self.threshold for s in self.inside])) if self.inside else 1.0

    @property
    def outside_gated(self) -> float | None:
        return float(np.mean([s < self.threshold for s in self.outside])) if self.outside else None

    def to_json(self) -> dict[str, Any]:
        def quantiles(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            q = np.quantile(values, [0.0, 0.1, 0.5, 0.9, 1.0])
            return dict(zip(("min", "p10", "median", "p90", "max"), map(float, q), strict=True))

        return {"threshold": self.threshold, "inside_kept": self.inside_kept,
                "outside_gated": self.outside_gated, "inside": quantiles(self.inside),
                "outside": quantiles(self.outside)}  # fmt: skip


def best_matches(index: RetrievalIndex, tasks: Sequence[Task]) -> list[float]:
    """The similarity of each task's question to its closest experience."""
    return [hits[0].score if (hits := index.search(t.question, k=1)) else -1.0 for t in tasks]


def calibrate(
    library: Library,
    embedder: Any,
    validation: Sequence[Task],
    outside: Sequence[Task] = (),
    margin: float = DEFAULT_MARGIN,
) -> GateCalibration:
    """The gate for `library`: `margin` below the weakest best match of its validation tasks (never below
    -1, the gate off)."""
    if not library.experiences:
        raise ValueError("the library is empty: there is nothing to gate")
    if not validation:
        raise ValueError("calibration needs validation tasks the library is for")
    index = RetrievalIndex.build(library, embedder, None)
    inside = best_matches(index, validation)
    threshold = max(-1.0, round(min(inside) - margin, 3))
    return GateCalibration(threshold, inside, best_matches(index, outside))
