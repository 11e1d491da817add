"""Schema of experiences, validated strictly: the Experience model, its provenance and the lesson's rules.

An experience is of one of two kinds. A `lesson` is a rule, one sentence opening with its trigger ("When
..."): larger models follow rules. An `example` is a worked example: a question (`text`), its short correct
`answer` (one line, or for code a fenced block that keeps its indentation) and optional brief `reasoning`
(worked_example.py): small models follow examples (on the bundled 135M model a correct rule in the prompt
moves a held-out score by 0.00, one worked example by 0.50). Both are retrieved, ranked and cited alike;
prompt assembly puts lessons in the system turn (or before the question) and examples as earlier turns.
Either may carry expert factors (expert_factors.py); a library version holds them (library.py).

The classes are msgspec Structs whose fields are the canonical document itself (canonical.py): declared
in sorted key order under their JSON names, so msgspec's encoder writes the canonical bytes and its typed
decoder parses and type-checks them in C, and an instance costs about two bytes of memory per canonical
byte (pydantic models cost twenty; a 100k-experience library is 30 MB canonical). Every instance holds
canonical values only: __post_init__ refuses anything else (non-NFC text, a confidence that is not six
decimals, a timestamp that is not UTC whole seconds, an id that does not match the content, ...), once per
experience, whether it was decoded or built. create() and parse() take looser Python input (any Unicode
normal form, spare whitespace, a float confidence, a datetime in any zone, signs as ±1) and normalise it
first, reporting every problem by field (validation.py). Structs are frozen and untracked by the garbage
collector (they hold only strings, numbers, bytes, datetimes, tuples and such Structs: never a cycle).

Experience ids are content-derived: "exp-" + the first 16 hex digits of
sha256("zoo.experience.id.v1" NUL domain NUL text) over the normalised UTF-8 strings for a lesson, and of
sha256("zoo.experience.example-id.v1" NUL domain NUL question NUL answer) for an example. The same lesson
in the same domain keeps its id across training steps and library versions, whatever its confidence,
examples, factors or provenance; editing the text or moving it to another domain makes a new
experience. NUL cannot occur in any field, so the preimage is unambiguous, and the two tags keep a lesson
and an example from ever sharing an id. 64 bits of hash keep the chance of any collision in a
100k-experience library near 3e-10.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType, field

from zoo.registry.errors import ValidationError
from zoo.registry.expert_factors import ExpertFactors, factors_from_mapping
from zoo.registry.validation import (
    MAX_NAME_CHARS,
    STRUCT_OPTIONS,
    Problem,
    Problems,
    as_name,
    as_number,
    build_struct,
    check_clean,
    checked_fields,
    clean_string,
    normalise_text,
)
from zoo.registry.worked_example import (
    MAX_ANSWER_CHARS,
    MAX_QUESTION_CHARS,
    MAX_REASONING_CHARS,
    example_answer,
    example_id,
    example_question,
    example_reasoning,
    is_code_answer,
    normalise_answer,
)

# The paper (§4.6) asks each lesson to begin with its triggering condition ("When solving...",
# "For problems involving...", "In geometry problems..."); these words open such a condition.
TRIGGER_WORDS: tuple[str, ...] = (
    "When", "Whenever", "If", "For", "In", "Before", "After", "While", "During", "Once", "Unless", "Given",
    "To",
)  # fmt: skip
_TRIGGERS = frozenset(TRIGGER_WORDS)
MIN_WORDS = 3  # a trigger, its condition and an action cannot take fewer words
MAX_WORDS = 32  # paper §4.6: short enough that many fit in a prompt
MAX_TEXT_CHARS = 400
MAX_DOMAIN_CHARS = 64
DOMAIN_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
MAX_EXAMPLES = 8
MAX_EXAMPLE_CHARS = 2000
CONFIDENCE_SCALE = 1_000_000  # confidence is held and encoded as a whole number of millionths
ID_RE = re.compile(r"exp-[0-9a-f]{16}")
AUTHOR_RE = re.compile(r"0x[0-9a-f]{40}|job:[A-Za-z0-9._:-]{1,64}")
CONFIDENCE_RE = re.compile(r"0\.[0-9]{6}|1\.000000")
_ID_TAG = b"zoo.experience.id.v1\x00"
LESSON, EXAMPLE = "lesson", "example"
_LESSON_HAS_NO_ANSWER = "only an example has an answer (a lesson's rule is its text)"


def content_id(kind: str, domain: str, text: str, answer: str | None) -> str:
    """The id an experience of this kind and content has (see the module docstring)."""
    if kind == EXAMPLE:
        return example_id(domain, text, answer or "")
    return experience_id(domain, text)


def experience_id(domain: str, text: str) -> str:
    """Content-derived id of a lesson (see the module docstring); inputs must already be normalised."""
    digest = hashlib.sha256(_ID_TAG + domain.encode() + b"\x00" + text.encode()).hexdigest()
    return "exp-" + digest[:16]


def quantise_confidence(value: float) -> float:
    return round(value * CONFIDENCE_SCALE) / CONFIDENCE_SCALE


def format_confidence(confidence: float) -> str:
    """The canonical spelling of a confidence: six decimals ("0.870000")."""
    millionths = round(confidence * CONFIDENCE_SCALE)
    return f"{millionths // CONFIDENCE_SCALE}.{millionths % CONFIDENCE_SCALE:06d}"


def _confidence(value: object) -> str:
    c = as_number(value, "confidence")
    if not math.isfinite(c):
        raise Problem("confidence", "must be a finite number", value)
    if not 0.0 <= c <= 1.0:
        raise Problem("confidence", f"must be between 0 and 1 (got {c:g})", value)
    return format_confidence(c)


def _domain(value: object) -> str:
    if not isinstance(value, str):
        raise Problem("domain", f"must be a string (got {type(value).__name__})", value)
    if len(value) > MAX_DOMAIN_CHARS or not DOMAIN_RE.fullmatch(value):
        message = (
            "must be dotted lower-case identifiers like math.geometry, "
            f"at most {MAX_DOMAIN_CHARS} characters (got {value[:100]!r})"
        )
        raise Problem("domain", message, value)
    return value


def _kind(value: object) -> str:
    if value not in (LESSON, EXAMPLE):
        raise Problem("kind", f"must be {LESSON!r} or {EXAMPLE!r} (got {str(value)[:40]!r})", value)
    return str(value)


def _lesson_text(value: object) -> str:
    text = normalise_text(value)
    _check_lesson_text(text)
    return text


def _check_lesson_text(text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise Problem("text", f"has {len(text)} characters; at most {MAX_TEXT_CHARS} allowed")
    words = text.split(" ") if text else []
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        raise Problem("text", f"has {len(words)} words; a lesson needs {MIN_WORDS} to {MAX_WORDS}")
    if words[0].rstrip(",:;") not in _TRIGGERS:
        raise Problem("text", f"must begin with its trigger, one of {', '.join(TRIGGER_WORDS)} "
                              f"(got {words[0][:40]!r})")  # fmt: skip


def _examples(values: object) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise Problem("examples", "must be a list of strings", values)
    values = tuple(values)
    if len(values) > MAX_EXAMPLES:
        raise Problem("examples", f"at most {MAX_EXAMPLES} examples (got {len(values)})")
    cleaned = tuple(clean_string(v, multiline=True, where="examples") for v in values)
    for i, v in enumerate(cleaned):
        if not 0 < len(v) <= MAX_EXAMPLE_CHARS:
            raise Problem("examples", f"example {i} must have 1 to {MAX_EXAMPLE_CHARS} characters")
    return cleaned


def _author(value: object) -> str:
    if not isinstance(value, str):
        raise Problem("author", f"must be a string (got {type(value).__name__})", value)
    value = value.lower() if value.startswith(("0x", "0X")) else value
    if not AUTHOR_RE.fullmatch(value):
        raise Problem("author", 'must be a 0x-prefixed 20-byte hex address or "job:<id>"', value)
    return value


def _created_at(value: object) -> datetime:
    if value is None:
        value = datetime.now(UTC)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise Problem("created_at", "is not an ISO-8601 timestamp", value) from None
    if not isinstance(value, datetime):
        raise Problem("created_at", "must be an ISO-8601 UTC timestamp or a datetime", value)
    if value.tzinfo is None or value.utcoffset() is None:
        message = "has no time zone; give UTC explicitly (e.g. 2025-10-17T12:00:00Z)"
        raise Problem("created_at", message, value)
    return value.astimezone(UTC).replace(microsecond=0)


class Provenance(Struct, **STRUCT_OPTIONS):  # type: ignore[call-arg]
    """Who made an experience, when (UTC, whole seconds) and on which base model; not part of its id."""

    author: str  # 0x-address (lower case) or "job:<id>" of a training job
    base_model: str
    created_at: datetime

    def __post_init__(self) -> None:
        if not AUTHOR_RE.fullmatch(self.author):
            raise Problem("author", 'must be a 0x-prefixed 20-byte lower-case hex address or "job:<id>"')
        if not 0 < len(self.base_model) <= MAX_NAME_CHARS:
            raise Problem("base_model", f"must have 1 to {MAX_NAME_CHARS} characters")
        check_clean(self.base_model, "base_model")
        at = self.created_at
        if at.tzinfo is not UTC or at.microsecond:
            raise Problem("created_at", "must be UTC in whole seconds, like 2025-10-17T12:00:00Z")

    @classmethod
    def create(cls, *, author: object, base_model: object, created_at: object = None) -> Provenance:
        p = Problems()
        values = (p.check(_author, author), p.check(as_name, base_model, "base_model"),
                  p.check(_created_at, created_at))  # fmt: skip
        p.raise_if_any()
        return cls(*values)


class Experience(Struct, kw_only=True, omit_defaults=True, **STRUCT_OPTIONS):  # type: ignore[call-arg]
    """One lesson or worked example. Build new ones with Experience.create(), which derives the id.

    The fields are the canonical document in key order. A lesson writes none of kind, answer and
    reasoning (each keeps its default); an example writes all three, reasoning as null when it has none
    (None is not its default: UNSET is, and it is falsy like None).
    """

    answer: str | None = None  # an example's short correct answer
    confidence_text: str = field(name="confidence")  # six decimals, "0.870000"; see .confidence
    domain: str  # dotted lower-case identifiers, e.g. math.geometry
    examples: tuple[str, ...]
    factors: ExpertFactors | None
    id: str  # content-derived, see experience_id() and example_id()
    kind: Literal["lesson", "example"] = LESSON
    provenance: Provenance
    reasoning: str | UnsetType | None = UNSET  # an example's brief reasoning; None when it has none
    text: str  # a lesson: the rule, opening with its trigger; an example: the question

    def __post_init__(self) -> None:
        if not CONFIDENCE_RE.fullmatch(self.confidence_text):
            raise Problem("confidence",
                          f'must be a decimal string with six digits like "0.870000" '
                          f"(got {self.confidence_text!r:.40})")  # fmt: skip
        domain = self.domain
        if len(domain) > MAX_DOMAIN_CHARS or not DOMAIN_RE.fullmatch(domain):
            _domain(domain)
        text = self.text
        if self.kind == EXAMPLE:
            check_clean(text, "text", multiline=True)
            if not 0 < len(text) <= MAX_QUESTION_CHARS or text != text.strip():
                raise Problem("text", f"an example's question must have 1 to {MAX_QUESTION_CHARS} "
                                      "characters and no outer whitespace")  # fmt: skip
            answer = self.answer
            if answer is None:
                raise Problem("answer", "an example needs its answer")
            check_clean(answer, "answer", multiline=is_code_answer(answer))
            if not 0 < len(answer) <= MAX_ANSWER_CHARS or normalise_answer(answer) != answer:
                raise Problem("answer", f"an example's answer must have 1 to {MAX_ANSWER_CHARS} characters, "
                                        "single-spaced or a fenced code block")  # fmt: skip
            reasoning = self.reasoning
            if reasoning is UNSET:
                raise Problem("reasoning", "an example states its reasoning (null when it has none)")
            if reasoning is not None:
                check_clean(reasoning, "reasoning", multiline=True)
                if not 0 < len(reasoning) <= MAX_REASONING_CHARS or reasoning != reasoning.strip():
                    raise Problem("reasoning", f"reasoning must have 1 to {MAX_REASONING_CHARS} characters "
                                               "and no outer whitespace")  # fmt: skip
            expected = example_id(domain, text, answer)
        else:
            if self.answer is not None:
                raise Problem("answer", _LESSON_HAS_NO_ANSWER)
            if self.reasoning is not UNSET:
                raise Problem("reasoning", "only an example has reasoning")
            check_clean(text, "text")
            if " ".join(text.split()) != text:
                raise Problem("text", "must be single-spaced, with no outer whitespace")
            _check_lesson_text(text)
            expected = experience_id(domain, text)
        if self.id != expected:
            if not ID_RE.fullmatch(self.id):
                raise Problem("id", f"must look like exp-<16 hex digits> (got {self.id[:100]!r})")
            raise Problem("id", f"{self.id} does not match the content; the id of this text and domain "
                                f"is {expected}")  # fmt: skip
        if self.examples:
            if len(self.examples) > MAX_EXAMPLES:
                raise Problem("examples", f"at most {MAX_EXAMPLES} examples (got {len(self.examples)})")
            for i, x in enumerate(self.examples):
                check_clean(x, "examples", multiline=True)
                if not 0 < len(x) <= MAX_EXAMPLE_CHARS:
                    raise Problem("examples", f"example {i} must have 1 to {MAX_EXAMPLE_CHARS} characters")

    @property
    def confidence(self) -> float:
        """The confidence as a number (exactly the millionths the canonical form spells)."""
        return int(self.confidence_text.replace(".", "")) / CONFIDENCE_SCALE

    @classmethod
    def create(
        cls,
        *,
        text: object,
        domain: object,
        confidence: object,
        author: object,
        base_model: object,
        created_at: object = None,
        examples: object = (),
        factors: ExpertFactors | Mapping[str, Any] | None = None,
        kind: object = LESSON,
        answer: object = None,
        reasoning: object = None,
    ) -> Experience:
        """Validate a new experience and derive its id; created_at defaults to now (UTC, whole seconds).

        A lesson is `text` (its rule); a worked example (kind="example") is `text` (the question), `answer`
        and optionally `reasoning`. Every problem is reported, each by field.
        """
        p = Problems()
        kind = p.check(_kind, kind)
        text = p.check(example_question if kind == EXAMPLE else _lesson_text, text)
        domain = p.check(_domain, domain)
        if kind == EXAMPLE:
            answer, reasoning = p.check(example_answer, answer), p.check(example_reasoning, reasoning)
        else:
            if answer is not None:
                p.found.append(Problem("answer", _LESSON_HAS_NO_ANSWER))
            if reasoning is not None:
                p.found.append(Problem("reasoning", "only an example has reasoning"))
            answer, reasoning = None, UNSET
        confidence_text = p.check(_confidence, confidence)
        examples = p.check(_examples, examples)
        if isinstance(factors, Mapping):
            sub = Problems("factors.")
            factors = sub.check(factors_from_mapping, factors)
            p.found += sub.found
        elif factors is not None and not isinstance(factors, ExpertFactors):
            p.found.append(Problem("factors", "must be expert factors, a mapping of them or None"))
        sub = Problems("provenance.")
        at = sub.check(_created_at, created_at)
        values = (sub.check(_author, author), sub.check(as_name, base_model, "base_model"), at)
        p.found += sub.found
        p.raise_if_any()
        return build_struct(cls, "", answer=answer, confidence_text=confidence_text, domain=domain,
                      examples=examples, factors=factors, id=content_id(kind, domain, text, answer),
                      kind=kind, provenance=Provenance(*values), reasoning=reasoning, text=text)  # fmt: skip

    @classmethod
    def parse(cls, data: object) -> Experience:
        """create() from a mapping (e.g. decoded JSON, or to_dict()); an `id` it holds must match the
        content; unknown keys are errors."""
        allowed = {"kind", "text", "domain", "answer", "reasoning", "id", "confidence", "examples",
                   "factors", "provenance"}  # fmt: skip
        fields = checked_fields(data, allowed, "")
        given_id = fields.pop("id", None)
        provenance = checked_fields(fields.pop("provenance", None), {"author", "base_model", "created_at"},
                              "provenance.")  # fmt: skip
        e = cls.create(**fields, **provenance)
        if given_id is not None and given_id != e.id:
            if not isinstance(given_id, str) or not ID_RE.fullmatch(given_id):
                shown = str(given_id)[:100]
                raise ValidationError("id", f"must look like exp-<16 hex digits> (got {shown!r})")
            raise ValidationError("id", f"{given_id} does not match the content; the id of this text and "
                                        f"domain is {e.id}")  # fmt: skip
        return e

    def to_dict(self) -> dict[str, Any]:
        """The fields as Python values, what parse() and replace() take back."""
        return {
            "kind": self.kind,
            "text": self.text,
            "domain": self.domain,
            "answer": self.answer,
            "reasoning": self.reasoning or None,
            "id": self.id,
            "confidence": self.confidence,
            "examples": self.examples,
            "factors": self.factors,
            "provenance": {
                "author": self.provenance.author,
                "base_model": self.provenance.base_model,
                "created_at": self.provenance.created_at,
            },
        }

    def replace(self, **changes: Any) -> Experience:
        """A validated copy with some fields changed; the id is re-derived (changing text makes a new id).

        Provenance fields (created_at, author, base_model) may be passed by name too.
        """
        fields = self.to_dict()
        fields.pop("id")
        fields.update(fields.pop("provenance"))
        unknown = set(changes) - set(fields)
        if unknown:
            raise ValidationError(sorted(unknown)[0], "is not a field of an experience")
        return Experience.create(**{**fields, **changes})
