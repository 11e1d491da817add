"""What a TF-GRPO step works on: each task's group of rollouts (`Group`) and what the step accumulates,
stage by stage (`StepWork`), which the stage modules read and fill in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.inference.retrieval import RetrievalIndex
from zoo.registry.experience import Experience
from zoo.trainer.rewards import RewardResult
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tfgrpo.operations import Outcome, Proposal
from zoo.trainer.tfgrpo.spec import TfGrpoSpec


@dataclass
class Group:
    """One task's G rollouts: completions, rewards, advantages, and the experiences offered and used."""

    task: Task
    completions: list[str]
    results: list[RewardResult]
    advantages: list[float]
    used: list[list[str]]  # per completion: ids of the lessons it used
    offered: list[Experience]


@dataclass
class StepWork:
    """What a step accumulates, stage by stage: what later stages and its learning-curve point read."""

    number: int  # the step, counted from 1
    epoch: int  # counted from 0
    batch: list[Task]
    library: list[Experience]  # the library the step starts from
    index: RetrievalIndex | None  # its retrieval index (None: every experience is offered, or none is)
    started: float  # time.perf_counter() when the step began
    calls_before: int  # LLM calls made before the step
    groups: list[Group] = field(default_factory=list)  # stages 1-2
    skipped: int = 0  # stage 3: groups the critic does not read
    json_before: tuple[int, int] = (0, 0)  # the critic's JSON (retries, failures) before stage 4
    proposed: list[Proposal] = field(default_factory=list)  # stage 4: the critic's lessons, then examples
    screened: list[dict[str, Any]] = field(default_factory=list)  # stage 4: lessons screen_lesson refused
    lessons: Outcome = field(default_factory=lambda: Outcome([]))  # stage 4: the lessons consolidated
    candidates: dict[str, Outcome] = field(default_factory=dict)  # stage 4: the libraries it may keep
    rejected: list[dict[str, Any]] = field(default_factory=list)  # operations turned down
    scores_of: dict[str, float | None] = field(default_factory=dict)  # stage 5: validation, by candidate
    chosen: str | None = None  # stage 5: the candidate kept (None: the library stays as it was)

    # The step's lessons and its worked examples are candidates apart as well as together: validation
    # picks what stays, so a kind that does not help this model cannot hold the other back.
    @property
    def lesson_ops(self) -> list[Proposal]:
        return [p for p in self.proposed if p.kind != "example"]

    @property
    def example_ops(self) -> list[Proposal]:
        return [p for p in self.proposed if p.kind == "example"]

    @property
    def decision(self) -> str:
        return "no_change" if not self.candidates else ("reverted" if self.chosen is None else "kept")


def failed_with_reference(group: Group, spec: TfGrpoSpec) -> bool:
    """Every rollout scored 0 on a task that has a reference answer (and the run may use it)."""
    return not spec.label_free and group.task.answer is not None and all(r.score == 0 for r in group.results)
