"""Training tasks for TF-GRPO: the `Task` schema, JSONL writing and the train/validation split (reading,
which checks each task's verifier among the rewards, is loading.py).

One task per JSONL line:

    {"id": "arith-001", "question": "...", "answer": "12", "domain": "math.arithmetic",
     "verifier": "exact_match", "verifier_args": {}, "instruction": "...", "reasoning": "..."}

Only `question` is required. `answer` may be left out (label-free tasks: the reward is agreement with the
group's majority answer, see rewards.MajorityVote); a number is accepted and kept as its JSON text.
`domain` uses the experience library's domain syntax (dotted lower-case words) so lessons learnt on a task
land in the matching library domain. `verifier` names a reward in rewards.REWARDS and `verifier_args` are
that reward's per-task arguments (for `unit_tests`, the test code). `instruction` is the system turn the
task is asked under (see `instruction_for` for the default). `reasoning` is optional brief working that
leads to the reference answer (as datasets such as GSM8K carry it): a worked example made from the task
shows it before the answer. A missing `id` is derived from the content, so re-generating an unchanged task
keeps its id.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from zoo.registry.errors import ValidationError
from zoo.registry.experience import DOMAIN_RE

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MAX_QUESTION_CHARS = 20_000
MAX_ANSWER_CHARS = 100_000  # coding tasks carry a whole reference solution or patch
MAX_INSTRUCTION_CHARS = 4_000
MAX_REASONING_CHARS = 1_000  # as an example experience's reasoning (zoo.registry.worked_example)
DEFAULT_DOMAIN = "general"
DEFAULT_VERIFIER = "exact_match"
DATA_DIR = Path(__file__).resolve().parent / "data"


class Task(BaseModel):
    """One training or validation problem and how to score a model's answer to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=f"^{ID_RE.pattern}$")
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    answer: str | None = Field(default=None, max_length=MAX_ANSWER_CHARS)
    domain: str = DEFAULT_DOMAIN
    verifier: str = DEFAULT_VERIFIER
    verifier_args: dict[str, Any] = Field(default_factory=dict)
    instruction: str | None = Field(default=None, max_length=MAX_INSTRUCTION_CHARS)
    reasoning: str | None = Field(default=None, max_length=MAX_REASONING_CHARS)

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is blank")
        return value

    @field_validator("instruction", "reasoning")
    @classmethod
    def _optional_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is blank (leave it out)")
        return value

    @field_validator("reasoning")
    @classmethod
    def _reasoning_needs_answer(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("answer") is None:
            raise ValueError("leads to a reference answer; a task without one cannot have it")
        return value

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_text(cls, value: Any) -> Any:
        # JSON numbers are common for math answers; keep their JSON spelling ("12", "0.75"). A bool is
        # refused: `true` is almost certainly a mistake, and "True" would never match a model's answer.
        if isinstance(value, bool):
            raise ValueError("must be a string or a number, not a boolean")
        if isinstance(value, int | float):
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError("must be a finite number")
            return json.dumps(value)
        return value

    @field_validator("domain")
    @classmethod
    def _domain_syntax(cls, value: str) -> str:
        if len(value) > 64 or not DOMAIN_RE.fullmatch(value):
            raise ValueError("must be dotted lower-case words, e.g. 'math.arithmetic'")
        return value

    @property
    def label_free(self) -> bool:
        """True when the task has no reference answer (only agreement-based rewards can score it)."""
        return self.answer is None


# The system turn a task is asked under, unless the task or its run names one. Math gets the paper's
# boxed-answer instruction; every other task an "Answer:" line, which exact_match reads as well.
MATH_INSTRUCTION = (
    "Solve the problem. Reason briefly, step by step, then give the final answer as \\boxed{ANSWER}."
)
GENERAL_INSTRUCTION = "Answer the question. Be brief, and end with a line 'Answer: <your answer>'."
VERIFIER_INSTRUCTIONS = {
    "unit_tests": "Solve the programming task. Reply with the complete code in one ```python code block.",
    "patch_similarity": "Fix the problem. Reply with a unified diff of the change.",
}


def instruction_for(task: Task, default: str | None = None) -> str:
    """The instruction a task is asked under: its own, else the run's `default` (a whole dataset's), else
    the one its verifier needs (code, patch), else the math instruction for math domains, else a general
    one. Instructions belong to tasks: a label task must not be told to box a number."""
    if task.instruction is not None:
        return task.instruction
    if default is not None:
        return default
    if task.verifier in VERIFIER_INSTRUCTIONS:
        return VERIFIER_INSTRUCTIONS[task.verifier]
    if task.domain == "math" or task.domain.startswith("math."):
        return MATH_INSTRUCTION
    return GENERAL_INSTRUCTION


def task_id(question: str, domain: str = DEFAULT_DOMAIN) -> str:
    """The id given to a task whose file omits one: a hash of its domain and question."""
    digest = hashlib.sha256(f"zoo.task.id.v1\x00{domain}\x00{question}".encode()).hexdigest()
    return "task-" + digest[:16]


def dump_task(task: Task) -> str:
    """One JSONL line (without the newline); key order is the schema's, so files diff cleanly."""
    data = task.model_dump(mode="json")
    for optional in ("instruction", "reasoning"):  # most tasks have neither: files stay as they were
        if data[optional] is None:
            del data[optional]
    return json.dumps(data, ensure_ascii=False, separators=(", ", ": "))


def write_jsonl(path: str | os.PathLike[str], tasks: Iterable[Task]) -> None:
    """Write tasks one per line, atomically (a reader never sees a half-written file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for task in tasks:
                fh.write(dump_task(task) + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _rank(seed: int, task: Task) -> str:
    # A hash rather than random.shuffle: the order does not depend on the input order or on the
    # Python version's PRNG, and adding a task to a file moves at most one other task across.
    return hashlib.sha256(f"zoo.task.split.v1\x00{seed}\x00{task.id}".encode()).hexdigest()


def split(tasks: Sequence[Task], validation_fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """Deterministic train/validation split, stratified by domain; both parts keep the input order.

    In each domain the tasks are ranked by sha256(seed, id) and the first floor(n·fraction + 0.5) go to
    validation, so every domain is represented in proportion (a small domain such as the coding tasks
    would otherwise easily end up entirely on one side). Ids must be unique.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise ValidationError("validation_fraction", f"must be in [0, 1), got {validation_fraction}")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValidationError("tasks", "ids must be unique to split deterministically")
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_domain[task.domain].append(task)
    validation_ids: set[str] = set()
    for members in by_domain.values():
        take = math.floor(len(members) * validation_fraction + 0.5)
        ranked = sorted(members, key=lambda t: _rank(seed, t))
        validation_ids.update(t.id for t in ranked[:take])
    train = [t for t in tasks if t.id not in validation_ids]
    validation = [t for t in tasks if t.id in validation_ids]
    return train, validation
