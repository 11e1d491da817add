"""Where a training job's tasks come from: `TaskSource`, the base of every job spec (the dataset, the
validation set or split, limits, the seed, the verifier override and the description every kind of job
has, and `parse`, which names the first bad field), and `load_tasks`, which turns it into the train and
validation task lists.

A spec is plain JSON-like data so it can travel in a gRPC Struct, sit in the job database and be shown
back to the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zoo.registry.errors import ValidationError
from zoo.trainer.tasks.loading import load_jsonl, load_shipped
from zoo.trainer.tasks.schema import Task, split

SHIPPED = "shipped"


class TaskSource(BaseModel):
    """Where a training job's tasks come from, its seed, its verifier override and its description; the
    base of every job spec."""

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
    reward: str | None = Field(default=None, description="override every task's verifier")
    description: str = Field(default="", max_length=1000)

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
