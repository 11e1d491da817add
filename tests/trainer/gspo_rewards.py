"""A reward for GSPO tests, registered on import (the multi-process test's workers import it too)."""

from __future__ import annotations

from zoo.trainer.rewards import REWARDS, BaseReward, RewardResult, register
from zoo.trainer.tasks.schema import Task

if "test_parity" not in REWARDS:

    @register("test_parity")
    class Parity(BaseReward):
        """1 for a completion of even length: a reward the sampled completions of one prompt disagree on,
        so every group carries a learning signal (what it teaches does not matter here)."""

        def score(self, task: Task, completion: str) -> RewardResult:
            return RewardResult(float(len(completion) % 2 == 0), "parity")
