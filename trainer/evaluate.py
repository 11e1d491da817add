"""Scoring a configuration (a library, an adapter, a model) on a task set through the node's prompt path,
and what a score means: its 95% interval, and the paired difference between two configurations.

`score_tasks` asks every task once, greedy, as the node serves it (trainer/prompting.py: the serving
defaults' k, experience budget and lesson position), and scores the answer with the task's verifier. It is
what `zoo-node eval`, `zoo-node dao review --eval` and the learning benchmarks measure with.

Intervals are percentile bootstraps (10,000 resamples, seeded, so a report is reproducible): of the mean
for one configuration, and of the mean per-task difference for two configurations scored on the same
tasks (a paired bootstrap: each resample draws tasks, and both configurations' scores of a task travel
together, which is what makes a small difference on a few dozen tasks measurable at all).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.registry.experience import Experience
from zoo.trainer.prompting import PromptPath
from zoo.trainer.rewards import RewardCache, ascore_group
from zoo.trainer.schedule import seed_of
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tfgrpo.llm import LLM

RESAMPLES = 10_000
LEVEL = 0.95


@dataclass(frozen=True)
class TaskScore:
    id: str
    domain: str
    score: float
    prompt_tokens: int
    completion_tokens: int
    experiences: int  # experiences that went into the prompt


class Scorer:
    """Scores tasks through one prompt path and one model (and optionally one adapter)."""

    def __init__(self, llm: LLM, prompts: PromptPath, *, max_tokens: int = 256, reward: str | None = None):
        self.llm = llm
        self.prompts = prompts
        self.max_tokens = max_tokens
        self._reward_for = RewardCache(reward, judge=self._judge)  # reward: overrides every verifier

    async def _judge(self, prompt: str) -> str:
        reply = await self.llm.chat([{"role": "user", "content": prompt}], role="judge", max_tokens=256)
        return reply.text

    async def score_tasks(
        self, tasks: Sequence[Task], library: Sequence[Experience] = (), *, adapter: Any = None
    ) -> list[TaskScore]:
        """Every task asked once (greedy) with `library` retrieved into its prompt, scored by its verifier."""
        index = await asyncio.to_thread(self.prompts.index, library)

        async def one(task: Task) -> TaskScore:
            messages, used = self.prompts.messages(task, self.prompts.offered(task, library, index))
            reply = await self.llm.chat(
                messages,
                role="eval",
                max_tokens=self.max_tokens,
                temperature=0.0,
                seed=seed_of("eval", task.id),
                adapter=adapter,
            )
            result = (await ascore_group(self._reward_for(task), task, [reply.text]))[0]
            return TaskScore(
                task.id, task.domain, result.score, reply.prompt_tokens, reply.completion_tokens, len(used)
            )

        return list(await asyncio.gather(*(one(t) for t in tasks)))


def _resample_means(values: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return values[picks].mean(axis=1)


def interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of `values` (a single value: itself)."""
    if not values:
        raise ValueError("no values")
    arr = np.asarray(values, dtype=np.float64)
    if len(arr) == 1:
        return float(arr[0]), float(arr[0])
    means = _resample_means(arr, seed)
    lo, hi = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def summary(scores: Sequence[TaskScore]) -> dict[str, Any]:
    """{"score", "n", "ci95", "by_domain": {domain: {"score", "n", "ci95"}}, "prompt_tokens", "experiences"}
    of one run (the last two: means per task)."""
    if not scores:
        raise ValueError("no scores")

    def part(group: Sequence[TaskScore]) -> dict[str, Any]:
        values = [s.score for s in group]
        lo, hi = interval(values)
        return {"score": statistics.fmean(values), "n": len(values), "ci95": [lo, hi]}

    domains = sorted({s.domain for s in scores})
    return {
        **part(scores),
        "by_domain": {d: part([s for s in scores if s.domain == d]) for d in domains},
        "prompt_tokens": statistics.fmean(s.prompt_tokens for s in scores),
        "experiences": statistics.fmean(s.experiences for s in scores),
    }


def paired_difference(a: Sequence[TaskScore], b: Sequence[TaskScore]) -> dict[str, Any]:
    """B minus A on the same tasks: the mean per-task difference, its paired-bootstrap 95% interval, and
    how many tasks each side wins."""
    by_id = {s.id: s.score for s in a}
    if len(by_id) != len(a) or {s.id for s in b} != set(by_id) or len(b) != len(a):
        raise ValueError("a paired difference needs both configurations scored on the same tasks")
    diffs = [s.score - by_id[s.id] for s in b]
    lo, hi = interval(diffs, seed=1)
    return {
        "difference": statistics.fmean(diffs),
        "ci95": [lo, hi],
        "n": len(diffs),
        "better": sum(d > 0 for d in diffs),
        "worse": sum(d < 0 for d in diffs),
    }


def report(runs: Sequence[tuple[dict[str, Any], Sequence[TaskScore], float]]) -> dict[str, Any]:
    """What `zoo-node eval` reports of its runs, each (configuration, scores, wall seconds): the first run's
    summary, and with a second one "compare" (its summary) and the paired "difference" (B - A)."""
    (configuration, scores, wall_s), *others = runs
    result: dict[str, Any] = {**summary(scores), "configuration": configuration, "wall_s": round(wall_s, 3)}
    if others:
        other_configuration, other_scores, other_wall_s = others[0]
        result["compare"] = {
            **summary(other_scores),
            "configuration": other_configuration,
            "wall_s": round(other_wall_s, 3),
        }
        result["difference"] = paired_difference(scores, other_scores)
    return result
