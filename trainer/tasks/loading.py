"""Reading tasks in: `parse_task` checks one decoded JSON object against the Task schema (schema.py) and
its verifier, which must be a reward registered in zoo.trainer.rewards that accepts the task's arguments;
`load_jsonl` reads a JSONL file of them and `load_shipped` the shipped set. Above both the schema and the
rewards, which score the schema's tasks.

Loading reports the first problem as zoo.registry.errors.ValidationError with the field prefixed by the
1-based line number (e.g. "line 7: answer"), so a hand-edited file can be fixed without guessing.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

import pydantic

from zoo.registry.errors import ValidationError
from zoo.trainer.rewards import check_task
from zoo.trainer.tasks.schema import DATA_DIR, DEFAULT_DOMAIN, Task, task_id


def _field_of(err: pydantic.ValidationError) -> tuple[str, str]:
    problem = err.errors(include_url=False)[0]
    field = ".".join(str(part) for part in problem["loc"]) or "task"
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "extra_forbidden":
        message = "unknown field"
    return field, message


def parse_task(data: Any, *, where: str = "") -> Task:
    """Validate one decoded JSON object as a Task; `where` (e.g. "line 7") prefixes the error's field.

    Besides the schema, the task's verifier must be a registered reward and accept its arguments.
    """
    prefix = f"{where}: " if where else ""
    if not isinstance(data, dict):
        raise ValidationError(f"{where or 'task'}", f"expected a JSON object, got {type(data).__name__}")
    if "id" not in data:
        # Derived from the content; when the question itself is bad, that is the error to report, so the
        # placeholder only keeps a missing id from being reported first.
        question, domain = data.get("question"), data.get("domain", DEFAULT_DOMAIN)
        derived = (
            task_id(question, domain if isinstance(domain, str) else "") if isinstance(question, str) else "x"
        )
        data = {"id": derived, **data}
    try:
        task = Task.model_validate(data)
    except pydantic.ValidationError as err:
        field, message = _field_of(err)
        raise ValidationError(prefix + field, message) from None
    try:
        check_task(task)
    except ValidationError as err:
        raise ValidationError(prefix + err.field, err.message.removeprefix(f"{err.field}: ")) from None
    return task


def load_jsonl(path: str | os.PathLike[str]) -> list[Task]:
    """Read tasks from a JSONL file (blank lines skipped); the first bad line raises ValidationError.

    Ids must be unique within the file.
    """
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValidationError(where, f"invalid JSON: {err.msg} (column {err.colno})") from None
            task = parse_task(data, where=where)
            if task.id in seen:
                raise ValidationError(
                    f"{where}: id", f"duplicate id {task.id!r} (first on line {seen[task.id]})"
                )
            seen[task.id] = number
            tasks.append(task)
    return tasks


def load_shipped(part: Literal["train", "validation"]) -> list[Task]:
    """The task set shipped with zoo-node (by trainer/tasks/generate.py): arithmetic, units and coding."""
    return load_jsonl(DATA_DIR / f"{part}.jsonl")
