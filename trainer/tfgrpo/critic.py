"""The three LLM stages of a TF-GRPO step (HLLM paper §4, Algorithm 1), and the JSON discipline they need.

- Stage 1, `summarise`: one rollout, step by step, given its grade (the reward's reason) and the reference.
- Stage 2, `compare`: a whole group's summaries against the library → at most N operations as JSON (its
  prompt fitted to the critic's context by a stated rule: `fitted_compare_messages`):
  {"operations": [{"op": "add", "text": ...}, {"op": "modify", "id": ..., "text": ...},
                  {"op": "delete", "id": ...}]}
- Stage 3, `merge`: several near-duplicate lessons (found by embedding similarity) → one lesson as JSON:
  {"text": ...}; also used to shorten a lesson that breaks the 32-word limit.

On a backend that constrains decoding (the local transformers and vLLM backends), each JSON stage is asked
with a JSON Schema as its response format, so even the bundled 135M model always answers with the right
shape: ids limited to the library's (a modify only of a lesson: worked examples are not rewritten), every
lesson text one the library accepts (its trigger word first, a bounded number of bounded words).
Elsewhere, models wrap JSON in prose or code fences, or break it: `ask_json` takes the first JSON object
that parses and validates; otherwise it asks again with a stricter instruction that quotes the error, up to
`max_retries` times, and then gives up with None. Retries and give-ups are counted in `JsonStats` and end
up in the job report: never a crash, never a silent drop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from zoo.inference.backend_protocol import ResponseFormat
from zoo.registry.errors import ZooError
from zoo.registry.experience import MAX_TEXT_CHARS, MAX_WORDS, TRIGGER_WORDS, Experience
from zoo.trainer.tfgrpo.llm import LLM, ContextTooSmall

M = TypeVar("M", bound=BaseModel)
STRICT_MARK = "Your previous reply could not be used"
_FENCE_RE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


class OperationModel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    op: Literal["add", "modify", "delete"]
    id: str = ""
    text: str = ""


# The fields an operation needs, by kind: what a reply cut by the token limit must have finished.
_NEEDS = {"add": ("text",), "modify": ("id", "text"), "delete": ("id",)}


def _finished(op: dict[str, Any]) -> bool:
    kind = op.get("op")
    return kind in _NEEDS and all(name in op for name in _NEEDS[kind])


class OperationsReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    operations: list[OperationModel] = Field(max_length=50)

    @model_validator(mode="before")
    @classmethod
    def _finished_operations_only(cls, value: Any, info: ValidationInfo) -> Any:
        """Validating the prefix of a reply cut by the token limit (context {"cut": True}): keep only the
        operations it finished; the one it was writing is dropped, never guessed."""
        if info.context and info.context.get("cut") and isinstance(value, dict):
            ops = value.get("operations")
            if isinstance(ops, list):
                done = [op for op in ops if isinstance(op, dict) and _finished(op)]
                value = {**value, "operations": done}
        return value


class MergeReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field(min_length=1, max_length=2000)


# A lesson as the registry accepts it and screen_lesson keeps it, as a JSON Schema pattern the grammar holds
# the critic to: its trigger word first, a condition of at most CONDITION_WORDS words ending in a comma,
# colon or semicolon, then a rule of at least two words; single-spaced words of at most WORD_CHARS
# characters, as many as fit MAX_TEXT_CHARS (xgrammar ignores maxLength beside a pattern, so the pattern
# itself bounds the length; without a bound a small model runs one endless "word" into the token limit).
WORD_CHARS = 15
CONDITION_WORDS = 10
_MORE_WORDS = min(MAX_WORDS - 1, (MAX_TEXT_CHARS - max(map(len, TRIGGER_WORDS)) - 1) // (WORD_CHARS + 1))
_WORD_RE = rf" [^\s]{{1,{WORD_CHARS}}}"
LESSON_PATTERN = (
    rf"^({'|'.join(TRIGGER_WORDS)})( [^\s,:;]{{1,{WORD_CHARS}}}){{1,{CONDITION_WORDS}}}[,:;]"
    rf"({_WORD_RE}){{2,{_MORE_WORDS - CONDITION_WORDS}}}$"
)
LESSON_TEXT: dict[str, Any] = {"type": "string", "pattern": LESSON_PATTERN}


def operations_schema(lesson_ids: Sequence[str], max_ops: int) -> dict[str, Any]:
    """The compare stage's reply as a JSON Schema: at most max_ops operations, each a valid lesson text; a
    modify or delete names an existing lesson (without any, only additions are possible). Worked examples
    are not the critic's: a reference or a verifier vouches for each, and only validation credit or the size
    cap removes one."""

    def shape(op: str, **fields: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"op": {"const": op}, **fields},
            "required": ["op", *fields],
            "additionalProperties": False,
        }

    shapes = [shape("add", text=LESSON_TEXT)]
    if lesson_ids:
        shapes.append(shape("modify", id={"enum": sorted(lesson_ids)}, text=LESSON_TEXT))
        shapes.append(shape("delete", id={"enum": sorted(lesson_ids)}))
    return {
        "type": "object",
        "properties": {
            "operations": {"type": "array", "items": {"anyOf": shapes}, "maxItems": max(1, max_ops)}
        },
        "required": ["operations"],
        "additionalProperties": False,
    }


MERGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": LESSON_TEXT},
    "required": ["text"],
    "additionalProperties": False,
}


@dataclass
class JsonStats:
    """Replies that needed a retry, requests given up after every retry, and constrained replies cut by the
    token limit whose finished part was used, per stage."""

    retries: int = 0
    failures: int = 0
    cut: int = 0

    def to_json(self) -> dict[str, int]:
        return {"retries": self.retries, "failures": self.failures, "cut": self.cut}


class JsonReplyError(ZooError, ValueError):
    """A model's reply holds no JSON object that validates; the message says what was wrong with the last."""


def parse_json_reply(text: str, model: type[M]) -> M:
    """The first JSON object in `text` (fenced or bare) that validates as `model`; JsonReplyError if none."""
    candidates = [m.group(1) for m in _FENCE_RE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    last_error = "no JSON object found"
    for chunk in candidates:
        for start in (i for i, ch in enumerate(chunk) if ch == "{"):
            try:
                value, _end = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError as e:
                last_error = f"invalid JSON: {e.msg}"
                continue
            try:
                return model.model_validate(value)
            except pydantic.ValidationError as e:
                problem = e.errors(include_url=False)[0]
                where = ".".join(str(p) for p in problem["loc"]) or "reply"
                last_error = f"{where}: {problem['msg']}"
    raise JsonReplyError(last_error)


def finished_part(text: str, model: type[M]) -> M | None:
    """What a grammar-constrained reply cut by the token limit finished, or None. The grammar makes the
    text a valid prefix of a schema-conforming reply, so it parses as partial JSON (pydantic's partial mode
    drops the unfinished string); the model, told the reply was cut, keeps only finished items."""
    try:
        value = pydantic_core.from_json(text, allow_partial=True)
        return model.model_validate(value, context={"cut": True})
    except (ValueError, pydantic.ValidationError):
        return None


async def ask_json(
    llm: LLM,
    messages: list[dict[str, str]],
    model: type[M],
    example: str,
    *,
    role: str,
    stats: JsonStats,
    max_retries: int,
    max_tokens: int,
    seed: int,
    schema: dict[str, Any] | None = None,
) -> M | None:
    """Ask for JSON matching `model`, retrying with a stricter instruction; None after the last retry.

    With a schema and a backend that constrains decoding, the reply is generated to the schema."""
    convo = list(messages)
    fmt = ResponseFormat("json_schema", json.dumps(schema)) if schema and llm.constrains_json else None
    for attempt in range(max_retries + 1):
        if attempt:
            stats.retries += 1
        reply = await llm.chat(
            convo, role=role, max_tokens=max_tokens, temperature=0.0, seed=seed + attempt, response_format=fmt
        )
        try:
            return parse_json_reply(reply.text, model)
        except JsonReplyError as e:
            # Under a grammar the only way to an unparsable reply is the token limit: its finished part is
            # sound, and a retry would be cut the same way (the schema bounds each text, not their sum).
            finished = finished_part(reply.text, model) if fmt and reply.finish_reason == "length" else None
            if finished is not None:
                stats.cut += 1
                return finished
            convo = [
                *messages,
                {"role": "assistant", "content": reply.text[:2000]},
                {
                    "role": "user",
                    "content": f"{STRICT_MARK} ({e}). Reply with exactly one JSON object and nothing else "
                    f"(no prose, no code fences), shaped like: {example}",
                },
            ]
    stats.failures += 1
    return None


# -- prompts -----------------------------------------------------------------------------------------

LESSON_RULES = (
    f"Each lesson is one sentence of at most {MAX_WORDS} words that starts with its trigger "
    f'(one of: {", ".join(TRIGGER_WORDS)}), then its condition, a comma, and the rule to follow ("When a '
    'length is given in metres, record it in centimetres."); it states a general strategy rather than this '
    "problem's numbers, and can be applied to similar problems."
)

SUMMARISE_SYSTEM = (
    "You review one attempt at a problem. Describe, step by step and briefly, what the attempt did, "
    "which step went right or wrong, and why. Mention which of the offered experiences it applied."
)

COMPARE_SYSTEM = (
    "You improve a library of experiences (short lessons) that is given to a model before it answers. "
    "You see several graded attempts at the same problem. Compare the better attempts with the worse "
    "ones and decide how the library should change so future attempts succeed. " + LESSON_RULES
)

MERGE_SYSTEM = "You edit a library of experiences (short lessons). " + LESSON_RULES

OPS_EXAMPLE = (
    '{"operations": [{"op": "add", "text": "When ..."}, {"op": "modify", "id": "exp-0123456789abcdef", '
    '"text": "When ..."}, {"op": "delete", "id": "exp-0123456789abcdef"}]}'
)
MERGE_EXAMPLE = '{"text": "When ..."}'


def _experience_lines(experiences: Sequence[Experience]) -> str:
    if not experiences:
        return "(the library is empty)"
    return "\n".join(f"[{e.id}] {e.text}" for e in experiences)


def summarise_messages(
    question: str,
    completion: str,
    score: float,
    reason: str,
    reference: str | None,
    used: Sequence[Experience],
) -> list[dict[str, str]]:
    ref = f"Reference answer: {reference}\n" if reference is not None else "There is no reference answer.\n"
    user = (
        f"Problem:\n{question}\n\n{ref}"
        f"Experiences offered to the attempt:\n{_experience_lines(used)}\n\n"
        f"Attempt:\n{completion}\n\nGrade: {score:.2f} ({reason})\n\n"
        "Summarise the attempt step by step, and say what made it succeed or fail."
    )
    return [{"role": "system", "content": SUMMARISE_SYSTEM}, {"role": "user", "content": user}]


def compare_messages(
    question: str,
    reference: str | None,
    graded: Sequence[tuple[float, str]],
    experiences: Sequence[Experience],
    max_ops: int,
) -> list[dict[str, str]]:
    attempts = "\n\n".join(
        f"Attempt {i + 1} (grade {score:.2f}):\n{summary}" for i, (score, summary) in enumerate(graded)
    )
    ref = f"Reference answer: {reference}\n" if reference is not None else ""
    user = (
        f"Problem:\n{question}\n{ref}\nCurrent experiences:\n{_experience_lines(experiences)}\n\n"
        f"Graded attempts:\n{attempts}\n\n"
        f"Propose at most {max_ops} operations on the library: add a new lesson, modify an existing one "
        "(give its id and the new text) or delete a misleading one (give its id). Propose none if the "
        f"library needs no change. Reply with only a JSON object like: {OPS_EXAMPLE}"
    )
    return [{"role": "system", "content": COMPARE_SYSTEM}, {"role": "user", "content": user}]


SUMMARY_FLOOR = 160  # characters an attempt's summary keeps however tight the context


def shortened(text: str, chars: int) -> str:
    """`text` in at most about `chars` characters: its start (what the attempt did) and its end (why it
    succeeded or failed), the middle left out and marked."""
    if len(text) <= chars:
        return text
    head = chars * 2 // 3
    return text[:head].rstrip() + " […] " + text[len(text) - (chars - head) :].lstrip()


def fitted_compare_messages(
    llm: LLM,
    question: str,
    reference: str | None,
    graded: Sequence[tuple[float, str]],
    experiences: Sequence[Experience],
    max_ops: int,
    max_tokens: int,
) -> tuple[list[dict[str, str]], list[Experience]]:
    """compare_messages that leave the reply `max_tokens` of the critic's context, and the experiences they
    list. The rule, when everything does not fit, in this order until it does: the library's worked
    examples leave the listing, last first (the critic edits only lessons); every attempt's summary is cut
    to the same length, keeping its start and its end, down to SUMMARY_FLOOR characters; the lessons leave
    the listing, last first (the critic can edit only those it sees). ContextTooSmall if even that fails."""
    lessons = [e for e in experiences if e.kind == "lesson"]
    examples = [e for e in experiences if e.kind != "lesson"]
    listed, cut = list(experiences), list(graded)
    chars = max((len(summary) for _, summary in graded), default=0)
    messages = compare_messages(question, reference, cut, listed, max_ops)
    over = llm.overflow(messages, max_tokens)
    while over > 0 and (examples or chars > SUMMARY_FLOOR or lessons):
        # Characters a token, as this prompt has them: about how much to take away for `over` tokens.
        per_token = sum(len(m["content"]) for m in messages) / (over + llm.context_length - max_tokens)
        excess = int(over * per_token) + 1
        if examples:
            while examples and excess > 0:
                excess -= len(examples.pop().text) + 24
        elif chars > SUMMARY_FLOOR:
            chars = max(SUMMARY_FLOOR, min(chars - 1, chars - excess // max(1, len(graded))))
            cut = [(score, shortened(summary, chars)) for score, summary in graded]
        else:
            while lessons and excess > 0:
                excess -= len(lessons.pop().text) + 24
        kept = {id(e) for e in (*lessons, *examples)}
        listed = [e for e in experiences if id(e) in kept]
        messages = compare_messages(question, reference, cut, listed, max_ops)
        over = llm.overflow(messages, max_tokens)
    if over > 0:
        prompt_tokens = over + llm.context_length - max_tokens
        raise ContextTooSmall("compare", prompt_tokens, max_tokens, llm.context_length)
    return messages, listed


def merge_messages(texts: Sequence[str]) -> list[dict[str, str]]:
    if len(texts) == 1:
        task = f"Rewrite this lesson so it follows the rules:\n- {texts[0]}"
    else:
        listed = "\n".join(f"- {t}" for t in texts)
        task = f"These lessons say nearly the same thing. Merge them into one lesson:\n{listed}"
    user = f"{task}\n\nReply with only a JSON object like: {MERGE_EXAMPLE}"
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": user}]


# -- stages ------------------------------------------------------------------------------------------


async def summarise(llm: LLM, messages: list[dict[str, str]], *, max_tokens: int, seed: int) -> str:
    """The critic's summary of one graded attempt (`messages`: summarise_messages)."""
    reply = await llm.chat(messages, role="summarise", max_tokens=max_tokens, temperature=0.0, seed=seed)
    return reply.text.strip() or "(empty summary)"


async def compare(
    llm: LLM,
    messages: list[dict[str, str]],
    listed: Sequence[Experience],
    *,
    max_ops: int,
    stats: JsonStats,
    max_retries: int,
    max_tokens: int,
    seed: int,
) -> list[OperationModel] | None:
    """The group's proposed operations (at most max_ops, in the model's order); None: no usable reply.
    `messages` and the experiences they list: fitted_compare_messages (the prompt fitted to the critic's
    context); only listed lessons may be modified or deleted."""
    reply = await ask_json(
        llm,
        messages,
        OperationsReply,
        OPS_EXAMPLE,
        role="compare",
        stats=stats,
        max_retries=max_retries,
        max_tokens=max_tokens,
        seed=seed,
        schema=operations_schema([e.id for e in listed if e.kind == "lesson"], max_ops),
    )
    return None if reply is None else reply.operations[:max_ops]


async def merge(
    llm: LLM, texts: Sequence[str], *, stats: JsonStats, max_retries: int, max_tokens: int, seed: int
) -> str | None:
    reply = await ask_json(
        llm,
        merge_messages(texts),
        MergeReply,
        MERGE_EXAMPLE,
        role="consolidate",
        stats=stats,
        max_retries=max_retries,
        max_tokens=max_tokens,
        seed=seed,
        schema=MERGE_SCHEMA,
    )
    return None if reply is None else reply.text


def describe(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:200]
