"""The reward registry: results, the Reward protocol, BaseReward, registration and lookup by name (group
scoring, which falls back on majority_vote, is in groups.py). Each reward scores a completion in [0, 1]
and says why, in a few words.

The reason is not decoration: the TF-GRPO summariser reads it as the critique of a rollout, so it names
what was extracted, what was expected, which tests failed or what the judge objected to.

Rewards are looked up by name (a task's `verifier`) in REWARDS; `get_reward(name, **options)` builds one.
The built-in rewards register themselves when zoo.trainer.rewards is imported.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from zoo.registry.errors import ValidationError
from zoo.trainer.tasks.schema import Task

MAX_REASON_CHARS = 300


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class RewardResult:
    """A score in [0, 1], a short reason (critique for the summariser) and reward-specific details."""

    score: float
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.score, int | float) and math.isfinite(self.score) and 0 <= self.score <= 1):
            raise ValueError(f"reward score must be a finite number in [0, 1], got {self.score!r}")
        object.__setattr__(self, "score", float(self.score))


def _clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")


# Fenced blocks of a completion (code for unit_tests, a diff or file map for patch_similarity).
_FENCE_RE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE
)


def _require_answer(task: Task, reward: str) -> str:
    if task.answer is None:
        raise ValidationError(
            "answer", f"task {task.id!r} has no reference answer; {reward} needs one (use majority_vote)"
        )
    return task.answer


# -------------------------------------------------------------------------------------------- protocol


@runtime_checkable
class Reward(Protocol):
    """What the trainer needs of a reward; rewards built here also offer group_scores and ascore."""

    def score(self, task: Task, completion: str) -> RewardResult: ...


class BaseReward:
    """Shared behaviour: per-task argument checks, group scoring and an async entry point."""

    name: ClassVar[str] = ""
    needs_answer: ClassVar[bool] = False  # True: a label-free task is scored by majority vote instead
    task_args: ClassVar[frozenset[str]] = frozenset()  # allowed keys of Task.verifier_args

    @classmethod
    def check_task(cls, task: Task) -> None:
        """Raise ValidationError (field names the task field) when this reward cannot score the task."""
        unknown = sorted(set(task.verifier_args) - cls.task_args)
        if unknown:
            allowed = ", ".join(sorted(cls.task_args)) or "none"
            raise ValidationError(
                f"verifier_args.{unknown[0]}", f"not an argument of {cls.name} (allowed: {allowed})"
            )

    def score(self, task: Task, completion: str) -> RewardResult:
        raise NotImplementedError

    def group_scores(self, task: Task, completions: Sequence[str]) -> list[RewardResult]:
        return [self.score(task, c) for c in completions]

    async def ascore(self, task: Task, completion: str) -> RewardResult:
        # Most rewards block (subprocesses, long string matching); keep them off the event loop.
        return await asyncio.to_thread(self.score, task, completion)


REWARDS: dict[str, type[BaseReward]] = {}


def register(name: str) -> Callable[[type[BaseReward]], type[BaseReward]]:
    """Class decorator adding a reward to REWARDS under `name`."""

    def add(cls: type[BaseReward]) -> type[BaseReward]:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is already registered")
        cls.name = name
        REWARDS[name] = cls
        return cls

    return add


def reward_names() -> list[str]:
    return sorted(REWARDS)


def reward_class(name: str) -> type[BaseReward]:
    try:
        return REWARDS[name]
    except KeyError:
        raise ValidationError(
            "verifier", f"unknown reward {name!r}; valid names: {', '.join(reward_names())}"
        ) from None


def get_reward(name: str, **options: Any) -> BaseReward:
    """Build the reward registered as `name`; options go to its constructor (judge=..., timeout_s=...)."""
    return reward_class(name)(**options)


class RewardCache:
    """The reward of each task: `override` for every task when set, else the task's own verifier; each
    built once. `judge` (an async prompt -> reply) is what llm_judge asks."""

    def __init__(self, override: str | None = None, judge: Any = None) -> None:
        self.override = override
        self.judge = judge
        self._built: dict[str, BaseReward] = {}

    def __call__(self, task: Task) -> BaseReward:
        name = self.override or task.verifier
        if name not in self._built:
            options = {"judge": self.judge} if name == "llm_judge" and self.judge is not None else {}
            self._built[name] = get_reward(name, **options)
        return self._built[name]


def check_task(task: Task) -> None:
    """Check that the task's verifier exists and accepts the task (used when tasks are loaded)."""
    reward_class(task.verifier).check_task(task)
