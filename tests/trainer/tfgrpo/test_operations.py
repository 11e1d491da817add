"""Consolidation with worked examples in the library: critics rewrite rules, never examples."""

from __future__ import annotations

import asyncio

import pytest

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.registry.experience import Experience
from zoo.trainer.tfgrpo.critic import (
    MergeReply,
    OperationsReply,
    finished_part,
    operations_schema,
    parse_json_reply,
)
from zoo.trainer.tfgrpo.operations import Proposal, consolidate, screen_lesson

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


NOT_THE_CRITICS = "a worked example is not the critic's to rewrite or delete"


def test_a_worked_example_is_never_the_critics_to_rewrite_or_delete(
    embedder: SentenceTransformerEmbedder,
) -> None:
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
    assert [r["reason"] for r in out.rejected] == [
        "a worked example is not the critic's to rewrite or delete"
    ]
    kinds = sorted((e.kind, e.text) for e in out.experiences)
    assert ("example", worked.text) in kinds
    # The added rule merged into the similar rule, or was added beside it; either way it is a lesson.
    assert all(e.kind == "lesson" for e in out.experiences if e.id != worked.id)

    kept = run([worked, rule], [Proposal(op="delete", target=worked.id, source="t3")], embedder)
    assert kept.experiences == sorted([worked, rule], key=lambda e: e.id) and kept.applied == []
    assert [r["reason"] for r in kept.rejected] == [
        "a worked example is not the critic's to rewrite or delete"
    ]
    # The critic's grammar offers no example id at all: only lessons can be modified or deleted.
    shapes = operations_schema([rule.id], 3)["properties"]["operations"]["items"]["anyOf"]
    assert {s["properties"]["op"]["const"]: s["properties"].get("id", {}).get("enum") for s in shapes} == {
        "add": None,
        "modify": [rule.id],
        "delete": [rule.id],
    }


def test_prune_drops_experiences_whose_rollouts_did_worse_than_their_groups() -> None:
    from zoo.trainer.tfgrpo.operations import prune

    a, b, c, d = (lesson(f"When pruning case {x}, keep the library small and sharp.") for x in "abcd")
    # a: cited only by failing rollouts; b: as bad but tried 3 times only; c: offered to every rollout of
    # groups that mostly failed (1 right, 2 wrong: advantages +1.41, -0.71, -0.71), which says nothing
    # about c; d: cited by winners.
    credit = {a.id: [-2.8, 4], b.id: [-2.1, 3], c.id: [0.0, 6], d.id: [2.8, 4]}
    kept, drops = prune([a, b, c, d], credit, cap=10, min_uses=4)
    assert kept == [b, c, d]
    assert drops == [{"op": "drop", "id": a.id, "kind": "lesson", "text": a.text,
                      "reason": "mean advantage -0.70 over 4 uses"}]  # fmt: skip


def test_prune_keeps_the_best_under_the_cap_and_spares_new_ones() -> None:
    from zoo.trainer.tfgrpo.operations import prune

    low, mid, high, new = (lesson(f"When capping case {x}, drop the least useful lesson.") for x in "wxyz")
    credit = {low.id: [-0.4, 2], mid.id: [0.0, 2], high.id: [3.0, 5]}
    kept, drops = prune([low, mid, high, new], credit, cap=2, min_uses=100, protected={new.id})
    assert {e.id for e in kept} == {high.id, new.id}, "the new one (untried) and the best one stay"
    assert [d["id"] for d in drops] == [mid.id, low.id]  # in ranked order, best first
    assert all(d["reason"].startswith("over the cap of 2") for d in drops)
    worked = example("What is the code of item 7?", "ITEM-7")
    kept, drops = prune([worked, high], credit, cap=1, min_uses=100)
    assert kept == [high] and drops[0]["kind"] == "example", "examples are ranked with lessons"


def test_a_rewritten_lesson_keeps_the_record_of_the_one_it_replaces() -> None:
    from zoo.trainer.tfgrpo.operations import prune

    old = lesson("When adding, always add one more to the total at the end.")
    reworded = lesson("When adding numbers, add one extra to the total at the end.")
    credit = {old.id: [-2.8, 4]}
    kept, drops = prune([reworded], credit, cap=10, min_uses=4, renamed={old.id: reworded.id})
    assert kept == [] and drops[0]["id"] == reworded.id and "over 4 uses" in drops[0]["reason"]
    assert prune([reworded], credit, cap=10, min_uses=4) == ([reworded], [])  # without the link it escapes


def test_consolidation_takes_lessons_only(embedder: SentenceTransformerEmbedder) -> None:
    worked = Proposal(op="add", text="What is 3 km here?", kind="example", answer="3000 m", source="t")
    with pytest.raises(ValueError, match="add_examples"):
        run([], [worked], embedder)


QUESTION = "A fence is 1 m long. How long is the fence in the record?"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("When the fence is 1 m long.", "restates the question"),
        ("When how long is the fence in the record?", "restates the question"),
        ("When [insert text here]", "unfilled template"),
        ("When the answer is <answer>, write it.", "unfilled template"),
        ("When converting lengths, write ... in cm.", "unfilled template"),
        ("When a length is given in metres, record it in centimetres.", None),
        ("When asked how long a fence is in the record, give centimetres.", None),
        ("When x < 5 and y > 3, add them.", None),
        ("When long.", "no rule"),
        # Issue 37: what a TF-GRPO run on the bundled model kept as lessons.
        ("When the fence is 5 meters long", "no rule"),
        ("When this is a mistake", "no rule"),
        ("When a length is given in metres, record it in", "cut off"),
        ("When a length is given in metres, record it (in cm", "cut off"),
        ("When the fence is asked about, the fences long record.", "restates the question"),
        ("When lengths are recorded, multiply metres by 100.", None),
        ("If a length has metres and centimetres: convert the metres, then add.", None),
    ],
)
def test_screen_lesson_turns_away_what_teaches_nothing(text: str, reason: str | None) -> None:
    found = screen_lesson(text, QUESTION)
    assert found == reason if reason is None else (found is not None and reason in found), found


@pytest.mark.parametrize(
    ("cut", "kept"),
    [
        # cut inside the second lesson's text: the unfinished string is dropped, never half-kept
        ('{"operations": [{"op": "add", "text": "When a, do b."}, {"op": "add", "text": "When c', 1),
        # a modify that named its lesson but had not begun its text
        ('{"operations": [{"op": "delete", "id": "exp-1"}, {"op": "modify", "id": "exp-2", "te', 1),
        # the last text finished, only the closing brackets are missing
        ('{"operations": [{"op": "add", "text": "When a, do b."}, {"op": "add", "text": "When c, do d."', 2),
        ('{"operations": [{"op": "ad', 0),
    ],
)
def test_a_cut_reply_keeps_exactly_the_operations_it_finished(cut: str, kept: int) -> None:
    with pytest.raises(ValueError):
        parse_json_reply(cut, OperationsReply)
    reply = finished_part(cut, OperationsReply)
    assert reply is not None and len(reply.operations) == kept
    assert all(op.text or op.op == "delete" for op in reply.operations)
    assert finished_part('{"text": "When a, do', MergeReply) is None  # nothing finished to use
    assert finished_part("not json at all", OperationsReply) is None
