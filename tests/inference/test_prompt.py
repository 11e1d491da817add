"""Prompt assembly: lessons in the system turn, worked examples as earlier turns, dropped whole by lowest
score to fit the budget."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from zoo.inference.prompt import (
    EXAMPLES_LINE,
    INSTRUCTION,
    PromptTooLong,
    assemble,
    parse_citations,
    with_experiences,
)
from zoo.registry.experience import Experience

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass
class Hit:
    experience: Experience
    score: float


def exp(text: str, domain: str = "math.arithmetic") -> Experience:
    return Experience.create(text=text, domain=domain, confidence=0.8, author="job:test", base_model=BASE)


def words(messages: list[dict[str, str]]) -> int:
    """A deterministic token counter for the budget logic: one token per whitespace-separated word."""
    return sum(len(m["content"].split()) + 2 for m in messages)


HITS = [
    Hit(exp("When adding numbers, align the digits by place value first."), 0.9),
    Hit(exp("When a problem asks for a total, list every quantity with its unit."), 0.7),
    Hit(exp("When converting units, write the factor as a fraction that cancels.", "units.conversion"), 0.5),
]
USER = [{"role": "user", "content": "What is 12 plus 30?"}]


def test_all_fit_in_score_order() -> None:
    a = assemble(
        USER, list(reversed(HITS)), words, experience_budget=1000, context_length=4096, max_tokens=64
    )
    assert [h.score for h in a.used] == [0.9, 0.7, 0.5]
    system = a.messages[0]
    assert system["role"] == "system" and system["content"].startswith(INSTRUCTION)
    lines = system["content"].splitlines()[1:]
    assert lines == [f"[{h.experience.id}] {h.experience.text}" for h in HITS]
    assert a.messages[1:] == USER
    assert a.prompt_tokens == words(a.messages)


def test_budget_drops_lowest_scores_whole() -> None:
    full = words(with_experiences(USER, HITS)) - words(USER)
    two = words(with_experiences(USER, HITS[:2])) - words(USER)
    assert two < full
    a = assemble(USER, HITS, words, experience_budget=two, context_length=4096, max_tokens=64)
    assert [h.score for h in a.used] == [0.9, 0.7]
    assert [h.score for h in a.dropped] == [0.5]
    # Every kept experience appears whole; the dropped one does not appear at all.
    content = a.messages[0]["content"]
    assert all(h.experience.text in content for h in a.used)
    assert HITS[2].experience.text not in content
    assert assemble(USER, HITS, words, experience_budget=0, context_length=4096, max_tokens=64).used == []


def test_context_window_also_limits_experiences() -> None:
    base = words(USER)
    a = assemble(USER, HITS, words, experience_budget=10_000, context_length=base + 64 + 20, max_tokens=64)
    assert words(a.messages) + 64 <= base + 64 + 20
    assert len(a.used) < len(HITS)


def test_oversized_prompt_is_refused_with_the_limit() -> None:
    with pytest.raises(PromptTooLong) as e:
        assemble(USER, HITS, words, experience_budget=100, context_length=10, max_tokens=4)
    assert "context of 10 tokens" in str(e.value)
    assert e.value.field == "messages"


def test_client_system_prompt_is_kept() -> None:
    msgs = [{"role": "system", "content": "Answer in French."}, *USER]
    out = with_experiences(msgs, HITS[:1])
    assert out[0]["content"].startswith("Answer in French.\n\n" + INSTRUCTION)
    assert len(out) == 2


def test_citations_only_count_offered_ids() -> None:
    ids = [h.experience.id for h in HITS]
    text = f"Use [{ids[1]}] then [{ids[0]}], again [{ids[1]}], and [exp-ffffffffffffffff]."
    assert parse_citations(text, ids) == [ids[1], ids[0]]
    assert parse_citations("no citations", ids) == []


def example(question: str, answer: str, reasoning: str | None = None) -> Experience:
    return Experience.create(
        kind="example",
        text=question,
        answer=answer,
        reasoning=reasoning,
        domain="units.house",
        confidence=0.8,
        author="job:test",
        base_model=BASE,
    )


EXAMPLES = [
    Hit(example("How long is 3 km in the house unit?", "3000 m"), 0.95),
    Hit(example("How long is 2 km in the house unit?", "2000 m", "1 km is 1000 m."), 0.6),
]


def test_examples_are_earlier_turns_and_lessons_stay_in_the_system_turn() -> None:
    hits = [HITS[0], *EXAMPLES]
    a = assemble(USER, hits, words, experience_budget=1000, context_length=4096, max_tokens=64)
    system, *turns = a.messages
    lines = system["content"].splitlines()
    assert lines[1] == f"[{HITS[0].experience.id}] {HITS[0].experience.text}"
    # The examples are cited by id in the system turn, never as lesson lines.
    ids = " ".join(f"[{h.experience.id}]" for h in EXAMPLES)
    assert lines[2] == EXAMPLES_LINE + ids and len(lines) == 3
    # Best example last, right before the real question; reasoning precedes the answer line.
    assert turns == [
        {"role": "user", "content": "How long is 2 km in the house unit?"},
        {"role": "assistant", "content": "1 km is 1000 m.\nAnswer: 2000 m"},
        {"role": "user", "content": "How long is 3 km in the house unit?"},
        {"role": "assistant", "content": "Answer: 3000 m"},
        *USER,
    ]
    assert [h.score for h in a.used] == [0.95, 0.9, 0.6]


def test_a_code_example_is_the_assistants_whole_turn() -> None:
    code = "```python\ndef triple(x):\n    return x * 3\n```"
    hit = Hit(example("Write a Python function `triple(x)`.", code), 0.9)
    a = assemble(USER, [hit], words, experience_budget=1000, context_length=4096, max_tokens=64)
    assert a.messages[1:3] == [
        {"role": "user", "content": "Write a Python function `triple(x)`."},
        {"role": "assistant", "content": code},  # no "Answer:" line: the code block as the task asks for it
    ]


def test_examples_share_the_budget_and_are_dropped_whole() -> None:
    hits = [HITS[0], *EXAMPLES]
    without_last = words(with_experiences(USER, hits[:2])) - words(USER)
    a = assemble(USER, hits, words, experience_budget=without_last, context_length=4096, max_tokens=64)
    assert [h.score for h in a.used] == [0.95, 0.9] and [h.score for h in a.dropped] == [0.6]
    contents = " ".join(m["content"] for m in a.messages)
    assert "2 km" not in contents and "3000 m" in contents


def test_examples_go_before_the_clients_conversation() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": "42"},
            {"role": "user", "content": "And 5 km?"}]  # fmt: skip
    out = with_experiences(msgs, EXAMPLES[:1])
    # With examples only, the system turn just lists them: no lesson instruction to follow.
    assert out[0]["content"] == f"Be brief.\n\n{EXAMPLES_LINE}[{EXAMPLES[0].experience.id}]"
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[3:] == msgs[1:]


def test_lessons_may_sit_right_before_the_question() -> None:
    """lesson_position "user": the lessons start the last user turn; the examples stay earlier turns and
    the system turn lists only their ids; the budget counts the lessons wherever they sit."""
    msgs = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": "42"},
            {"role": "user", "content": "And 5 km?"}]  # fmt: skip
    hits = [HITS[0], EXAMPLES[0]]
    out = with_experiences(msgs, hits, "user")
    assert out[0] == {
        "role": "system",
        "content": f"Be brief.\n\n{EXAMPLES_LINE}[{EXAMPLES[0].experience.id}]",
    }
    assert (
        out[-1]["content"]
        == f"{INSTRUCTION}\n[{HITS[0].experience.id}] {HITS[0].experience.text}\n\nAnd 5 km?"
    )
    assert out[3:-1] == msgs[1:-1], "earlier client turns are untouched"
    # Without a system turn and without examples, none is added.
    assert [m["role"] for m in with_experiences(USER, HITS[:1], "user")] == ["user"]
    a = assemble(USER, HITS, words, experience_budget=1000, context_length=4096, max_tokens=64,
                 lesson_position="user")  # fmt: skip
    assert len(a.used) == 3 and a.messages[-1]["content"].endswith(USER[0]["content"])
    with pytest.raises(ValueError, match="lesson_position"):
        with_experiences(USER, HITS, "footer")  # type: ignore[arg-type]


def test_lessons_for_the_user_turn_fall_back_to_the_system_turn_without_one() -> None:
    only_system = [{"role": "system", "content": "Be brief."}]
    out = with_experiences(only_system, HITS[:1], "user")
    lesson = f"[{HITS[0].experience.id}] {HITS[0].experience.text}"
    assert out == [{"role": "system", "content": f"Be brief.\n\n{INSTRUCTION}\n{lesson}"}]
    empty_system = [{"role": "system", "content": ""}, *USER]
    out = with_experiences(empty_system, EXAMPLES[:1], "user")
    assert out[0] == {"role": "system", "content": f"{EXAMPLES_LINE}[{EXAMPLES[0].experience.id}]"}
