"""What every LoRA training run shares, GSPO's (gspo/run.py) and the supervised kinds' (sft/train.py): the
policy's adapters under an AdamW optimiser prepared over the run's processes, each task's reward, the
validation score (the mean over the validation tasks, shared out over the processes) and the per-step
curve a run's callback and report read. A run says how it scores its share of the validation tasks.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.rewards import RewardCache
from zoo.trainer.tasks.schema import Task

OnStep = Callable[[dict[str, Any]], None]


class LoraRun:
    """The state a run's steps and validation share; subclasses train and score (`validation_scores`)."""

    def __init__(
        self,
        spec: Any,  # a GspoSpec or an SftSpec: learning_rate, weight_decay, reward, what processes need
        policy: LoraPolicy,
        validation: Sequence[Task],
        *,
        steps_total: int,
        on_step: OnStep | None = None,
        processes: Processes | None = None,
    ) -> None:
        self.spec = spec
        self.policy = policy
        self.validation = list(validation)
        self.steps_total = steps_total
        self.on_step = on_step
        self.processes = processes or Processes()
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay
        )
        self.processes.prepare(policy.model, self.optimizer, spec)
        self.reward_for = RewardCache(spec.reward)
        self.step = 0
        self.curve: list[dict[str, Any]] = []
        self.baseline_validation_score: float | None = None
        self.validation_score: float | None = None
        self.wall_s = 0.0

    def validation_scores(self, tasks: Sequence[Task], tag: str) -> list[float]:
        """Greedy scores of this process's share of the validation tasks (never empty)."""
        raise NotImplementedError

    def evaluate(self, tag: str) -> float | None:
        """The mean greedy score on the validation tasks (None without any), shared out over processes."""
        if not self.validation:
            return None
        mine = self.processes.shard(self.validation)
        local = self.validation_scores(mine, tag) if mine else []
        return statistics.fmean(self.processes.gather(local))

    def notify(self, point: dict[str, Any]) -> None:
        """The run's callback told of a finished step (by the main process only)."""
        if self.on_step is not None and self.processes.is_main:
            self.on_step(point)
