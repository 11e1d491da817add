"""The TF-GRPO job spec: every knob of a training-free run, validated at the boundary (gRPC, CLI,
checkpoint). What every kind of job shares (its tasks, its seed, the verifier override, the description,
`parse`) is zoo.trainer.tasks.source's TaskSource."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from zoo.inference.defaults import LessonPosition, ServingDefaults
from zoo.trainer.tasks.source import TaskSource


class TfGrpoSpec(TaskSource):
    """What a TF-GRPO run does. Defaults follow the HLLM paper's setting (G=5, 3 epochs, ≤3 ops a group)."""

    epochs: int = Field(default=3, ge=1, le=100)
    batch_size: int = Field(default=4, ge=1, le=256, description="tasks per step")
    group_size: int = Field(default=5, ge=1, le=64, description="G: rollouts per task")
    max_ops_per_group: int = Field(default=3, ge=1, le=10)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    rollout_max_tokens: int = Field(default=256, ge=1, le=32_768)
    critic_max_tokens: int = Field(default=384, ge=16, le=32_768)
    k: int | None = Field(
        default=None,
        ge=0,
        le=256,
        description="experiences per prompt (default: inference.default_k)",
    )
    experience_budget_tokens: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="prompt tokens for experiences (default: inference.experience_budget_tokens)",
    )
    lesson_position: LessonPosition | None = Field(
        default=None,
        description='where lessons sit: "system" or "user" turn (default: inference.lesson_position)',
    )
    min_similarity: float | None = Field(
        default=None,
        ge=-1.0,
        le=1.0,
        description="relevance gate: retrieved experiences below this cosine stay out (default: "
        "inference.min_similarity)",
    )
    instruction: str | None = Field(
        default=None,
        min_length=1,
        max_length=4000,
        description="system instruction for every task that has none of its own (default: by task kind)",
    )

    experience_kinds: Literal["both", "lessons", "examples"] = Field(
        default="both",
        description="what a run may learn: lessons (critic rules), examples (worked examples), or both",
    )
    max_library_size: int = Field(
        default=100, ge=1, le=100_000, description="cap: the lowest-valued experiences over it are dropped"
    )
    drop_after_uses: int = Field(
        default=4, ge=1, le=100_000, description="uses after which a mostly harmful experience is dropped"
    )
    label_free: bool = Field(default=False, description="reward = agreement with the group majority")
    validate_steps: bool = Field(default=True, description="score each step on validation, revert drops")
    revert_tolerance: float = Field(default=0.0, ge=0.0, le=1.0)
    merge_threshold: float = Field(default=0.85, ge=0.0, le=1.0, description="cosine to call two lessons one")
    max_json_retries: int = Field(default=2, ge=0, le=10)
    critic_base_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="an OpenAI-compatible endpoint (http(s)://…/v1) that writes the lessons instead of the "
        "policy model: a stronger model teaching a small one (key from $ZOO_NODE_CRITIC_API_KEY)",
    )
    critic_model: str | None = Field(
        default=None, min_length=1, max_length=200, description="the critic endpoint's model name"
    )
    distill_factors: bool = Field(
        default=False,
        description="distill token-level expert factors (local models) and decode rollouts with them",
    )
    factor_top_k: int = Field(default=32, ge=1, le=4096)
    factor_eta: float | None = Field(
        default=None, ge=0, le=100, description="factor weight scale (default: inference.factor_eta)"
    )
    factor_cap: float | None = Field(
        default=None, ge=0, le=1000, description="factor weight bound (default: inference.factor_cap)"
    )
    concurrency: int = Field(default=4, ge=1, le=256, description="LLM calls in flight at once")

    base: Literal["current", "empty"] = Field(
        default="current", description="start from the node's current library or from an empty one"
    )
    lookup_start: bool = Field(
        default=True,
        description="add every labelled training task as a worked example (the lookup baseline) to the "
        "library the run starts from, so that it keeps only what beats lookup on validation (no effect "
        "under label_free or on tasks without a reference answer)",
    )

    def with_serving_defaults(self, defaults: ServingDefaults) -> TfGrpoSpec:
        """This spec with its unset prompt and factor settings taken from the node's serving, so the stored
        spec says what the library was validated with."""
        unset = [f.name for f in fields(defaults) if getattr(self, f.name) is None]
        return self.model_copy(update={name: getattr(defaults, name) for name in unset})

    def serving(self) -> ServingDefaults:
        """The prompt and factor settings this run uses: the spec's, else the built-in serving defaults."""
        d = ServingDefaults()
        given = {f.name: v for f in fields(d) if (v := getattr(self, f.name)) is not None}
        return replace(d, **given)

    @field_validator(
        "temperature",
        "top_p",
        "validation_fraction",
        "revert_tolerance",
        "merge_threshold",
        "factor_eta",
        "factor_cap",
    )
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("critic_base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL of an OpenAI-compatible API")
        return value

    @model_validator(mode="after")
    def _critic_pair(self) -> Self:
        if (self.critic_base_url is None) != (self.critic_model is None):
            raise ValueError("critic_base_url and critic_model go together")
        return self
