"""The spec of a supervised LoRA job (`sft`, `rft`, `distill`): the LoRA shape, the optimiser and, per kind,
where its training pairs come from. Checked at the boundary like every job spec (TaskSource.parse).

Defaults are the ordinary choices a user would make (LoRA r 8, alpha 16 on the attention and MLP
projections, AdamW at 2e-4, a small batch) and train on the bundled model in well under a minute.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from zoo.trainer.lora.spec import LoraSpec


class SftSpec(LoraSpec):
    """A supervised LoRA run: the model learns to write each pair's completion after its prompt.

    `sft`: the labelled training tasks, each answered as a worked example shows it (reasoning, if the task
    has some, then "Answer: …"). `rft`: `samples` completions of every training task, only the ones its
    verifier passes (`min_reward`). `distill`: a library's worked examples, and the rollouts that the
    library made successful, asked with its experiences and trained without them.
    """

    kind: Literal["sft", "rft", "distill"] = "sft"
    epochs: int = Field(default=3, ge=1, le=100)
    batch_size: int = Field(default=2, ge=1, le=1024, description="pairs per optimiser step")
    micro_batch_size: int = Field(
        default=8, ge=1, le=4096, description="pairs per forward/backward; gradients accumulate"
    )
    learning_rate: float = Field(default=2e-4, gt=0.0, le=1.0)
    max_length: int = Field(
        default=1024, ge=16, le=131_072, description="tokens of prompt and completion; longer pairs fail"
    )
    validation_max_tokens: int = Field(default=128, ge=1, le=32_768, description="greedy validation answers")

    # rft and distill: sampled completions, kept when the verifier passes them.
    samples: int = Field(default=4, ge=1, le=64, description="rft/distill: completions sampled per task")
    temperature: float = Field(default=0.8, gt=0.0, le=2.0)
    max_new_tokens: int = Field(default=128, ge=1, le=32_768)
    min_reward: float = Field(
        default=1.0, ge=0.0, le=1.0, description="rft/distill: a kept completion's reward"
    )
    per_task: int = Field(default=2, ge=1, le=64, description="rft/distill: most kept completions per task")

    # distill: the library (a file or "current", resolved by the node) and how it is served in rollouts.
    experiences: str | None = Field(
        default=None, description="distill: a library JSON file (the CLI resolves 'current' and job ids)"
    )
    rollouts: bool = Field(
        default=True, description="distill: also train on the library's successful rollouts (lessons distil)"
    )
    k: int | None = Field(
        default=None, ge=0, le=64, description="distill: experiences per prompt (serving's)"
    )

    @field_validator("learning_rate", "temperature")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value
