"""Training job specs: every knob of a run, validated at the boundary (gRPC, CLI, checkpoint).

A spec is plain JSON-like data so it can travel in a gRPC Struct, sit in the job database and be shown
back to the operator. `TaskSource` holds what every kind of job shares (where its tasks come from, the
seed, `parse`); `TfGrpoSpec` is the training-free run's, `zoo.trainer.gspo.spec.GspoSpec` the LoRA run's.
`load_tasks` turns the dataset fields into the train and validation task lists.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Literal, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zoo.inference.defaults import LessonPosition, ServingDefaults
from zoo.registry.errors import ValidationError
from zoo.trainer.tasks.schema import Task, load_jsonl, load_shipped, split

SHIPPED = "shipped"


class TaskSource(BaseModel):
    """Where a training job's tasks come from, and its seed; the base of every job spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(default=SHIPPED, description='a JSONL task file, or "shipped" for the bundled set')
    validation: str | None = Field(
        default=None,
        description='validation JSONL; "shipped" with the shipped set; unset: split the dataset',
    )
    validation_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    train_limit: int | None = Field(default=None, ge=1, le=100_000)
    validation_limit: int | None = Field(default=None, ge=0, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    @field_validator("dataset", "validation")
    @classmethod
    def _path_or_shipped(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a file path or 'shipped'")
        return value

    @model_validator(mode="after")
    def _shipped_pairs(self) -> Self:
        if self.validation == SHIPPED and self.dataset != SHIPPED:
            raise ValueError("validation 'shipped' goes with dataset 'shipped'")
        return self

    @classmethod
    def parse(cls, data: Any) -> Self:
        """Validate a mapping; the first problem raises ValidationError naming the field."""
        if not isinstance(data, dict):
            raise ValidationError("spec", f"expected an object, got {type(data).__name__}")
        data = {k: _int_if_whole(v) for k, v in data.items()}
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as err:
            problem = err.errors(include_url=False)[0]
            field = ".".join(["spec", *(str(p) for p in problem["loc"])])
            message = str(problem["msg"]).removeprefix("Value error, ")
            if problem["type"] == "extra_forbidden":
                message = "unknown field"
            raise ValidationError(field, message) from None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


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
    reward: str | None = Field(default=None, description="override every task's verifier")
    label_free: bool = Field(default=False, description="reward = agreement with the group majority")
    validate_steps: bool = Field(default=True, description="score each step on validation, revert drops")
    revert_tolerance: float = Field(default=0.0, ge=0.0, le=1.0)
    merge_threshold: float = Field(default=0.85, ge=0.0, le=1.0, description="cosine to call two lessons one")
    max_json_retries: int = Field(default=2, ge=0, le=10)
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
    description: str = Field(default="", max_length=1000)

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


def _int_if_whole(value: Any) -> Any:
    # A protobuf Struct carries every number as a double; 5.0 for group_size means 5.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _load(path: str, field: str) -> list[Task]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValidationError(field, f"no such file: {p}")
    try:
        return load_jsonl(p)
    except ValidationError as e:
        raise ValidationError(f"{field} ({p}) {e.field}", e.message.removeprefix(f"{e.field}: ")) from None


def load_tasks(spec: TaskSource) -> tuple[list[Task], list[Task]]:
    """The run's (train, validation) tasks, with the spec's limits applied; train is never empty."""
    if spec.dataset == SHIPPED:
        train = load_shipped("train")
        validation = load_shipped("validation") if spec.validation in (None, SHIPPED) else []
        if spec.validation not in (None, SHIPPED):
            validation = _load(spec.validation, "spec.validation")
    else:
        tasks = _load(spec.dataset, "spec.dataset")
        if spec.validation is None:
            train, validation = split(tasks, spec.validation_fraction, spec.seed)
        else:
            train, validation = tasks, _load(spec.validation, "spec.validation")
    if spec.train_limit is not None:
        train = train[: spec.train_limit]
    if spec.validation_limit is not None:
        validation = validation[: spec.validation_limit]
    if not train:
        raise ValidationError("spec.dataset", "holds no training tasks (after the split and limits)")
    overlap = {t.id for t in train} & {t.id for t in validation}
    if overlap:
        shared = ", ".join(sorted(overlap)[:3])
        raise ValidationError("spec.validation", f"shares task ids with the training set: {shared}")
    return train, validation
