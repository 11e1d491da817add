"""Stage 2 of a TF-GRPO step, the credit: each rollout's group-relative advantage, the credit each
experience it used earns from it, and the confidence that credit gives the experience.

An experience's record (`TrainState.credit`, `.counts`, `.priors`) follows it when a step rewrites it,
so a rewritten lesson's confidence is what one uninterrupted record gives.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from zoo.registry.experience import Experience
from zoo.trainer.tfgrpo.run_state import TrainState
from zoo.trainer.tfgrpo.step_work import Group

ADVANTAGE_EPS = 1e-4
INITIAL_CONFIDENCE = 0.5  # of a lesson or worked example the run writes: neutral, its factors weigh nothing


def advantages_of(scores: Sequence[float]) -> list[float]:
    """Group-relative advantages (r - mean) / (std + eps), std with Bessel's correction (as in TRL)."""
    if len(scores) < 2:
        return [0.0 for _ in scores]
    mean = statistics.fmean(scores)
    std = statistics.stdev(scores)
    return [(s - mean) / (std + ADVANTAGE_EPS) for s in scores]


# Pseudo-uses of an experience's starting confidence: how much evidence its first uses must outweigh.
PRIOR_USES = 2.0


def _logit(q: float) -> float:
    q = min(max(q, 1e-6), 1 - 1e-6)
    return math.log(q / (1 - q))


def confidence_of(prior: float, advantage_sum: float, uses: float) -> float:
    """An experience's reliability after `uses` rollouts whose advantages sum to `advantage_sum`: the
    log-odds of `prior` (its confidence when the run first saw it), shrunk toward the mean advantage of its
    uses, sigmoid((PRIOR_USES·logit(prior) + Σ A) / (PRIOR_USES + uses)).

    Mean advantage, not helpful/harmful counts: an experience offered to every rollout of a group adds 0
    to Σ A whatever the group's success rate, while counting A > 0 against A < 0 would make everything
    offered to mostly failing groups look harmful. So the factor weight log(q / (1 - q)) it yields is the
    shrunken mean advantage, and an experience that makes no difference drifts to q = 0.5 (weight 0)."""
    z = (PRIOR_USES * _logit(prior) + advantage_sum) / (PRIOR_USES + uses)
    return 1.0 / (1.0 + math.exp(-z))


def credit_uses(groups: Sequence[Group], state: TrainState) -> None:
    """Stage 2, experience credit: each experience a rollout used is credited with its advantage and
    counted helpful (A > 0) or harmful (A < 0)."""
    for g in groups:
        for ids, a in zip(g.used, g.advantages, strict=True):
            for i in ids:
                credit = state.credit.setdefault(i, [0.0, 0.0])
                credit[0] += a
                credit[1] += 1
                c = state.counts.setdefault(i, [0, 0])
                if a > 0:
                    c[0] += 1
                elif a < 0:
                    c[1] += 1


def carry_records(renamed: Mapping[str, str], state: TrainState) -> None:
    """A rewritten experience keeps its record under its new id: where its confidence started, its
    credit and its helpful and harmful counts."""
    for old, new in renamed.items():
        if old in state.priors:
            state.priors[new] = state.priors.pop(old)
        if old in state.credit:
            moved = state.credit.pop(old)
            to = state.credit.setdefault(new, [0.0, 0.0])
            to[0] += moved[0]
            to[1] += moved[1]
        if old in state.counts:
            c = state.counts.pop(old)
            n = state.counts.setdefault(new, [0, 0])
            n[0] += c[0]
            n[1] += c[1]


def with_confidence(e: Experience, state: TrainState) -> Experience:
    """`e` with the confidence its record gives (`confidence_of` its prior and its credit)."""
    prior = state.priors.setdefault(e.id, e.confidence)  # first seen: where its confidence starts
    total, uses = state.credit.get(e.id, (0.0, 0.0))
    if not uses:
        return e
    confidence = confidence_of(prior, total, uses)
    return e if abs(confidence - e.confidence) < 1e-6 else e.replace(confidence=confidence)
