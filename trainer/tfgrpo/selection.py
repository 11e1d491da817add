"""Stages 4 and 5 of a TF-GRPO step, the selection: the candidate libraries a step may keep (stage 4's
prune makes them), the one their validation scores choose (stage 5), and what keeping it records.

A step offers its lessons and worked examples together and each kind alone (beside the library with only
the prune applied, and each candidate with new expert factors also without them); `choose` keeps the best
score that passes. Nothing enters without earning a better score: a candidate that grows the library must
score above the current one, and a tie goes to the smaller library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zoo.registry.experience import Experience
from zoo.trainer.tfgrpo.credit import carry_records, with_confidence
from zoo.trainer.tfgrpo.operations import Outcome, Proposal, add_examples, prune
from zoo.trainer.tfgrpo.run_state import TrainState
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import StepWork

# The confidence a newly distilled factor is tried at: log-odds 1, so it weighs η while validation decides.
FACTOR_TRIAL_CONFIDENCE = 1.0 / (1.0 + math.exp(-1.0))


def candidate_libraries(
    library: Sequence[Experience],
    lessons: Outcome,
    example_ops: Sequence[Proposal],
    credit: Mapping[str, Sequence[float]],
    spec: TfGrpoSpec,
    *,
    make_example: Callable[[Proposal], Experience],
    factor_trials: bool,
) -> tuple[dict[str, Outcome], list[dict[str, Any]]]:
    """Stage 4, critic stage 3's prune: the libraries a step may keep, by name, in the order a tie of
    equal sizes is broken: "both" (the step's lessons and worked examples), "examples", "lessons",
    "prune" (only dropping harmful experiences); each with its new expert factors on trial and, right
    after it, a "-no-factors" variant without them (when validation can tell them apart). Each is
    pruned; an unchanged library or one equal to an earlier candidate is left out. Also returns the
    rejected operations."""
    unchanged = Outcome(sorted(library, key=lambda e: e.id))
    bases: dict[str, Outcome] = {}
    rejected = list(lessons.rejected)
    if example_ops:
        deleted = {op["id"] for op in lessons.applied if op["op"] == "delete"}
        both = add_examples(lessons, example_ops, make_example, deleted=deleted)
        rejected = both.rejected
        if lessons.applied:
            bases["both"] = both
        bases["examples"] = add_examples(unchanged, example_ops, make_example)
    if lessons.applied:
        bases["lessons"] = lessons
    bases["prune"] = unchanged
    by_id = {e.id: e for e in library}
    raw: list[tuple[str, Outcome]] = []
    for name, base in bases.items():
        trial, stripped = factor_trial(base, by_id) if factor_trials else (base, None)
        raw.append((name, trial))
        if stripped is not None:
            raw.append((f"{name}-no-factors", stripped))
    out: dict[str, Outcome] = {}
    seen = [unchanged.experiences]
    for name, o in raw:
        added = {op["id"] for op in o.applied if op["op"] in ("add", "merge") and "old_id" not in op}
        kept, drops = prune(
            o.experiences,
            credit,
            renamed=o.renamed,
            cap=spec.max_library_size,
            min_uses=spec.drop_after_uses,
            protected=added,
        )
        if kept in seen:
            continue
        seen.append(kept)
        out[name] = Outcome(kept, o.applied + drops, o.rejected, o.renamed)
    return out, rejected


def factor_trial(o: Outcome, before: Mapping[str, Experience]) -> tuple[Outcome, Outcome | None]:
    """(o with its new factors on trial, o without them), or (o, None) when it brings no new factors.

    A new factor starts at FACTOR_TRIAL_CONFIDENCE, so validation decodes with it at weight η (at the
    neutral 0.5 it would weigh nothing and validation could not tell whether it hurts); the variant
    without it lets validation drop a harmful factor set and keep the lesson it came with."""
    previous = {new: before[old] for old, new in o.renamed.items() if old in before}
    trial: list[Experience] = []
    stripped: list[Experience] = []
    drops: list[dict[str, Any]] = []
    for e in o.experiences:
        old = before.get(e.id) or previous.get(e.id)
        if e.factors is None or (old is not None and old.factors == e.factors):
            trial.append(e)
            stripped.append(e)
            continue
        trial.append(e.replace(confidence=FACTOR_TRIAL_CONFIDENCE))
        stripped.append(e.replace(factors=old.factors if old is not None else None))
        drops.append({"op": "drop_factors", "id": e.id, "text": e.text,
                      "reason": "validation scored the step higher without them"})  # fmt: skip
    if not drops:
        return o, None
    return (
        Outcome(trial, o.applied, o.rejected, o.renamed),
        Outcome(stripped, o.applied + drops, o.rejected, o.renamed),
    )


Size = tuple[int, int]  # (experiences, of them with expert factors): what a library costs a prompt


def size_of(experiences: Sequence[Experience]) -> Size:
    return len(experiences), sum(e.factors is not None for e in experiences)


def choose(
    scores: Mapping[str, float | None],
    current: float | None,
    tolerance: float,
    sizes: Mapping[str, Size] | None = None,
    current_size: Size = (0, 0),
) -> str | None:
    """The candidate a step keeps, from the validation scores of its candidates (in preference order), or
    None (the step is reverted). A candidate that grows the library (more experiences or more factors than
    `current_size`) must score strictly above `current`: nothing enters that did not earn a better score.
    One that does not grow it (a prune, a rewrite) may score down to `current - tolerance`. Of those, the
    best score wins; a tie goes to the smaller library, then to the earlier candidate. Without validation
    (scores None) the first one is kept."""
    sizes = sizes or {}
    best: str | None = None
    for name, score in scores.items():
        if score is None or current is None:
            if best is None:
                best = name
            continue
        size = sizes.get(name, current_size)
        grows = size[0] > current_size[0] or size[1] > current_size[1]
        if score < current - tolerance or (grows and score <= current):
            continue
        if best is None or (score, _smaller(sizes.get(name))) > (
            scores[best] or 0.0,
            _smaller(sizes.get(best)),
        ):
            best = name
    return best


def _smaller(size: Size | None) -> tuple[int, int]:
    return (0, 0) if size is None else (-size[0], -size[1])


def keep_chosen(s: StepWork, state: TrainState) -> None:
    """Stage 5: the chosen candidate becomes the library (none chosen: it stays as it was); the state
    records the operations applied, reverted and rejected, and each experience's confidence."""
    number = s.number
    score = state.validation_score if s.chosen is None else s.scores_of[s.chosen]
    outcome = Outcome(s.library) if s.chosen is None else s.candidates[s.chosen]
    kept_ops = {(op["op"], op["id"]) for op in outcome.applied}
    reverted: dict[tuple[str, str], dict[str, Any]] = {}
    for o in s.candidates.values():
        for op in o.applied:
            if op["op"] not in ("drop", "drop_factors") and (op["op"], op["id"]) not in kept_ops:
                reverted.setdefault((op["op"], op["id"]), {**op, "step": number})
    state.reverted += list(reverted.values())
    library = s.library
    if s.decision == "kept":
        library = outcome.experiences
        carry_records(outcome.renamed, state)
        state.operations += [{**op, "step": number} for op in outcome.applied]
    state.rejected += [{**r, "step": number} for r in s.rejected]
    state.library = [with_confidence(e, state) for e in library]
    state.validation_score = score
