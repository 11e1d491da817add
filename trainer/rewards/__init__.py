"""Rewards that score rollouts, looked up by name (a task's `verifier`): the registry in base, answer
extraction in answers, one module per built-in reward (exact, unit_tests with its sandbox_runner script,
patch, judge), the scoring of a rollout group in groups. They may import zoo.trainer.tasks' schema,
inference and registry; never a learning loop."""

from zoo.trainer.rewards.base import (
    REWARDS,
    BaseReward,
    Reward,
    RewardCache,
    RewardResult,
    check_task,
    get_reward,
    register,
    reward_class,
    reward_names,
)
from zoo.trainer.rewards.exact import SHORT_ANSWER_VERIFIERS, ExactMatch, MajorityVote
from zoo.trainer.rewards.groups import ascore_group, score_group
from zoo.trainer.rewards.judge import LlmJudge
from zoo.trainer.rewards.patch import PatchSimilarity
from zoo.trainer.rewards.unit_tests import UnitTests

__all__ = [
    "REWARDS",
    "SHORT_ANSWER_VERIFIERS",
    "BaseReward",
    "ExactMatch",
    "LlmJudge",
    "MajorityVote",
    "PatchSimilarity",
    "Reward",
    "RewardCache",
    "RewardResult",
    "UnitTests",
    "ascore_group",
    "check_task",
    "get_reward",
    "register",
    "reward_class",
    "reward_names",
    "score_group",
]
