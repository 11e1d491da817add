"""The simplest alternative to a learned library: `lookup`, every labelled training task as a worked example
(its question, its reasoning if any, its reference answer), with no loop and no LLM call. Every learning
figure is stated beside it (and beside LoRA SFT on the same tasks: trainer/sft).

    python -m zoo.trainer.baselines --dataset train.jsonl --out lookup.json [--base-model ID]

writes it as a library file that `zoo-node eval --library` and `zoo-node train distill --experiences` take.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from zoo.registry.canonical import encode_library
from zoo.registry.experience import MAX_ANSWER_CHARS, MAX_QUESTION_CHARS, Experience, Library
from zoo.registry.fsutil import write_atomic
from zoo.trainer.tasks.schema import Task, load_jsonl

LOOKUP_AUTHOR = "job:lookup"
LOOKUP_CONFIDENCE = 0.5


def lookup_experiences(
    tasks: Iterable[Task], base_model: str, created_at: datetime | None = None
) -> list[Experience]:
    """Each labelled task (one that fits an experience) as a worked example, in task order."""
    when = created_at or datetime(2026, 1, 1, tzinfo=UTC)  # fixed: the same tasks give the same library
    out: dict[str, Experience] = {}
    for t in tasks:
        if t.answer is None or len(t.question) > MAX_QUESTION_CHARS or len(t.answer) > MAX_ANSWER_CHARS:
            continue
        reasoning = {"reasoning": t.reasoning} if t.reasoning else {}
        e = Experience.create(
            text=t.question, domain=t.domain, kind="example", answer=" ".join(t.answer.split()),
            confidence=LOOKUP_CONFIDENCE, author=LOOKUP_AUTHOR, base_model=base_model, created_at=when,
            **reasoning,  # type: ignore[arg-type]
        )  # fmt: skip
        out.setdefault(e.id, e)
    return list(out.values())


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
