"""Training pairs of a supervised LoRA run: a prompt (the node's bare prompt for a task: its instruction and
question, no experiences) and the completion the model should learn to write after it.

Where pairs come from is the job's kind: a labelled task answered as a worked example shows it
(`task_pairs`), a library's worked examples (`example_pairs`), or completions that a verifier passed
(`Pair(source="rollout")`, made by collect.py for rft/distill). `pairs.jsonl` in a run's directory lists what
its adapter was trained on, and is how the worker processes of a multi-process run receive them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from zoo.inference.prompt import worked_answer
from zoo.registry.experience import Experience
from zoo.registry.fsutil import write_atomic
from zoo.registry.worked_example import is_code_answer
from zoo.trainer.prompting import Messages, bare_messages
from zoo.trainer.tasks.schema import VERIFIER_INSTRUCTIONS, Task

PAIRS_FILE = "pairs.jsonl"
Source = Literal["task", "example", "rollout"]


@dataclass(frozen=True)
class Pair:
    """One supervised example: `completion` is learned after `messages` (the prompt, chat turns)."""

    id: str  # the task's or the experience's id
    messages: Messages
    completion: str
    source: Source
    reward: float | None = None  # a rollout's verifier score


def task_pairs(tasks: Iterable[Task], instruction: str | None = None) -> list[Pair]:
    """Each labelled task as a worked example answers it (its reasoning, if any, then "Answer: …");
    tasks without a reference answer have nothing to learn from and are left out."""
    return [
        Pair(t.id, bare_messages(t, instruction), worked_answer(t.answer, t.reasoning), "task")
        for t in tasks
        if t.answer is not None
    ]


def example_task(e: Experience) -> Task:
    """A worked example as a task: its question, its answer as the reference. A code example is asked under
    the code instruction, as the task it came from was."""
    code = VERIFIER_INSTRUCTIONS["unit_tests"] if e.answer is not None and is_code_answer(e.answer) else None
    return Task(id=f"ex-{e.id}", question=e.text, answer=e.answer, domain=e.domain, reasoning=e.reasoning,
                instruction=code)  # fmt: skip


def example_pairs(experiences: Iterable[Experience], instruction: str | None = None) -> list[Pair]:
    """A library's worked examples as pairs, answered as the prompt shows them."""
    return [
        Pair(
            e.id, bare_messages(example_task(e), instruction), worked_answer(e.answer, e.reasoning), "example"
        )
        for e in experiences
        if e.kind == "example" and e.answer is not None
    ]


def write_pairs(path: Path, pairs: Sequence[Pair]) -> None:
    write_atomic(path, "".join(json.dumps(asdict(p), sort_keys=True) + "\n" for p in pairs).encode())


def read_pairs(path: Path) -> list[Pair]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(Pair(d["id"], d["messages"], d["completion"], d["source"], d.get("reward")))
    return out
