"""Where should a lesson sit? The held-out score of a *correct*, hand-written rule (each family's
convention, trainer/families.CONVENTIONS) in the system turn vs right before the question in the user
turn, alone and beside worked examples from the family's training split, on each shipped family.

This is the measurement behind the default of `inference.lesson_position`: the prompt is assembled by the
same code serving and learning jobs use (retrieval, ranking, budget), scored as a TF-GRPO validation
scores (greedy, one completion a task). Run it again on another model (--backend openai) before changing
that default for it.

Run: ./zoo bench lesson_position [--family lengths,habitats] [--examples 2] [--backend openai ...]
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from typing import Any

from tfgrpo import held_out_score, load_backend  # benchmarks/tfgrpo.py

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.trainer.tasks import families
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.spec import TfGrpoSpec


def examples_for(train: list[Task], n: int) -> list[Task]:
    """The first n training tasks, alternating answers where the family has few labels (balanced)."""
    labels = sorted({t.answer for t in train if t.answer})
    if len(labels) > 3:
        return train[:n]
    picked: list[Task] = []
    for i in range(n):
        label = labels[i % len(labels)]
        picked.append(next(t for t in train if t.answer == label and t not in picked))
    return picked


def experience(text: str, domain: str, model: str, **kind: Any) -> Experience:
    return Experience.create(text=text, domain=domain, confidence=0.5, author="job:bench", base_model=model,
                             created_at=datetime(2026, 1, 1, tzinfo=UTC), **kind)  # fmt: skip


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--family", default=",".join(families.FAMILIES))
    ap.add_argument("--examples", type=int, default=2, help="worked examples beside the rule")
    ap.add_argument("--rollout-max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--backend", choices=("transformers", "openai"), default="transformers")
    ap.add_argument("--base-url")
    ap.add_argument("--model")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    backend = load_backend(args)
    llm = LLM(backend, args.concurrency)
    embedder = SentenceTransformerEmbedder()
    model = backend.model_id
    rows: dict[str, dict[str, float]] = {}
    for name in args.family.split(","):
        test = load_jsonl(families.path(name, "test"))
        train = load_jsonl(families.path(name, "train"))
        domain = test[0].domain
        rule = experience(families.CONVENTIONS[name], domain, model)
        shown = [experience(t.question, domain, model, kind="example", answer=t.answer)
                 for t in examples_for(train, args.examples)]  # fmt: skip
        conditions: list[tuple[str, list[Experience], str]] = [
            ("nothing", [], "system"),
            ("rule in the system turn", [rule], "system"),
            ("rule in the user turn", [rule], "user"),
            (f"{len(shown)} examples", shown, "system"),
            (f"{len(shown)} examples + rule in the system turn", [rule, *shown], "system"),
            (f"{len(shown)} examples + rule in the user turn", [rule, *shown], "user"),
        ]
        for label, exps, position in conditions:
            spec = TfGrpoSpec.parse(
                {"lesson_position": position, "rollout_max_tokens": args.rollout_max_tokens}
            )
            library = Library.create(version=1, base_model=model, experiences=exps)
            score = await held_out_score(spec, llm, embedder, library, test)
            rows.setdefault(label, {})[name] = score
            print(f"  [{name}] {label}: {score:.3f}", flush=True)
    names = args.family.split(",")
    print(f"\nheld-out score ({model}, greedy, {len(test)} tasks a family)")
    print(f"  {'condition':<44}" + "".join(f"{n:>10}" for n in names))
    for label, scores in rows.items():
        print(f"  {label:<44}" + "".join(f"{scores[n]:>10.3f}" for n in names))


if __name__ == "__main__":
    asyncio.run(main())
