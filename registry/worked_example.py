"""A worked example's parts: its question, its short correct answer and its optional reasoning.

An example (an Experience of kind "example", experience.py) holds the question as its `text`, an `answer`
written the way the model should write it, on one line or, for code, as a fenced block whose lines keep
their indentation (is_code_answer; such an answer needs library format 3, library.py), and brief
`reasoning` or none. Here are their limits, the normalisers that turn looser input into the stored form,
and the id an example derives from its content: "exp-" + the first 16 hex digits of
sha256("zoo.experience.example-id.v1" NUL domain NUL question NUL answer), a tag no lesson's id shares.
"""

from __future__ import annotations

import hashlib

from zoo.registry.validation import Problem, clean_string, normalise_text

MAX_QUESTION_CHARS = 2000  # an example's question
MAX_ANSWER_CHARS = 300  # an example's answer: short, the way the model should write it
MAX_REASONING_CHARS = 1000
_EXAMPLE_ID_TAG = b"zoo.experience.example-id.v1\x00"


def is_code_answer(answer: str) -> bool:
    """An example's answer that is a fenced code block (``` … ```, over several lines): a verified solution
    written the way the task asks for it, whose lines keep their indentation."""
    lines = answer.split("\n")
    return (
        len(lines) >= 3
        and lines[0].startswith("```")
        and lines[-1] == "```"
        and any(line.strip() for line in lines[1:-1])
    )


def normalise_answer(value: object) -> str:
    """The stored form of an example's answer: one line with whitespace runs collapsed, or a fenced code block
    whose lines keep their indentation (trailing whitespace and outer blank lines dropped). Raises Problem."""
    if not isinstance(value, str):
        raise Problem("answer", f"must be a string (got {type(value).__name__})", value)
    block = value.replace("\r\n", "\n").strip()  # a block pasted from Windows keeps its lines
    if is_code_answer("\n".join(line.rstrip() for line in block.split("\n"))):
        lines = [line.rstrip() for line in clean_string(block, multiline=True, where="answer").split("\n")]
        return "\n".join(lines)
    return normalise_text(value, "answer")


def example_id(domain: str, question: str, answer: str) -> str:
    """Content-derived id of a worked example; inputs must already be normalised."""
    preimage = b"\x00".join((domain.encode(), question.encode(), answer.encode()))
    return "exp-" + hashlib.sha256(_EXAMPLE_ID_TAG + preimage).hexdigest()[:16]


# -- field normalisers for Experience.create() (raise Problem) ----------------------------------------


def example_question(value: object) -> str:
    question = clean_string(value, multiline=True, where="text").strip()
    if not 0 < len(question) <= MAX_QUESTION_CHARS:
        raise Problem("text", f"an example's question must have 1 to {MAX_QUESTION_CHARS} characters")
    return question


def example_answer(value: object) -> str:
    if value is None:
        raise Problem("answer", "an example needs its answer")
    answer = normalise_answer(value)
    if not 0 < len(answer) <= MAX_ANSWER_CHARS:
        raise Problem("answer", f"an example's answer must have 1 to {MAX_ANSWER_CHARS} characters")
    return answer


def example_reasoning(value: object) -> str | None:
    if value is None:
        return None
    reasoning = clean_string(value, multiline=True, where="reasoning").strip()
    if not 0 < len(reasoning) <= MAX_REASONING_CHARS:
        raise Problem("reasoning", f"reasoning must have 1 to {MAX_REASONING_CHARS} characters")
    return reasoning
