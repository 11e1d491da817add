"""The simplest alternative to a learned library: `lookup`, every labelled training task as a worked example
(its question, its reasoning if any, its reference answer), with no loop and no LLM call. Every learning
figure is stated beside it (and beside LoRA SFT on the same tasks: trainer/sft). Where labels are hidden
(label-free learning), `majority_labelled` gives the tasks the model's own majority answers instead, which
the same two baselines are then built from.

    python -m zoo.trainer.baselines --dataset train.jsonl --out lookup.json [--base-model ID]

writes it as a library file that `zoo-node eval --library` and `zoo-node train distill --experiences` take.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zoo.registry.canonical import encode_library
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.fsutil import write_atomic
from zoo.registry.library import Library
from zoo.trainer.prompting import bare_messages
from zoo.trainer.rewards import SHORT_ANSWER_VERIFIERS, get_reward
from zoo.trainer.schedule import seed_of
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import Task

LOOKUP_AUTHOR = "job:lookup"
LOOKUP_CONFIDENCE = 0.5


def lookup_experiences(
    tasks: Iterable[Task], base_model: str, created_at: datetime | None = None, *, reward: str | None = None
) -> list[Experience]:
    """Each labelled short-answer task (its verifier, or `reward` when given, checks a final answer) that
    fits an experience, as a worked example, in task order. A task an experience cannot hold (a control
    character in its question, an answer too long) is left out, not fatal."""
    when = created_at or datetime(2026, 1, 1, tzinfo=UTC)  # fixed: the same tasks give the same library
    out: dict[str, Experience] = {}
    for t in tasks:
        if t.answer is None or (reward or t.verifier) not in SHORT_ANSWER_VERIFIERS:
            continue
        reasoning = {"reasoning": t.reasoning} if t.reasoning else {}
        try:
            e = Experience.create(
                text=t.question, domain=t.domain, kind="example", answer=" ".join(t.answer.split()),
                confidence=LOOKUP_CONFIDENCE, author=LOOKUP_AUTHOR, base_model=base_model, created_at=when,
                **reasoning,  # type: ignore[arg-type]
            )  # fmt: skip
        except ValidationError:
            continue
        out.setdefault(e.id, e)
    return list(out.values())


async def majority_labelled(
    llm: Any, tasks: Sequence[Task], *, samples: int = 5, max_tokens: int = 64, temperature: float = 0.7
) -> list[Task]:
    """The tasks labelled with the model's own majority answer over `samples` sampled completions (the
    bare prompt; majority_vote's rule: at least two agree), reasoning dropped; tasks without a majority
    are left out. No reference answer is read."""
    vote = get_reward("majority_vote")

    async def one(task: Task) -> Task | None:
        replies = await asyncio.gather(*(
            llm.chat(bare_messages(task), role="majority", max_tokens=max_tokens, temperature=temperature,
                     seed=seed_of("majority", task.id, j))
            for j in range(samples)
        ))  # fmt: skip
        majority = vote.group_scores(task, [r.text for r in replies])[0].details.get("majority")
        if not majority:
            return None
        return task.model_copy(update={"answer": str(majority), "reasoning": None})

    labelled = await asyncio.gather(*(one(t) for t in tasks))
    return [t for t in labelled if t is not None]


def lookup_library(tasks: Iterable[Task], base_model: str) -> Library:
    experiences = lookup_experiences(tasks, base_model)
    return Library.create(
        version=1,
        base_model=base_model,
        experiences=experiences,
        description=f"lookup baseline: {len(experiences)} labelled tasks as worked examples",
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the lookup library of a labelled task file.")
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    args = ap.parse_args(argv)
    library = lookup_library(load_jsonl(args.dataset), args.base_model)
    write_atomic(args.out, encode_library(library))
    print(f"{args.out}: {len(library.experiences)} worked examples")


if __name__ == "__main__":
    main()
