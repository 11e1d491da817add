"""Schema of experiences and of library versions, validated strictly.

An experience is of one of two kinds. A `lesson` is a rule, one sentence opening with its trigger ("When
..."): larger models follow rules. An `example` is a worked example: a question (`text`), its short correct
`answer` and optional brief `reasoning`: small models follow examples (on the bundled 135M model a correct
rule in the prompt moves a held-out score by 0.00, one worked example by 0.50). Both are retrieved, ranked
and cited alike; prompt assembly puts lessons in the system turn (or before the question) and examples as
earlier turns.

Every value is normalised while it is validated (strings to Unicode NFC, confidence to millionths,
factor scales to float32, timestamps to whole UTC seconds), so a model instance holds exactly what the
canonical encoding (canonical.py) writes and reads back; an encoding round trip is the identity.

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

import bisect
import contextlib
import hashlib
import itertools
import math
import re
import struct
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Self

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from zoo.registry.errors import NotFound, ValidationError

# The paper (§4.6) asks each lesson to begin with its triggering condition ("When solving...",
# "For problems involving...", "In geometry problems..."); these words open such a condition.
TRIGGER_WORDS: tuple[str, ...] = (
    "When", "Whenever", "If", "For", "In", "Before", "After", "While", "During", "Once", "Unless", "Given",
    "To",
)  # fmt: skip
MIN_WORDS = 3  # a trigger, its condition and an action cannot take fewer words
MAX_WORDS = 32  # paper §4.6: short enough that many fit in a prompt
MAX_TEXT_CHARS = 400
MAX_DOMAIN_CHARS = 64
DOMAIN_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
MAX_EXAMPLES = 8
MAX_EXAMPLE_CHARS = 2000
MAX_NAME_CHARS = 200  # base model and tokenizer names
MAX_DESCRIPTION_CHARS = 4000
CONFIDENCE_SCALE = 1_000_000  # confidence is held and encoded as a whole number of millionths
MAX_FACTOR_TOKENS = 1 << 20
MAX_TOKEN_ID = (1 << 32) - 1
MAX_SCALE = 100.0
MAX_JSON_INT = (1 << 53) - 1  # the largest integer every JSON reader (JavaScript included) reads exactly
ID_RE = re.compile(r"exp-[0-9a-f]{16}")
ROOT_RE = re.compile(r"0x[0-9a-f]{64}")
AUTHOR_RE = re.compile(r"0x[0-9a-f]{40}|job:[A-Za-z0-9._:-]{1,64}")
_ID_TAG = b"zoo.experience.id.v1\x00"
_EXAMPLE_ID_TAG = b"zoo.experience.example-id.v1\x00"
LESSON, EXAMPLE = "lesson", "example"
MAX_QUESTION_CHARS = 2000  # an example's question
MAX_ANSWER_CHARS = 300  # an example's answer: short, the way the model should write it
MAX_REASONING_CHARS = 1000


def _err(kind: str, message: str, field: str | None = None) -> PydanticCustomError:
    # Messages are complete f-strings; `field` names the field a model-level check is about.
    return PydanticCustomError(kind, message, {"field": field} if field else None)


# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F (checked in the tests); one regex
# search runs in C, where a per-character unicodedata.category() loop dominated decoding large libraries.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_string(value: str, *, multiline: bool = False) -> str:
    """NFC-normalise a string; refuse lone surrogates and control characters (tab/newline if multiline)."""
    if not value.isascii():  # ASCII is valid UTF-8 and already NFC: the common case skips both checks
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _err("unicode", "is not valid Unicode (lone surrogate)") from None
        value = unicodedata.normalize("NFC", value)
    bad = (_CONTROL_BUT_TAB_NEWLINE if multiline else _CONTROL).search(value)
    if bad:
        raise _err("control_char", f"contains control character U+{ord(bad.group()):04X}")
    return value


def normalise_text(text: str) -> str:
    """The stored form of a lesson: NFC, whitespace runs collapsed to one space, no outer whitespace.

    Collapsing whitespace keeps trivially different spellings of one lesson on one id.
    """
    return clean_string(" ".join(text.split()))


def content_id(kind: str, domain: str, text: str, answer: str | None) -> str:
    """The id an experience of this kind and content has (see the module docstring)."""
    if kind == EXAMPLE:
        return example_id(domain, text, answer or "")
    return experience_id(domain, text)


def experience_id(domain: str, text: str) -> str:
    """Content-derived id of a lesson (see the module docstring); inputs must already be normalised."""
    digest = hashlib.sha256(_ID_TAG + domain.encode() + b"\x00" + text.encode()).hexdigest()
    return "exp-" + digest[:16]


def example_id(domain: str, question: str, answer: str) -> str:
    """Content-derived id of a worked example; inputs must already be normalised."""
    preimage = b"\x00".join((domain.encode(), question.encode(), answer.encode()))
    return "exp-" + hashlib.sha256(_EXAMPLE_ID_TAG + preimage).hexdigest()[:16]


def quantise_confidence(value: float) -> float:
    return round(value * CONFIDENCE_SCALE) / CONFIDENCE_SCALE


def to_float32(value: float) -> float:
    """The float32 value nearest to `value`, as a Python float; overflow is an error, not infinity."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise _err("float32", f"{value} is outside the float32 range") from None


def pack_signs(signs: Sequence[int]) -> bytes:
    """Pack ±1 values into bits, least significant bit first (numpy's packbits(bitorder="little")); 1 = +1."""
    out = bytearray((len(signs) + 7) // 8)
    for i, s in enumerate(signs):
        if s == 1:
            out[i >> 3] |= 1 << (i & 7)
        elif s != -1:
            raise _err("sign", f"sign {i} is {s}, not +1 or -1")
    return bytes(out)


def _from_pydantic(err: pydantic.ValidationError) -> ValidationError:
    problems = err.errors(include_url=False)

    def where(problem: Any) -> str:
        extra = problem.get("ctx", {}).get("field")
        path = ""
        for part in (*problem["loc"], *([extra] if extra else [])):
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        return path or err.title

    first = problems[0]
    message = first["msg"]
    if len(problems) > 1:
        rest = "; ".join(f"{where(p)}: {p['msg']}" for p in problems[1:4])
        message += f" (and {len(problems) - 1} more: {rest})"
    return ValidationError(where(first), message, errors=problems)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def parse(cls, data: Any) -> Self:
        """Validate a mapping (e.g. decoded JSON); problems raise errors.ValidationError naming the field."""
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as err:
            raise _from_pydantic(err) from None


class Provenance(_Model):
    """Who made an experience, when, and on which base model; not part of the experience's id."""

    created_at: datetime
    author: StrictStr = Field(description='0x-address (lower case) or "job:<id>" of a training job')
    base_model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)

    @field_validator("created_at", mode="before")
    @classmethod
    def _utc_seconds(cls, value: object) -> datetime:
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise _err("datetime", "is not an ISO-8601 timestamp") from None
        if not isinstance(value, datetime):
            raise _err("datetime", "must be an ISO-8601 UTC timestamp or a datetime")
        if value.tzinfo is UTC and not value.microsecond:
            return value  # already what the conversion below gives (every decoded timestamp is)
        if value.tzinfo is None or value.utcoffset() is None:
            raise _err("datetime", "has no time zone; give UTC explicitly (e.g. 2025-10-17T12:00:00Z)")
        return value.astimezone(UTC).replace(microsecond=0)

    @field_validator("author")
    @classmethod
    def _author(cls, value: str) -> str:
        value = value.lower() if value.startswith(("0x", "0X")) else value
        if not AUTHOR_RE.fullmatch(value):
            raise _err("author", 'must be a 0x-prefixed 20-byte hex address or "job:<id>"')
        return value

    @field_validator("base_model")
    @classmethod
    def _name(cls, value: str) -> str:
        return clean_string(value)


class ExpertFactors(_Model):
    """Token-level decode-time factors: token_ids[i] gets sign(i) * scales[i // block_size].

    Signs are packed one bit per token (see pack_signs); a list of ±1 is accepted and packed.
    Scales are float32 values, one per block of `block_size` consecutive entries of token_ids.
    """

    tokenizer: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    token_ids: tuple[StrictInt, ...] = Field(min_length=1, max_length=MAX_FACTOR_TOKENS)
    signs: bytes
    block_size: StrictInt = Field(default=64, ge=1, le=MAX_FACTOR_TOKENS)
    scales: tuple[StrictFloat, ...]

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        return clean_string(value)

    @field_validator("token_ids")
    @classmethod
    def _sorted_unique(cls, ids: tuple[int, ...]) -> tuple[int, ...]:
        for i, t in enumerate(ids):
            if not 0 <= t <= MAX_TOKEN_ID:
                raise _err("token_id", f"token id {t} at index {i} is outside [0, 2**32)")
            if i and t <= ids[i - 1]:
                raise _err("token_order", f"must be strictly increasing (sorted, unique); see index {i}")
        return ids

    @field_validator("signs", mode="before")
    @classmethod
    def _pack(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            if not all(type(s) is int for s in value):
                raise _err("sign", "a list of signs must hold only the integers +1 and -1")
            return pack_signs(value)
        if not isinstance(value, bytes):
            raise _err("bytes_type", "must be packed bits (bytes) or a list of +1/-1")
        return value

    @field_validator("scales")
    @classmethod
    def _float32(cls, scales: tuple[float, ...]) -> tuple[float, ...]:
        for i, s in enumerate(scales):
            if not math.isfinite(s):
                raise _err("finite_number", f"scale {i} is not a finite number")
            # A scale is a mean |log-boost|: negative makes no sense, and beyond MAX_SCALE (e^100) it only
            # serves to overflow the float32 logits bias once weighted.
            if not 0.0 <= s <= MAX_SCALE:
                raise _err("scale_range", f"scale {i} must be in [0, {MAX_SCALE:g}] (got {s:g})")
        return tuple(to_float32(s) for s in scales)

    @model_validator(mode="after")
    def _shapes(self) -> Self:
        n = len(self.token_ids)
        if len(self.signs) != (n + 7) // 8:
            need = (n + 7) // 8
            raise _err("signs_length", f"{len(self.signs)} bytes for {n} tokens, need {need}", "signs")
        if n % 8 and self.signs[-1] >> (n % 8):
            raise _err("signs_padding", "padding bits after the last token must be zero", "signs")
        blocks = -(-n // self.block_size)
        if len(self.scales) != blocks:
            message = (
                f"{len(self.scales)} values for {n} tokens in blocks of {self.block_size}; need {blocks}"
            )
            raise _err("scales_length", message, "scales")
        return self

    def sign_values(self) -> list[int]:
        """The signs unpacked to +1/-1, one per token id."""
        return [1 if self.signs[i >> 3] >> (i & 7) & 1 else -1 for i in range(len(self.token_ids))]


class Experience(_Model):
    """One lesson or worked example. Build new ones with Experience.create(), which derives the id."""

    kind: Literal["lesson", "example"] = LESSON
    text: StrictStr = Field(
        description="a lesson: the rule, opening with its trigger (When/If/For/...); an example: the question"
    )
    domain: StrictStr = Field(description="dotted lower-case identifiers, e.g. math.geometry")
    answer: StrictStr | None = Field(
        default=None, validate_default=True, description="an example's short correct answer"
    )
    reasoning: StrictStr | None = Field(default=None, description="an example's brief reasoning, if any")
    id: StrictStr = Field(description="content-derived id, see experience_id() and example_id()")
    confidence: StrictFloat = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    examples: tuple[StrictStr, ...] = Field(default=(), max_length=MAX_EXAMPLES)
    factors: ExpertFactors | None = None
    provenance: Provenance

    @field_validator("text")
    @classmethod
    def _text(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("kind") == EXAMPLE:
            question = clean_string(value, multiline=True).strip()
            if not 0 < len(question) <= MAX_QUESTION_CHARS:
                message = f"an example's question must have 1 to {MAX_QUESTION_CHARS} characters"
                raise _err("text_length", message)
            return question
        text = normalise_text(value)
        if len(text) > MAX_TEXT_CHARS:
            raise _err("text_length", f"has {len(text)} characters; at most {MAX_TEXT_CHARS} allowed")
        words = text.split(" ") if text else []
        if not MIN_WORDS <= len(words) <= MAX_WORDS:
            raise _err("word_count", f"has {len(words)} words; a lesson needs {MIN_WORDS} to {MAX_WORDS}")
        if words[0].rstrip(",:;") not in TRIGGER_WORDS:
            triggers = ", ".join(TRIGGER_WORDS)
            raise _err("trigger", f"must begin with its trigger, one of {triggers} (got {words[0][:40]!r})")
        return text

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        if len(value) > MAX_DOMAIN_CHARS or not DOMAIN_RE.fullmatch(value):
            message = (
                "must be dotted lower-case identifiers like math.geometry, "
                f"at most {MAX_DOMAIN_CHARS} characters (got {value[:100]!r})"
            )
            raise _err("domain", message)
        return value

    @field_validator("answer")
    @classmethod
    def _answer(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") != EXAMPLE:
            if value is not None:
                raise _err("answer", "only an example has an answer (a lesson's rule is its text)")
            return None
        if value is None:
            raise _err("answer", "an example needs its answer")
        answer = normalise_text(value)
        if not 0 < len(answer) <= MAX_ANSWER_CHARS:
            raise _err("answer_length", f"an example's answer must have 1 to {MAX_ANSWER_CHARS} characters")
        return answer

    @field_validator("reasoning")
    @classmethod
    def _reasoning(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("kind") != EXAMPLE:
            raise _err("reasoning", "only an example has reasoning")
        reasoning = clean_string(value, multiline=True).strip()
        if not 0 < len(reasoning) <= MAX_REASONING_CHARS:
            raise _err("reasoning_length", f"reasoning must have 1 to {MAX_REASONING_CHARS} characters")
        return reasoning

    @field_validator("id")
    @classmethod
    def _id(cls, value: str, info: ValidationInfo) -> str:
        if not ID_RE.fullmatch(value):
            raise _err("id", f"must look like exp-<16 hex digits> (got {value[:100]!r})")
        if "text" in info.data and "domain" in info.data and "answer" in info.data:
            data = info.data
            expected = content_id(data.get("kind", LESSON), data["domain"], data["text"], data["answer"])
            if value != expected:
                message = f"{value} does not match the content; the id of this text and domain is {expected}"
                raise _err("id_mismatch", message)
        return value

    @field_validator("confidence")
    @classmethod
    def _quantise(cls, value: float) -> float:
        return quantise_confidence(value)

    @field_validator("examples")
    @classmethod
    def _examples(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        cleaned = tuple(clean_string(v, multiline=True) for v in values)
        for i, v in enumerate(cleaned):
            if not 0 < len(v) <= MAX_EXAMPLE_CHARS:
                raise _err("example_length", f"example {i} must have 1 to {MAX_EXAMPLE_CHARS} characters")
        return cleaned

    @classmethod
    def create(
        cls,
        *,
        text: str,
        domain: str,
        confidence: float,
        author: str,
        base_model: str,
        created_at: datetime | str | None = None,
        examples: Iterable[str] = (),
        factors: ExpertFactors | dict[str, Any] | None = None,
        kind: str = LESSON,
        answer: str | None = None,
        reasoning: str | None = None,
    ) -> Experience:
        """Validate a new experience and derive its id; created_at defaults to now (UTC, whole seconds).

        A lesson is `text` (its rule); a worked example (kind="example") is `text` (the question), `answer`
        and optionally `reasoning`.
        """
        derived = "exp-" + "0" * 16  # stands in where the id cannot be derived; the field error is reported
        if isinstance(text, str) and isinstance(domain, str):
            with contextlib.suppress(PydanticCustomError, AttributeError, TypeError):
                if kind == EXAMPLE and isinstance(answer, str):
                    question = clean_string(text, multiline=True).strip()
                    derived = example_id(domain, question, normalise_text(answer))
                else:
                    derived = experience_id(domain, normalise_text(text))
        return cls.parse(
            {
                "kind": kind,
                "text": text,
                "domain": domain,
                "answer": answer,
                "reasoning": reasoning,
                "id": derived,
                "confidence": confidence,
                "examples": tuple(examples),
                "factors": factors,
                "provenance": {
                    "created_at": datetime.now(UTC) if created_at is None else created_at,
                    "author": author,
                    "base_model": base_model,
                },
            }
        )

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy.__dict__.pop("_canonical_bytes", None)  # canonical.py's cached bytes of the old content
        return copy

    def replace(self, **changes: Any) -> Experience:
        """A validated copy with some fields changed; the id is re-derived (changing text makes a new id).

        Provenance fields (created_at, author, base_model) may be passed by name too.
        """
        fields = {
            "kind": self.kind,
            "text": self.text,
            "domain": self.domain,
            "answer": self.answer,
            "reasoning": self.reasoning,
            "confidence": self.confidence,
            "examples": self.examples,
            "factors": self.factors,
            **self.provenance.model_dump(),
        }
        unknown = set(changes) - set(fields)
        if unknown:
            raise ValidationError(sorted(unknown)[0], "is not a field of an experience")
        return Experience.create(**{**fields, **changes})


class Library(_Model):
    """One version of an experience library: what an on-chain root and an IPFS CID commit to.

    Experiences are kept sorted by id (the canonical order, whatever order they were given in) and ids
    are unique. A genesis version (whatever its number) has parent_root ""; later versions name the root
    of the version they were derived from. Version 0 can only be a genesis.
    """

    version: StrictInt = Field(ge=0, le=MAX_JSON_INT)
    parent_root: StrictStr = Field(default="", description='"" for genesis, else 0x + 64 hex digits')
    base_model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    description: StrictStr = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    experiences: tuple[Experience, ...] = ()

    @field_validator("parent_root")
    @classmethod
    def _root(cls, value: str) -> str:
        value = value.lower()
        if value and not ROOT_RE.fullmatch(value):
            raise _err("root", 'must be "" (genesis) or 0x followed by 64 hex digits')
        return value

    @field_validator("base_model")
    @classmethod
    def _name(cls, value: str) -> str:
        return clean_string(value)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return clean_string(value, multiline=True)

    @field_validator("experiences")
    @classmethod
    def _canonical_order(cls, experiences: tuple[Experience, ...]) -> tuple[Experience, ...]:
        ordered = tuple(sorted(experiences, key=lambda e: e.id))
        for prev, cur in itertools.pairwise(ordered):
            if prev.id == cur.id:
                raise _err("duplicate_id", f"experience id {cur.id} occurs more than once")
        return ordered

    @model_validator(mode="after")
    def _no_parent_before_zero(self) -> Self:
        if self.version == 0 and self.parent_root:
            raise _err("genesis", "version 0 cannot have a parent root", "parent_root")
        return self

    @classmethod
    def create(
        cls,
        *,
        version: int,
        base_model: str,
        experiences: Iterable[Experience] = (),
        parent_root: str = "",
        description: str = "",
    ) -> Library:
        return cls.parse(
            {
                "version": version,
                "parent_root": parent_root,
                "base_model": base_model,
                "description": description,
                "experiences": tuple(experiences),
            }
        )

    def get(self, experience_id: str) -> Experience:
        """The experience with this id; NotFound if the library has none."""
        i = self.index_of(experience_id)
        return self.experiences[i]

    def index_of(self, experience_id: str) -> int:
        """Position of the experience in canonical order, which is also its Merkle leaf index."""
        i = bisect.bisect_left(self.experiences, experience_id, key=lambda e: e.id)
        if i == len(self.experiences) or self.experiences[i].id != experience_id:
            raise NotFound(f"experience {experience_id} is not in library version {self.version}",
                           experience_id=experience_id, version=self.version)  # fmt: skip
        return i
