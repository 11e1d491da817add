"""Scoring a group of rollouts of one task: `score_group`, and `ascore_group` for async callers.

A label-free group (asked for, or a task without an answer whose reward needs one) is scored by
majority_vote, one of the rewards, so this sits above them (base and exact), not in the registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from zoo.trainer.rewards.base import BaseReward, Reward, RewardResult
from zoo.trainer.rewards.exact import MajorityVote
from zoo.trainer.tasks.schema import Task


def score_group(
    reward: Reward, task: Task, completions: Sequence[str], *, label_free: bool = False
) -> list[RewardResult]:
    """Score a group of rollouts of one task.

    Label-free (asked for, or the task has no answer while the reward needs one): majority vote.
    Otherwise the reward's own group_scores when it has one, else score() per completion.
    """
    if label_free or (task.answer is None and getattr(reward, "needs_answer", False)):
        return MajorityVote().group_scores(task, completions)
    group = getattr(reward, "group_scores", None)
    if group is not None:
        return list(group(task, completions))
    return [reward.score(task, c) for c in completions]


async def ascore_group(
    reward: Reward, task: Task, completions: Sequence[str], *, label_free: bool = False
) -> list[RewardResult]:
    """score_group for async callers.

    A reward that scores completions one at a time and has `ascore` (llm_judge, or any BaseReward, whose
    default ascore runs score() in a thread) scores the whole group concurrently; a group-level reward
    (majority_vote) or a plain Reward runs score_group in a thread.
    """
    label_free = label_free or (task.answer is None and getattr(reward, "needs_answer", False))
    ascore = getattr(reward, "ascore", None)
    per_completion = (
        not isinstance(reward, BaseReward) or type(reward).group_scores is BaseReward.group_scores
    )
    if not label_free and ascore is not None and per_completion:
        return list(await asyncio.gather(*(ascore(task, c) for c in completions)))
    return await asyncio.to_thread(score_group, reward, task, completions, label_free=label_free)
