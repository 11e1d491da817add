"""Stages 3 and 4 of a TF-GRPO step, the critic's lessons: which groups it reads (the others are skipped
with no LLM call), the lessons it proposes from them, and their consolidation into the step's library.

The critic's three LLM stages are critic.py's (summarise, compare, merge) and the consolidation rules
operations.py's; here they are run over a step's groups, with the seeds that make a run repeatable, and
each lesson gets the expert factors distilled from its group's rollouts (distill.py) when the run makes
them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from zoo.registry.experience import Experience
from zoo.registry.expert_factors import ExpertFactors
from zoo.trainer.schedule import seed_of
from zoo.trainer.tfgrpo import critic
from zoo.trainer.tfgrpo.distill import distill_factors
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.operations import EmbedFn, Outcome, Proposal, consolidate, screen_lesson
from zoo.trainer.tfgrpo.run_state import TrainState
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import Group, StepWork, failed_with_reference


def informative_groups(groups: Sequence[Group], spec: TfGrpoSpec) -> list[int]:
    """Stage 3: the indices of the groups the critic reads; the others are skipped (no LLM calls)."""
    # G = 1 is the paper's "no group computation" ablation: the lone rollout is critiqued against the
    # reference. From G = 2 on, a group whose rewards are all equal has nothing to compare, except a
    # group that failed wholly on a task with a reference: its rollouts are compared with the reference.
    return [
        i
        for i, g in enumerate(groups)
        if spec.experience_kinds != "examples"
        and (spec.group_size == 1 or len({r.score for r in g.results}) > 1 or failed_with_reference(g, spec))
    ]


async def critique(
    s: StepWork, informative: Sequence[int], state: TrainState, spec: TfGrpoSpec, model: LLM
) -> tuple[list[Proposal], list[dict[str, Any]]]:
    """Stage 4, critic stages 1 and 2: summarise every rollout of the informative groups, then compare
    each group (`model`: the critic); returns the lessons it proposes and those screen_lesson turned down."""
    groups = s.groups
    compare_stats = state.json_stats["compare"]

    async def propose(gi: int) -> list[Proposal]:
        g = groups[gi]
        reference = None if spec.label_free else g.task.answer
        summaries = await asyncio.gather(
            *(
                critic.summarise(
                    model,
                    critic.summarise_messages(g.task.question, c, r.score, r.reason, reference, g.offered),
                    max_tokens=spec.critic_max_tokens,
                    seed=seed_of("summarise", spec.seed, s.number, g.task.id, j),
                )
                for j, (c, r) in enumerate(zip(g.completions, g.results, strict=True))
            )
        )
        graded = [(r.score, summary) for r, summary in zip(g.results, summaries, strict=True)]
        messages, listed = critic.fitted_compare_messages(
            model,
            g.task.question,
            reference,
            graded,
            s.library if s.index is None else g.offered,
            spec.max_ops_per_group,
            spec.critic_max_tokens,
        )
        ops = await critic.compare(
            model,
            messages,
            listed,
            max_ops=spec.max_ops_per_group,
            stats=compare_stats,
            max_retries=spec.max_json_retries,
            max_tokens=spec.critic_max_tokens,
            seed=seed_of("compare", spec.seed, s.number, g.task.id),
        )
        out = []
        for o in ops or []:
            flaw = screen_lesson(o.text, g.task.question) if o.op != "delete" else None
            if flaw is None:
                out.append(Proposal(o.op, o.text, o.id, g.task.domain, g.task.id, gi))
            else:
                screened.append({"op": o.op, "text": o.text[:300], "source": g.task.id, "reason": flaw})
        return out

    screened: list[dict[str, Any]] = []

    proposed = [p for ps in await asyncio.gather(*(propose(i) for i in informative)) for p in ps]
    return proposed, screened


async def consolidate_lessons(
    s: StepWork,
    state: TrainState,
    spec: TfGrpoSpec,
    model: LLM,
    *,
    policy: LLM,
    embed: EmbedFn,
    make: Callable[[str, str], Experience],
) -> Outcome:
    """Stage 4, critic stage 3: the step's lessons consolidated into its library (`model`, the critic,
    merges near duplicates), with their factors distilled with `policy`'s tokenizer when the run makes
    them; `make` writes a new lesson."""
    merge_stats = state.json_stats["consolidate"]
    merges = [0]

    async def merge(texts: Sequence[str]) -> str | None:
        merges[0] += 1
        return await critic.merge(
            model,
            texts,
            stats=merge_stats,
            max_retries=spec.max_json_retries,
            max_tokens=spec.critic_max_tokens,
            seed=seed_of("merge", spec.seed, s.number, merges[0]),
        )

    lesson_ops = s.lesson_ops
    return await consolidate(
        s.library,
        lesson_ops,
        embed=embed,
        merge=merge,
        make=make,
        threshold=spec.merge_threshold,
        factors_for=(
            factors_from_groups(policy, s.groups, state, spec.factor_top_k)
            if spec.distill_factors and lesson_ops
            else None
        ),
    )


def factors_from_groups(
    llm: LLM, groups: Sequence[Group], state: TrainState, top_k: int
) -> Callable[[Proposal], ExpertFactors | None] | None:
    """What distils a lesson's expert factors from the rollouts of the group that proposed it, with
    `llm`'s tokenizer; None (and a note in the state) when it has no local tokenizer."""
    tokenizer = llm.tokenizer
    if tokenizer is None:
        note = f"distill_factors: the {llm.model_id} backend has no local tokenizer; no factors made"
        if note not in state.notes:
            state.notes.append(note)
        return None

    def factors(p: Proposal) -> ExpertFactors | None:
        if not 0 <= p.group < len(groups):
            return None
        g = groups[p.group]
        return distill_factors(g.completions, g.advantages, tokenizer, top_k=top_k)

    return factors
