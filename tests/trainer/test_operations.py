"""Consolidation with worked examples in the library: critics rewrite rules, never examples."""

from __future__ import annotations

import asyncio

import pytest

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.registry.experience import Experience
from zoo.trainer.operations import Proposal, consolidate

BASE = "scripted"


def lesson(text: str) -> Experience:
    return Experience.create(text=text, domain="units.house", confidence=0.6, author="job:t", base_model=BASE)


def example(question: str, answer: str) -> Experience:
    return Experience.create(kind="example", text=question, answer=answer, domain="units.house",
                             confidence=0.6, author="job:t", base_model=BASE)  # fmt: skip


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def run(library: list[Experience], proposals: list[Proposal], embedder: SentenceTransformerEmbedder):
    async def merge(texts):
        return texts[0]

    return asyncio.run(
        consolidate(
            library,
            proposals,
            embed=embedder.embed,
            merge=merge,
            make=lambda text, domain: lesson(text),
            threshold=0.5,
        )
    )


def test_a_worked_example_is_kept_or_deleted_whole(embedder: SentenceTransformerEmbedder) -> None:
    worked = example("When converting 3 km to the house unit, what do you get?", "3000 m")
    rule = lesson("When converting kilometres to the house unit, write the answer in metres.")
    # A new rule worded like the example's question is a new lesson, not a rewrite of the example.
    similar = "When converting 3 km to the house unit, give the result in metres."
    out = run(
        [worked, rule],
        [
            Proposal(op="modify", target=worked.id, text="When asked, say 3000 m.", source="t1"),
            Proposal(op="add", text=similar, domain="units.house", source="t2"),
        ],
        embedder,
    )
    assert worked in out.experiences, "the example was changed"
    assert [r["reason"] for r in out.rejected] == ["a worked example cannot be rewritten (delete it instead)"]
    kinds = sorted((e.kind, e.text) for e in out.experiences)
    assert ("example", worked.text) in kinds
    # The added rule merged into the similar rule, or was added beside it; either way it is a lesson.
    assert all(e.kind == "lesson" for e in out.experiences if e.id != worked.id)

    deleted = run([worked, rule], [Proposal(op="delete", target=worked.id, source="t3")], embedder)
    assert deleted.experiences == [rule]
    assert deleted.applied == [{"op": "delete", "id": worked.id, "text": worked.text, "sources": ["t3"]}]
