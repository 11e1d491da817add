"""Context injection (HLLM paper §4.7) for both kinds of experience, within one token budget.

Lessons (rules) go in as `[id] text` with an instruction to apply and cite them: in the system turn, or
(`lesson_position = "user"`) right before the question in the last user turn. Worked
examples go in as earlier turns of the conversation, a user turn with the question and an assistant turn
with the answer, because small models follow examples where they ignore rules; the best-ranked example
sits closest to the real question, and the system turn lists the examples' ids so they can be cited too.
Experiences that do not fit are dropped whole, lowest score first, never cut mid-text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.inference.defaults import DEFAULT_LESSON_POSITION, LESSON_POSITIONS, LessonPosition
from zoo.registry.errors import ValidationError
from zoo.registry.worked_example import is_code_answer

INSTRUCTION = (
    "Below are experiences: lessons verified by this network. Apply the ones that fit the question and "
    "cite each one you use by writing its id in square brackets, like [exp-0123456789abcdef]."
)
EXAMPLES_LINE = "Worked examples (the earlier turns of this conversation): "
CITATION_RE = re.compile(r"\[(exp-[0-9a-f]{16})\]")

Messages = list[dict[str, str]]


class PromptTooLong(ValidationError):
    """The request does not fit the model's context window."""


@dataclass
class Assembled:
    messages: Messages
    used: list[Any]  # the hits whose experiences are in the prompt, best first
    dropped: list[Any] = field(default_factory=list)  # hits left out for the budget
    prompt_tokens: int = 0


def _is_example(hit: Any) -> bool:
    return getattr(hit.experience, "kind", "lesson") == "example"


def lesson_block(hits: Sequence[Any]) -> str:
    """The instruction and each lesson among `hits` as `[id] text`; empty without lessons."""
    lessons = [f"[{h.experience.id}] {h.experience.text}" for h in hits if not _is_example(h)]
    return "\n".join([INSTRUCTION, *lessons]) if lessons else ""


def examples_line(hits: Sequence[Any]) -> str:
    """The system-turn line listing the worked examples' ids (so they can be cited); empty without any."""
    examples = [f"[{h.experience.id}]" for h in hits if _is_example(h)]
    return EXAMPLES_LINE + " ".join(examples) if examples else ""


def experience_block(hits: Sequence[Any]) -> str:
    """The system-turn text when lessons sit in the system turn: the lessons, then the examples' ids."""
    return "\n".join(part for part in (lesson_block(hits), examples_line(hits)) if part)


def worked_answer(answer: str, reasoning: str | None = None) -> str:
    """A worked example's assistant turn: its reasoning (if any), then the line "Answer: …", or the code block
    itself when the answer is one. Supervised fine-tuning targets take the same form, so a tuned model answers
    as an example shows it."""
    final = answer if is_code_answer(answer) else f"Answer: {answer}"
    return final if not reasoning else f"{reasoning}\n{final}"


def example_turns(hits: Sequence[Any]) -> Messages:
    """The worked examples among `hits` (best first) as user/assistant turns, best one last."""
    turns: Messages = []
    for h in reversed([h for h in hits if _is_example(h)]):
        e = h.experience
        answer = worked_answer(e.answer, e.reasoning)
        turns += [{"role": "user", "content": e.text}, {"role": "assistant", "content": answer}]
    return turns


def _joined(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


def with_experiences(
    messages: Messages, hits: Sequence[Any], lesson_position: LessonPosition = DEFAULT_LESSON_POSITION
) -> Messages:
    """The messages with the experiences in: the system turn (merged into one the client sent) carries the
    lessons (or, with lesson_position "user", the last user turn starts with them) and the examples' ids;
    the worked examples are turns right after it, before the client's own turns."""
    if not hits:
        return list(messages)
    if lesson_position not in LESSON_POSITIONS:
        raise ValueError(f"lesson_position must be one of {LESSON_POSITIONS} (got {lesson_position!r})")
    messages = list(messages)
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if lesson_position == "user" and last_user is not None:
        block = examples_line(hits)
        turn = messages[last_user]
        messages[last_user] = {**turn, "content": _joined(lesson_block(hits), turn["content"])}
    else:
        block = experience_block(hits)
    if messages and messages[0]["role"] == "system":
        system = {"role": "system", "content": _joined(messages[0]["content"], block)}
        rest = messages[1:]
    else:
        system, rest = {"role": "system", "content": block}, messages
    turns = example_turns(hits)
    if not system["content"]:
        return [*turns, *rest]
    return [system, *turns, *rest]


def check_fits(field: str, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    """PromptTooLong (naming `field`) unless the prompt and the answer it may grow fit the context."""
    if prompt_tokens + max_tokens > context_length:
        raise PromptTooLong(
            field,
            f"the prompt takes {prompt_tokens} tokens and max_tokens is {max_tokens}; together they exceed "
            f"the model's context of {context_length} tokens",
            prompt_tokens=prompt_tokens,
            context_length=context_length,
        )


def assemble(
    messages: Messages,
    hits: Sequence[Any],
    count_tokens: Callable[[Messages], int],
    *,
    experience_budget: int,
    context_length: int,
    max_tokens: int,
    lesson_position: LessonPosition = DEFAULT_LESSON_POSITION,
) -> Assembled:
    """Fit as many of the hits (sorted best first) as the budget and the context window allow."""
    base = count_tokens(messages)
    check_fits("messages", base, max_tokens, context_length)
    ranked = sorted(hits, key=lambda h: (-h.score, h.experience.id))
    kept = list(ranked)
    while kept:
        candidate = with_experiences(messages, kept, lesson_position)
        total = count_tokens(candidate)
        if total - base <= experience_budget and total + max_tokens <= context_length:
            return Assembled(candidate, kept, ranked[len(kept) :], total)
        kept.pop()  # the lowest-scoring experience goes first
    return Assembled(list(messages), [], ranked, base)


def parse_citations(text: str, offered: Sequence[str]) -> list[str]:
    """Ids the answer cites, in order of first citation, among those it was offered."""
    allowed = set(offered)
    seen: list[str] = []
    for m in CITATION_RE.finditer(text):
        if m.group(1) in allowed and m.group(1) not in seen:
            seen.append(m.group(1))
    return seen
