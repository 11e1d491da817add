"""What the spec of every LoRA job (GSPO's, and the supervised kinds' in trainer/sft) shares: the adapters'
shape, the optimiser's settings that are the same for all (the learning rate is not: each kind has its
own default), bf16 and the system turn, checked at the boundary like every job spec (TaskSource.parse)."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from zoo.trainer.tasks.source import TaskSource

# Attention and MLP projections of Llama-family models (SmolLM2, Qwen, Llama, Mistral).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSpec(TaskSource):
    """The LoRA adapters a job trains (GSPO's, and the supervised kinds' in trainer/sft), and how."""

    lora_rank: int = Field(default=8, ge=1, le=1024)
    lora_alpha: float = Field(default=16.0, gt=0.0, le=4096.0)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = Field(default=DEFAULT_TARGET_MODULES, min_length=1, max_length=64)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1e6)
    bf16: bool = Field(default=False, description="bf16 autocast for forward passes (GPU); fp32 otherwise")
    instruction: str | None = Field(
        default=None, min_length=1, max_length=4000, description="system turn for tasks without their own"
    )

    @field_validator("lora_alpha")
    @classmethod
    def _finite_alpha(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name or not name.replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"{name!r} is not a module name (letters, digits, '_' and '.')")
        return value
