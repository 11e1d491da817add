"""Worked examples beside lessons: schema, ids, and the format-2 encoding that leaves format-1 libraries
(and every lesson's Merkle leaf) exactly as they were."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from zoo.registry.canonical import (
    SCHEMA_V1,
    SCHEMA_V2,
    SCHEMA_V3,
    decode_experience,
    decode_library,
    encode_experience,
    encode_library,
)
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.merkle import library_leaves, library_root, prove_experience, verify_inclusion
from zoo.registry.worked_example import example_id

Make = Callable[..., Experience]


def example(
    question: str = "How long is 3 km in the house unit?", answer: str = "3000 m", **kw
) -> Experience:
    fields = {"domain": "units.house", "confidence": 0.5, "author": "job:test", "base_model": "m",
              "created_at": "2026-03-01T00:00:00Z", **kw}  # fmt: skip
    return Experience.create(kind="example", text=question, answer=answer, **fields)


def test_an_example_is_a_question_and_its_answer() -> None:
    e = example(reasoning="  1 km is 1000 m.  ")
    assert (e.kind, e.text, e.answer, e.reasoning) == (
        "example",
        "How long is 3 km in the house unit?",
        "3000 m",
        "1 km is 1000 m.",
    )
    assert e.id == example_id("units.house", e.text, "3000 m")
    # The id covers the question and the answer, not confidence, reasoning or provenance.
    assert example(confidence=0.9).id == e.id == example(reasoning="other words").id
    assert example(answer="3 km").id != e.id and example(question="How long is 4 km?").id != e.id
    # Questions may span lines (code, tables); answers are one normalised line.
    multi = example(question="Rows:\n  a | b\n  1 | 2", answer=" 3  \n m ")
    assert multi.text == "Rows:\n  a | b\n  1 | 2" and multi.answer == "3 m"
    # replace() keeps the kind and re-derives the id from the new content.
    changed = e.replace(answer="3,000 m")
    assert changed.kind == "example" and changed.id == example_id("units.house", e.text, "3,000 m")


def test_a_lesson_and_an_example_never_share_an_id(make_experience: Make) -> None:
    lesson = make_experience(0)
    same_words = example(question=lesson.text, answer="x", domain=lesson.domain)
    assert lesson.kind == "lesson" and lesson.answer is None
    assert same_words.id != lesson.id


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"answer": None}, "answer", "needs its answer"),
        ({"answer": "   "}, "answer", "1 to 300"),
        ({"answer": "x" * 301}, "answer", "1 to 300"),
        ({"question": " \n "}, "text", "1 to 2000"),
        ({"question": "q" * 2001}, "text", "1 to 2000"),
        ({"reasoning": "r" * 1001}, "reasoning", "1 to 1000"),
        ({"question": "bell \x07?"}, "text", "control character"),
    ],
)
def test_bad_examples_name_the_field(changes: dict, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        example(**changes)
    assert caught.value.field == field and words in str(caught.value)


def test_a_code_answer_keeps_its_lines_and_a_one_line_answer_is_single_spaced() -> None:
    code = "```python\ndef f(x):   \n    return  x * 3\n```"
    e = example(question="Write f.", answer=f"\n  {code}\n\n")
    assert e.answer == "```python\ndef f(x):\n    return  x * 3\n```"  # indentation and inner spaces kept
    assert decode_experience(encode_experience(e)) == e
    assert example(answer="3000\n  m").answer == "3000 m", "not a fenced block: one line, as before"
    assert example(answer=code.replace("\n", "\r\n")).answer == e.answer
    assert example(answer="```\n  \n```").answer == "``` ```", "a block with no code is not a code answer"
    # A canonical document must hold the normal form: trailing spaces in a code line are not canonical.
    spaced = encode_experience(e).replace(b"def f(x):\\n", b"def f(x):  \\n")
    assert spaced != encode_experience(e)
    with pytest.raises(ValidationError) as caught:
        decode_experience(spaced)
    assert "answer" in str(caught.value)
    # A library holding it is format 3: a format-2 reader, which holds answers single-spaced, must refuse it.
    lib = Library.create(version=1, base_model="m", experiences=[e, example()])
    assert lib.schema == SCHEMA_V3 and decode_library(encode_library(lib)) == lib
    with pytest.raises(ValidationError, match=r"must be 'zoo\.experience-library/3' for these experiences"):
        decode_library(encode_library(lib).replace(SCHEMA_V3.encode(), SCHEMA_V2.encode()))
    assert Library.create(version=1, base_model="m", experiences=[example()]).schema == SCHEMA_V2
    with pytest.raises(ValidationError) as caught:
        example(answer="```python\n" + "x = 1\n" * 60 + "```")
    assert caught.value.field == "answer" and "1 to 300" in str(caught.value)


def test_a_lesson_cannot_carry_an_answer_or_reasoning(make_experience: Make) -> None:
    lesson = make_experience(0)
    for field in ("answer", "reasoning"):
        with pytest.raises(ValidationError) as caught:
            lesson.replace(**{field: "42"})
        assert caught.value.field == field and "only an example" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        Experience.parse({**lesson.to_dict(), "kind": "rule"})
    assert caught.value.field == "kind"


def test_lessons_only_stay_format_1_byte_for_byte(library: Library) -> None:
    """Adding the example kind changed nothing for what exists: same schema tag, leaves, root and bytes."""
    data = encode_library(library)
    doc = json.loads(data)
    assert doc["schema"] == SCHEMA_V1
    assert all("kind" not in e and "answer" not in e for e in doc["experiences"])
    assert decode_library(data) == library
    for leaf in library_leaves(library):
        assert b'"kind"' not in leaf


def test_a_library_with_an_example_is_format_2_and_verifies(library: Library) -> None:
    e = example(reasoning="1 km is 1000 m.")
    mixed = Library.create(version=2, base_model="m", experiences=[*library.experiences, e],
                           parent_root="0x" + "ab" * 32)  # fmt: skip
    data = encode_library(mixed)
    doc = json.loads(data)
    assert doc["schema"] == SCHEMA_V2
    [shown] = [x for x in doc["experiences"] if x["id"] == e.id]
    assert (shown["kind"], shown["answer"], shown["reasoning"]) == ("example", "3000 m", "1 km is 1000 m.")
    assert decode_library(data) == mixed
    assert decode_experience(encode_experience(e)) == e
    # Lessons keep their leaves, so the root changes only by the example's own leaf.
    lesson_leaves = set(library_leaves(library))
    assert lesson_leaves <= set(library_leaves(mixed))
    proof, leaf = prove_experience(mixed, e.id)
    assert verify_inclusion(leaf, proof, library_root(mixed))
    # An example without reasoning writes null: the key set of an example is fixed.
    assert json.loads(encode_experience(example()))["reasoning"] is None


def test_schema_tags_must_match_the_content(library: Library) -> None:
    """One library, one encoding: a lessons-only library tagged 2, or an example tagged 1, is refused."""
    as_v2 = encode_library(library).replace(SCHEMA_V1.encode(), SCHEMA_V2.encode())
    with pytest.raises(ValidationError, match=r"must be 'zoo\.experience-library/1' for these experiences"):
        decode_library(as_v2)
    assert decode_library(as_v2, require_canonical=False) == library  # layout-tolerant mode normalises it
    mixed = Library.create(version=1, base_model="m", experiences=[*library.experiences, example()])
    as_v1 = encode_library(mixed).replace(SCHEMA_V2.encode(), SCHEMA_V1.encode())
    with pytest.raises(ValidationError, match=r"must be 'zoo\.experience-library/2' for these experiences"):
        decode_library(as_v1)
    with pytest.raises(ValidationError) as caught:
        decode_library(encode_library(library).replace(SCHEMA_V1.encode(), b"zoo.experience-library/9"))
    assert caught.value.field == "schema"


def test_a_lesson_document_with_a_kind_key_is_not_canonical(make_experience: Make) -> None:
    doc = json.loads(encode_experience(make_experience(0)))
    doc["kind"] = "lesson"
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    with pytest.raises(ValidationError, match="not in canonical form"):
        decode_experience(data)
