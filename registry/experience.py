"""Schema of experiences and of library versions, validated strictly.

An experience is of one of two kinds. A `lesson` is a rule, one sentence opening with its trigger ("When
..."): larger models follow rules. An `example` is a worked example: a question (`text`), its short correct
`answer` (one line, or for code a fenced block that keeps its indentation) and optional brief `reasoning`:
small models follow examples (on the bundled 135M model a correct rule in the prompt moves a held-out score
by 0.00, one worked example by 0.50). Both are retrieved, ranked and cited alike; prompt assembly puts
lessons in the system turn (or before the question) and examples as earlier turns.

The classes are msgspec Structs whose fields are the canonical document itself (canonical.py): declared
in sorted key order under their JSON names, so msgspec's encoder writes the canonical bytes and its typed
decoder parses and type-checks them in C, and an instance costs about two bytes of memory per canonical
byte (pydantic models cost twenty; a 100k-experience library is 30 MB canonical). Every instance holds
canonical values only: __post_init__ refuses anything else (non-NFC text, a confidence that is not six
decimals, a timestamp that is not UTC whole seconds, an id that does not match the content, ...), once per
experience, whether it was decoded or built. create() and parse() take looser Python input (any Unicode
normal form, spare whitespace, a float confidence, a datetime in any zone, signs as ±1) and normalise it
first, reporting every problem by field. Structs are frozen and untracked by the garbage collector (they
hold only strings, numbers, bytes, datetimes, tuples and such Structs: never a cycle).

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
import hashlib
import math
import re
import struct
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

from zoo.registry.errors import NotFound, ValidationError, ZooError

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
CONFIDENCE_RE = re.compile(r"0\.[0-9]{6}|1\.000000")
_ID_TAG = b"zoo.experience.id.v1\x00"
_EXAMPLE_ID_TAG = b"zoo.experience.example-id.v1\x00"
LESSON, EXAMPLE = "lesson", "example"
MAX_QUESTION_CHARS = 2000  # an example's question
MAX_ANSWER_CHARS = 300  # an example's answer: short, the way the model should write it
MAX_REASONING_CHARS = 1000
_LESSON_HAS_NO_ANSWER = "only an example has an answer (a lesson's rule is its text)"
SCHEMA_V1 = "zoo.experience-library/1"
SCHEMA_V2 = "zoo.experience-library/2"
SCHEMA_V3 = "zoo.experience-library/3"

# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F (checked in the tests).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Problem(ZooError, ValueError):
    """One invalid field, relative to the object being checked (a ValidationError once located)."""

    def __init__(self, field: str, message: str, value: object = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.value = field, message, value


# -- strings -------------------------------------------------------------------------------------------


def _check_clean(value: str, where: str, *, multiline: bool = False) -> None:
    """Refuse a string that is not canonical: invalid Unicode, not NFC, or holding control characters."""
    if not value.isascii():  # ASCII is valid UTF-8 and already NFC: the common case skips both checks
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Problem(where, "is not valid Unicode (lone surrogate)") from None
        if not unicodedata.is_normalized("NFC", value):
            raise Problem(where, "is not in Unicode normal form NFC")
    bad = (_CONTROL_BUT_TAB_NEWLINE if multiline else _CONTROL).search(value)
    if bad:
        raise Problem(where, f"contains control character U+{ord(bad.group()):04X}")


def clean_string(value: object, *, multiline: bool = False, where: str = "value") -> str:
    """NFC-normalise a string; refuse non-strings, lone surrogates and control characters (tab and
    newline allowed when multiline). Raises Problem."""
    if not isinstance(value, str):
        raise Problem(where, f"must be a string (got {type(value).__name__})", value)
    if not value.isascii():
        value = unicodedata.normalize("NFC", value)  # keeps a lone surrogate, which _check_clean refuses
    _check_clean(value, where, multiline=multiline)
    return value


def normalise_text(text: object, where: str = "text") -> str:
    """The stored form of a lesson: NFC, whitespace runs collapsed to one space, no outer whitespace.

    Collapsing whitespace keeps trivially different spellings of one lesson on one id.
    """
    if not isinstance(text, str):
        raise Problem(where, f"must be a string (got {type(text).__name__})", text)
    return clean_string(" ".join(text.split()), where=where)


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


def schema_for(experiences: Iterable[Experience]) -> str:
    """The oldest library format that holds these experiences: 1 for lessons only, 2 with worked examples,
    3 when an example's answer is a code block (a reader of format 2 would refuse its lines)."""
    answers = [e.answer for e in experiences if e.kind == EXAMPLE]
    if not answers:
        return SCHEMA_V1
    return SCHEMA_V3 if any(a is not None and is_code_answer(a) for a in answers) else SCHEMA_V2


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


def format_confidence(confidence: float) -> str:
    """The canonical spelling of a confidence: six decimals ("0.870000")."""
    millionths = round(confidence * CONFIDENCE_SCALE)
    return f"{millionths // CONFIDENCE_SCALE}.{millionths % CONFIDENCE_SCALE:06d}"


def to_float32(value: float) -> float:
    """The float32 value nearest to `value`, as a Python float; overflow is an error, not infinity."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise Problem("value", f"{value} is outside the float32 range") from None


def pack_signs(signs: Sequence[int]) -> bytes:
    """Pack ±1 values into bits, least significant bit first (numpy's packbits(bitorder="little")); 1 = +1."""
    out = bytearray((len(signs) + 7) // 8)
    for i, s in enumerate(signs):
        if s == 1:
            out[i >> 3] |= 1 << (i & 7)
        elif s != -1:
            raise Problem("signs", f"sign {i} is {s}, not +1 or -1")
    return bytes(out)


# -- collecting problems -----------------------------------------------------------------------------

T = TypeVar("T")


class _Problems:
    """Runs field normalisers and keeps every problem, so one error can report them all."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.found: list[Problem] = []

    def check(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Problem as p:
            self.found.append(Problem(self.prefix + p.field, p.message, p.value))
            return None  # type: ignore[return-value]

    def raise_if_any(self) -> None:
        if self.found:
            raise _as_validation_error(self.found)


def _as_validation_error(problems: Sequence[Problem]) -> ValidationError:
    first = problems[0]
    message = first.message
    if len(problems) > 1:
        rest = "; ".join(f"{p.field}: {p.message}" for p in problems[1:4])
        message += f" (and {len(problems) - 1} more: {rest})"
    errors = [{"loc": p.field, "msg": p.message, "input": p.value} for p in problems]
    return ValidationError(first.field, message, errors=errors)


# -- field normalisers for create() and parse() (raise Problem) ----------------------------------------


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Problem(where, f"must be a number (got {type(value).__name__})", value)
    return float(value)


def _confidence(value: object) -> str:
    c = _number(value, "confidence")
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


def _question(value: object) -> str:
    question = clean_string(value, multiline=True, where="text").strip()
    if not 0 < len(question) <= MAX_QUESTION_CHARS:
        raise Problem("text", f"an example's question must have 1 to {MAX_QUESTION_CHARS} characters")
    return question


def _answer(value: object) -> str:
    if value is None:
        raise Problem("answer", "an example needs its answer")
    answer = normalise_answer(value)
    if not 0 < len(answer) <= MAX_ANSWER_CHARS:
        raise Problem("answer", f"an example's answer must have 1 to {MAX_ANSWER_CHARS} characters")
    return answer


def _reasoning(value: object) -> str | None:
    if value is None:
        return None
    reasoning = clean_string(value, multiline=True, where="reasoning").strip()
    if not 0 < len(reasoning) <= MAX_REASONING_CHARS:
        raise Problem("reasoning", f"reasoning must have 1 to {MAX_REASONING_CHARS} characters")
    return reasoning


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


def _name(value: object, where: str) -> str:
    name = clean_string(value, where=where)
    if not 0 < len(name) <= MAX_NAME_CHARS:
        raise Problem(where, f"must have 1 to {MAX_NAME_CHARS} characters", value)
    return name


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


# -- the structs ---------------------------------------------------------------------------------------

_STRUCT = {"frozen": True, "forbid_unknown_fields": True, "gc": False}


class Provenance(Struct, **_STRUCT):  # type: ignore[call-arg]
    """Who made an experience, when (UTC, whole seconds) and on which base model; not part of its id."""

    author: str  # 0x-address (lower case) or "job:<id>" of a training job
    base_model: str
    created_at: datetime

    def __post_init__(self) -> None:
        if not AUTHOR_RE.fullmatch(self.author):
            raise Problem("author", 'must be a 0x-prefixed 20-byte lower-case hex address or "job:<id>"')
        if not 0 < len(self.base_model) <= MAX_NAME_CHARS:
            raise Problem("base_model", f"must have 1 to {MAX_NAME_CHARS} characters")
        _check_clean(self.base_model, "base_model")
        at = self.created_at
        if at.tzinfo is not UTC or at.microsecond:
            raise Problem("created_at", "must be UTC in whole seconds, like 2025-10-17T12:00:00Z")

    @classmethod
    def create(cls, *, author: object, base_model: object, created_at: object = None) -> Provenance:
        p = _Problems()
        values = (p.check(_author, author), p.check(_name, base_model, "base_model"),
                  p.check(_created_at, created_at))  # fmt: skip
        p.raise_if_any()
        return cls(*values)


class ExpertFactors(Struct, **_STRUCT):  # type: ignore[call-arg]
    """Token-level decode-time factors: token_ids[i] gets sign(i) * scales[i // block_size].

    Signs are packed one bit per token (see pack_signs). Scales are float32 values, one per block of
    `block_size` consecutive token ids, held (and encoded, base64) as their little-endian bytes.
    """

    block_size: int
    scales_bytes: bytes = field(name="scales")
    signs: bytes
    token_ids: tuple[int, ...]
    tokenizer: str

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not 0 < len(self.tokenizer) <= MAX_NAME_CHARS:
            raise Problem("tokenizer", f"must have 1 to {MAX_NAME_CHARS} characters")
        _check_clean(self.tokenizer, "tokenizer")
        if not 1 <= self.block_size <= MAX_FACTOR_TOKENS:
            raise Problem("block_size", f"must be between 1 and {MAX_FACTOR_TOKENS} (got {self.block_size})")
        if not 0 < n <= MAX_FACTOR_TOKENS:
            raise Problem("token_ids", f"must hold 1 to {MAX_FACTOR_TOKENS} token ids (got {n})")
        previous = -1
        for i, t in enumerate(self.token_ids):
            if not 0 <= t <= MAX_TOKEN_ID:
                raise Problem("token_ids", f"token id {t} at index {i} is outside [0, 2**32)")
            if t <= previous:
                raise Problem("token_ids", f"must be strictly increasing (sorted, unique); see index {i}")
            previous = t
        if len(self.signs) != (n + 7) // 8:
            raise Problem("signs", f"{len(self.signs)} bytes for {n} tokens, need {(n + 7) // 8}")
        if n % 8 and self.signs[-1] >> (n % 8):
            raise Problem("signs", "padding bits after the last token must be zero")
        if len(self.scales_bytes) % 4:
            raise Problem("scales", f"{len(self.scales_bytes)} bytes is not a whole number of float32 values")
        blocks = -(-n // self.block_size)
        scales = self.scales
        if len(scales) != blocks:
            raise Problem("scales", f"{len(scales)} values for {n} tokens in blocks of {self.block_size}; "
                                    f"need {blocks}")  # fmt: skip
        for i, s in enumerate(scales):
            _check_scale(i, s)

    @property
    def scales(self) -> tuple[float, ...]:
        return struct.unpack(f"<{len(self.scales_bytes) // 4}f", self.scales_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as Python values, what create() and parse() take back."""
        return {
            "tokenizer": self.tokenizer,
            "token_ids": self.token_ids,
            "signs": self.signs,
            "block_size": self.block_size,
            "scales": self.scales,
        }

    def sign_values(self) -> list[int]:
        """The signs unpacked to +1/-1, one per token id."""
        return [1 if self.signs[i >> 3] >> (i & 7) & 1 else -1 for i in range(len(self.token_ids))]

    @classmethod
    def create(cls, *, tokenizer: object, token_ids: object, signs: object, scales: object,
               block_size: object = 64) -> ExpertFactors:  # fmt: skip
        """Validate factors given as Python values: signs as packed bytes or a list of ±1, scales as
        numbers (rounded to float32)."""
        p = _Problems()
        f = p.check(_factors, {"tokenizer": tokenizer, "token_ids": token_ids, "signs": signs,
                               "scales": scales, "block_size": block_size})  # fmt: skip
        p.raise_if_any()
        return f

    @classmethod
    def parse(cls, data: object) -> ExpertFactors:
        """create() from a mapping (e.g. decoded JSON); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ValidationError("factors", "must be an object")
        p = _Problems()
        f = p.check(_factors, data)
        p.raise_if_any()
        return f


_FACTOR_FIELDS = frozenset({"tokenizer", "token_ids", "signs", "scales", "block_size"})


def _factors(data: Mapping[str, Any]) -> ExpertFactors:
    """Expert factors from a mapping of Python values; raises the first Problem."""
    unknown = sorted(str(k) for k in data if k not in _FACTOR_FIELDS)
    if unknown:
        raise Problem(unknown[0], "is not a field here (unknown fields are refused)")
    name = _name(data.get("tokenizer"), "tokenizer")
    token_ids = data.get("token_ids")
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Iterable):
        raise Problem("token_ids", "must be a list of integers", token_ids)
    ids = tuple(token_ids)
    if not all(type(t) is int for t in ids):
        raise Problem("token_ids", "must hold only integers", token_ids)
    block_size = data.get("block_size", 64)
    if type(block_size) is not int:
        raise Problem("block_size", f"must be an integer (got {type(block_size).__name__})", block_size)
    return ExpertFactors(block_size=block_size, scales_bytes=_scales(data.get("scales")),
                         signs=_signs(data.get("signs")), token_ids=ids, tokenizer=name)  # fmt: skip


def _signs(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, list | tuple):
        if not all(type(s) is int for s in value):
            raise Problem("signs", "a list of signs must hold only the integers +1 and -1")
        return pack_signs(value)
    raise Problem("signs", "must be packed bits (bytes) or a list of +1/-1", value)


def _scales(value: object) -> bytes:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise Problem("scales", "must be a list of numbers", value)
    floats = []
    for i, s in enumerate(value):
        f = _number(s, "scales")
        _check_scale(i, f)  # before packing: a finite float beyond float32's range cannot be packed
        floats.append(f)
    return struct.pack(f"<{len(floats)}f", *floats)


def _check_scale(i: int, s: float) -> None:
    if not math.isfinite(s):
        raise Problem("scales", f"scale {i} is not a finite number")
    # A scale is a mean |log-boost|: negative makes no sense, and beyond MAX_SCALE (e^100) it only serves
    # to overflow the float32 logits bias once weighted.
    if not 0.0 <= s <= MAX_SCALE:
        raise Problem("scales", f"scale {i} must be in [0, {MAX_SCALE:g}] (got {s:g})")


class Experience(Struct, kw_only=True, omit_defaults=True, **_STRUCT):  # type: ignore[call-arg]
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
            _check_clean(text, "text", multiline=True)
            if not 0 < len(text) <= MAX_QUESTION_CHARS or text != text.strip():
                raise Problem("text", f"an example's question must have 1 to {MAX_QUESTION_CHARS} "
                                      "characters and no outer whitespace")  # fmt: skip
            answer = self.answer
            if answer is None:
                raise Problem("answer", "an example needs its answer")
            _check_clean(answer, "answer", multiline=is_code_answer(answer))
            if not 0 < len(answer) <= MAX_ANSWER_CHARS or normalise_answer(answer) != answer:
                raise Problem("answer", f"an example's answer must have 1 to {MAX_ANSWER_CHARS} characters, "
                                        "single-spaced or a fenced code block")  # fmt: skip
            reasoning = self.reasoning
            if reasoning is UNSET:
                raise Problem("reasoning", "an example states its reasoning (null when it has none)")
            if reasoning is not None:
                _check_clean(reasoning, "reasoning", multiline=True)
                if not 0 < len(reasoning) <= MAX_REASONING_CHARS or reasoning != reasoning.strip():
                    raise Problem("reasoning", f"reasoning must have 1 to {MAX_REASONING_CHARS} characters "
                                               "and no outer whitespace")  # fmt: skip
            expected = example_id(domain, text, answer)
        else:
            if self.answer is not None:
                raise Problem("answer", _LESSON_HAS_NO_ANSWER)
            if self.reasoning is not UNSET:
                raise Problem("reasoning", "only an example has reasoning")
            _check_clean(text, "text")
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
                _check_clean(x, "examples", multiline=True)
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
        p = _Problems()
        kind = p.check(_kind, kind)
        text = p.check(_question if kind == EXAMPLE else _lesson_text, text)
        domain = p.check(_domain, domain)
        if kind == EXAMPLE:
            answer, reasoning = p.check(_answer, answer), p.check(_reasoning, reasoning)
        else:
            if answer is not None:
                p.found.append(Problem("answer", _LESSON_HAS_NO_ANSWER))
            if reasoning is not None:
                p.found.append(Problem("reasoning", "only an example has reasoning"))
            answer, reasoning = None, UNSET
        confidence_text = p.check(_confidence, confidence)
        examples = p.check(_examples, examples)
        if isinstance(factors, Mapping):
            sub = _Problems("factors.")
            factors = sub.check(_factors, factors)
            p.found += sub.found
        elif factors is not None and not isinstance(factors, ExpertFactors):
            p.found.append(Problem("factors", "must be expert factors, a mapping of them or None"))
        sub = _Problems("provenance.")
        at = sub.check(_created_at, created_at)
        values = (sub.check(_author, author), sub.check(_name, base_model, "base_model"), at)
        p.found += sub.found
        p.raise_if_any()
        return _build(cls, "", answer=answer, confidence_text=confidence_text, domain=domain,
                      examples=examples, factors=factors, id=content_id(kind, domain, text, answer),
                      kind=kind, provenance=Provenance(*values), reasoning=reasoning, text=text)  # fmt: skip

    @classmethod
    def parse(cls, data: object) -> Experience:
        """create() from a mapping (e.g. decoded JSON, or to_dict()); an `id` it holds must match the
        content; unknown keys are errors."""
        allowed = {"kind", "text", "domain", "answer", "reasoning", "id", "confidence", "examples",
                   "factors", "provenance"}  # fmt: skip
        fields = _mapping(data, allowed, "")
        given_id = fields.pop("id", None)
        provenance = _mapping(fields.pop("provenance", None), {"author", "base_model", "created_at"},
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


class Library(Struct, **_STRUCT):  # type: ignore[call-arg]
    """One version of an experience library: what an on-chain root and an IPFS CID commit to.

    Experiences are sorted by id (the canonical order) and ids are unique. A genesis version (whatever
    its number) has parent_root ""; later versions name the root of the version they were derived from.
    Version 0 can only be a genesis. `schema` is the format tag: "zoo.experience-library/1" for lessons
    only (exactly as before worked examples existed), "/2" once it holds an example.
    """

    base_model: str
    description: str
    experiences: tuple[Experience, ...]
    parent_root: str
    schema: str
    version: int

    def __post_init__(self) -> None:
        if not 0 <= self.version <= MAX_JSON_INT:
            raise Problem("version", f"must be between 0 and 2**53 - 1 (got {self.version})")
        if self.parent_root and not ROOT_RE.fullmatch(self.parent_root):
            raise Problem("parent_root", 'must be "" (genesis) or 0x followed by 64 lower-case hex digits')
        if self.version == 0 and self.parent_root:
            raise Problem("parent_root", "version 0 cannot have a parent root")
        if not 0 < len(self.base_model) <= MAX_NAME_CHARS:
            raise Problem("base_model", f"must have 1 to {MAX_NAME_CHARS} characters")
        _check_clean(self.base_model, "base_model")
        if len(self.description) > MAX_DESCRIPTION_CHARS:
            raise Problem("description", f"has more than {MAX_DESCRIPTION_CHARS} characters")
        _check_clean(self.description, "description", multiline=True)
        experiences = self.experiences
        has_example = False
        previous = ""
        for e in experiences:
            if e.id <= previous:
                if e.id == previous:
                    raise Problem("experiences", f"experience id {e.id} occurs more than once")
                raise Problem("experiences", "must be sorted by id")
            previous = e.id
            has_example = has_example or e.kind == EXAMPLE
        schema = schema_for(experiences) if has_example else SCHEMA_V1
        if self.schema != schema:
            raise Problem("schema", f"must be {schema!r} for these experiences (got {self.schema[:80]!r})")

    @classmethod
    def create(
        cls,
        *,
        version: object,
        base_model: object,
        experiences: Iterable[Experience] = (),
        parent_root: object = "",
        description: object = "",
    ) -> Library:
        """Validate a version; experiences may come in any order (they are sorted by id)."""
        p = _Problems()
        if type(version) is not int:
            p.found.append(Problem("version", f"must be an integer (got {type(version).__name__})", version))
        elif not 0 <= version <= MAX_JSON_INT:
            p.found.append(Problem("version", f"must be between 0 and 2**53 - 1 (got {version})", version))
        root = p.check(_root, parent_root)
        name = p.check(_name, base_model, "base_model")
        text = p.check(_description, description)
        ordered = tuple(sorted(experiences, key=lambda e: e.id))
        for i, e in enumerate(ordered):
            if not isinstance(e, Experience):
                p.found.append(Problem("experiences", f"item {i} is not an Experience"))
                break
            if i and ordered[i - 1].id == e.id:
                p.found.append(Problem("experiences", f"experience id {e.id} occurs more than once"))
                break
        if version == 0 and root:
            p.found.append(Problem("parent_root", "version 0 cannot have a parent root"))
        p.raise_if_any()
        schema = schema_for(ordered)
        return _build(cls, "", base_model=name, description=text, experiences=ordered, parent_root=root,
                      schema=schema, version=version)  # fmt: skip

    @classmethod
    def parse(cls, data: object) -> Library:
        """create() from a mapping whose experiences are mappings (each parsed) or Experience objects."""
        fields = _mapping(data, {"version", "parent_root", "base_model", "description", "experiences"}, "")
        raw = fields.pop("experiences", ())
        if not isinstance(raw, list | tuple):
            raise ValidationError("experiences", "must be a list")
        parsed = []
        for i, x in enumerate(raw):
            if isinstance(x, Experience):
                parsed.append(x)
                continue
            try:
                parsed.append(Experience.parse(x))
            except ValidationError as e:
                raise ValidationError(f"experiences[{i}].{e.field}", e.message.partition(": ")[2],
                                      **e.values) from None  # fmt: skip
        fields.setdefault("version", None)
        fields.setdefault("base_model", None)
        return cls.create(**fields, experiences=parsed)

    def get(self, experience_id: str) -> Experience:
        """The experience with this id; NotFound if the library has none."""
        return self.experiences[self.index_of(experience_id)]

    def index_of(self, experience_id: str) -> int:
        """Position of the experience in canonical order, which is also its Merkle leaf index."""
        i = bisect.bisect_left(self.experiences, experience_id, key=lambda e: e.id)
        if i == len(self.experiences) or self.experiences[i].id != experience_id:
            raise NotFound(f"experience {experience_id} is not in library version {self.version}",
                           experience_id=experience_id, version=self.version)  # fmt: skip
        return i


def _root(value: object) -> str:
    if not isinstance(value, str):
        raise Problem("parent_root", f"must be a string (got {type(value).__name__})", value)
    value = value.lower()
    if value and not ROOT_RE.fullmatch(value):
        raise Problem("parent_root", 'must be "" (genesis) or 0x followed by 64 hex digits', value)
    return value


def _description(value: object) -> str:
    text = clean_string(value, multiline=True, where="description")
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise Problem("description", f"has {len(text)} characters; at most {MAX_DESCRIPTION_CHARS}")
    return text


def _mapping(data: object, allowed: set[str], prefix: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValidationError(prefix.rstrip(".") or "experience", "must be an object")
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ValidationError(prefix + unknown[0], "is not a field here (unknown fields are refused)")
    return dict(data)


def _build(cls: type[T], prefix: str, **values: Any) -> T:
    """Instantiate a Struct from normalised values; its __post_init__ problem becomes a ValidationError."""
    try:
        return cls(**values)
    except Problem as p:
        raise _as_validation_error([Problem(prefix + p.field, p.message)]) from None


def problem_at(err: msgspec.ValidationError) -> ValidationError:
    """A decoder's error as a ValidationError naming the field: "$.experiences[3].provenance" plus a
    Problem about "author" becomes field "experiences[3].provenance.author"."""
    text = str(err)
    message, _, path = text.rpartition(" - at `$")
    if not _:
        message, path = text, ""
    path = path.rstrip("`").lstrip(".")
    # msgspec chains a __post_init__ refusal as the cause: the Problem names the field inside the path.
    cause = err.__cause__
    field, message = (cause.field, cause.message) if isinstance(cause, Problem) else ("", message)
    unknown = re.fullmatch(r"Object contains unknown field `(.*)`", message)
    if unknown:
        field, message = unknown.group(1), "is not a field here (unknown fields are refused)"
    full = ".".join(x for x in (path, field) if x).replace(".[", "[")
    return ValidationError(full or "library", message)
