"""How the schema's classes (experience.py, worked_example.py, expert_factors.py, library.py) check their
fields and report what is wrong.

A check raises Problem, which names the field relative to the object being checked; create() and parse()
run their field normalisers through Problems, which keeps every problem so that one ValidationError reports
them all, each by field. The string rules every text field follows live here: canonical text is valid
Unicode in NFC without control characters (tab and newline allowed where a field spans lines). The schema
classes are msgspec Structs built with STRUCT_OPTIONS; build_struct and problem_at turn the refusal of a
Struct's __post_init__, or of msgspec's typed decoder, into a ValidationError that names the field.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from zoo.registry.errors import ValidationError, ZooError

MAX_NAME_CHARS = 200  # base model and tokenizer names
# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F (checked in the tests).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Problem(ZooError, ValueError):
    """One invalid field, relative to the object being checked (a ValidationError once located)."""

    def __init__(self, field: str, message: str, value: object = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.value = field, message, value


# -- strings -------------------------------------------------------------------------------------------


def check_clean(value: str, where: str, *, multiline: bool = False) -> None:
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
        value = unicodedata.normalize("NFC", value)  # keeps a lone surrogate, which check_clean refuses
    check_clean(value, where, multiline=multiline)
    return value


def normalise_text(text: object, where: str = "text") -> str:
    """The stored form of a lesson: NFC, whitespace runs collapsed to one space, no outer whitespace.

    Collapsing whitespace keeps trivially different spellings of one lesson on one id.
    """
    if not isinstance(text, str):
        raise Problem(where, f"must be a string (got {type(text).__name__})", text)
    return clean_string(" ".join(text.split()), where=where)


def as_name(value: object, where: str) -> str:
    name = clean_string(value, where=where)
    if not 0 < len(name) <= MAX_NAME_CHARS:
        raise Problem(where, f"must have 1 to {MAX_NAME_CHARS} characters", value)
    return name


def as_number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Problem(where, f"must be a number (got {type(value).__name__})", value)
    return float(value)


# -- collecting problems -----------------------------------------------------------------------------

T = TypeVar("T")


class Problems:
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
            raise as_validation_error(self.found)


def as_validation_error(problems: Sequence[Problem]) -> ValidationError:
    first = problems[0]
    message = first.message
    if len(problems) > 1:
        rest = "; ".join(f"{p.field}: {p.message}" for p in problems[1:4])
        message += f" (and {len(problems) - 1} more: {rest})"
    errors = [{"loc": p.field, "msg": p.message, "input": p.value} for p in problems]
    return ValidationError(first.field, message, errors=errors)


# -- building the structs ------------------------------------------------------------------------------

# Every schema Struct: frozen, refusing unknown keys, and untracked by the garbage collector.
STRUCT_OPTIONS = {"frozen": True, "forbid_unknown_fields": True, "gc": False}


def checked_fields(data: object, allowed: set[str], prefix: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValidationError(prefix.rstrip(".") or "experience", "must be an object")
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ValidationError(prefix + unknown[0], "is not a field here (unknown fields are refused)")
    return dict(data)


def build_struct(cls: type[T], prefix: str, **values: Any) -> T:
    """Instantiate a Struct from normalised values; its __post_init__ problem becomes a ValidationError."""
    try:
        return cls(**values)
    except Problem as p:
        raise as_validation_error([Problem(prefix + p.field, p.message)]) from None


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
