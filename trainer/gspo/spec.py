"""The GSPO job spec: LoRA shape, sampling, the clipped objective and the optimiser, checked at the boundary.

Defaults follow the GSPO paper and TRL where they apply (clip range 3e-4 / 4e-4, no KL, Bessel-std group
advantages) and keep a CPU run small; `num_iterations` defaults to 2 so that the importance ratio and the
clipping act (with one pass the ratio is exactly 1).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from zoo.trainer.lora.spec import LoraSpec


class GspoSpec(LoraSpec):
    """What a GSPO run does."""

    epochs: int = Field(default=1, ge=1, le=100)
    batch_size: int = Field(default=4, ge=1, le=1024, description="prompts per step")
    group_size: int = Field(default=4, ge=2, le=64, description="G: completions sampled per prompt")
    max_new_tokens: int = Field(default=64, ge=1, le=32_768)
    temperature: float = Field(default=1.0, gt=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    generation_rows: int = Field(
        default=0,
        ge=0,
        le=65_536,
        description="most completions sampled in one generate call, whole groups (0: a process's whole "
        "share of a step at once); bounds the KV cache, never changes the samples",
    )

    eps_low: float = Field(default=3e-4, ge=0.0, lt=1.0, description="clip below at 1 - eps_low")
    eps_high: float = Field(default=4e-4, ge=0.0, le=10.0, description="clip above at 1 + eps_high")
    beta: float = Field(default=0.0, ge=0.0, le=10.0, description="KL weight to the reference (adapters off)")
    num_iterations: int = Field(default=2, ge=1, le=16, description="optimisation passes over each batch")
    micro_batch_size: int = Field(
        default=8, ge=1, le=4096, description="sequences per forward/backward; gradients accumulate"
    )
    learning_rate: float = Field(default=1e-5, gt=0.0, le=1.0)
    loss: Literal["auto", "torch", "fused"] = Field(
        default="auto", description="log-probs fused with the LM head (Triton; auto: on a GPU) or plain torch"
    )

    environment: Literal["none", "nano"] = Field(
        default="none",
        description="none: one completion per task, scored by its verifier; nano: multi-turn coding "
        "episodes (trainer/envs), scored by patch_similarity, the loss on the model's tokens only",
    )
    nano_repos: str | None = Field(
        default=None,
        description="nano: the task repositories' directory (unset: the shipped ones, generated)",
    )
    max_turns: int = Field(default=16, ge=1, le=1000, description="nano: model turns per episode")
    max_tool_calls: int = Field(default=30, ge=1, le=1000, description="nano: tool calls per episode")
    episode_token_budget: int = Field(
        default=4096, ge=64, le=1_000_000, description="nano: tokens of the whole transcript"
    )
    episode_wall_clock_s: float = Field(
        default=600.0, gt=0, le=86_400, description="nano: seconds per episode"
    )
    shell_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="nano: seconds per shell call")

    checkpoint_every: int = Field(default=1, ge=1, le=100_000, description="steps between checkpoints")
    validate_every: int = Field(
        default=0, ge=0, le=100_000, description="steps between validation scores (0: before and after only)"
    )

    @field_validator("temperature", "top_p", "eps_low", "eps_high", "beta", "learning_rate")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value
