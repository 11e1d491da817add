"""The one deterministic byte encoding of experiences and libraries: what Merkle leaves and CIDs hash.

Rules (the encoding is a JSON text):
- Objects have sorted keys, no insignificant whitespace, UTF-8 output with non-ASCII characters written
  as themselves; exactly `"`, `\\` and control characters are escaped (as \\n, \\t, ... or \\u00xx), as
  Python's json module does. With no floats in the document this coincides with RFC 8785 (JCS).
- Every string is NFC and the key set of each object is fixed: optional values are written as null or []
  rather than left out.
- No JSON floats at all, so no reader can round a number differently: confidence is a decimal string with
  exactly six fractional digits ("0.870000"); factor scales are the little-endian float32 bytes in
  base64; packed sign bits are base64 (RFC 4648, with padding); created_at is "YYYY-MM-DDTHH:MM:SSZ".
  Integers (version, token ids, block size) stay below 2**53.
- A library lists its experiences sorted by id and carries a schema tag. A library of lessons only is
  "zoo.experience-library/1", exactly as before worked examples existed; one that holds an example is
  "zoo.experience-library/2" (a reader of format 1 must refuse it: it cannot show examples); one whose
  example answers with a code block that keeps its lines is "zoo.experience-library/3" (a reader of format 2
  must refuse it: it holds answers only single-spaced); one that names its base model's weights by SHA-256
  ("base_model_sha256") is "zoo.experience-library/4" (a reader of format 3 must refuse the field). The
  field is written only in format 4, so older libraries keep their bytes and CIDs. A lesson's
  document is the same in both, so its Merkle leaf, and the root of every format-1 library, never change;
  an example's document adds "kind": "example", "answer" and "reasoning" (null when it has none).

The schema classes (experience.py, expert_factors.py, library.py) are msgspec Structs laid out as these
documents, so msgspec writes the canonical bytes directly and decodes them with its typed decoder, in C, at
about the speed of a plain json.loads (tests hold its output to the json module's, byte for byte, and to
golden files).

decode_library() accepts exactly these bytes: anything that does not re-encode byte for byte (other
key order, whitespace, escapes, non-NFC text, unsorted experiences) is refused, so one library has one
encoding and therefore one CID. A refusal names the field, or the first differing byte; where the fast
decoder fails, a careful parse with the json module finds the precise reason (duplicate keys, a
non-integer number, broken UTF-8, nesting) so the message says it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from zoo.registry.errors import ValidationError
from zoo.registry.experience import CONFIDENCE_SCALE, Experience, format_confidence
from zoo.registry.gc_pause import gc_paused
from zoo.registry.library import SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, Library
from zoo.registry.validation import Problem, problem_at

SCHEMA = SCHEMA_V4  # the newest; a library is written in the oldest format that can hold it
DEFAULT_MAX_LIBRARY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_EXPERIENCE_BYTES = 256 * 1024
_CONFIDENCE_RE = re.compile(r"(0\.[0-9]{6}|1\.000000)")
_ENCODER = msgspec.json.Encoder()
_LIBRARY = msgspec.json.Decoder(Library)
_EXPERIENCE = msgspec.json.Decoder(Experience)


class _LibraryOfRaw(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A library document whose experiences are left as their raw bytes (see decode_library_parts)."""

    base_model: str
    base_model_sha256: str = ""
    description: str
    experiences: tuple[msgspec.Raw, ...]
    parent_root: str
    schema: str
    version: int


_LIBRARY_OF_RAW = msgspec.json.Decoder(_LibraryOfRaw)

__all__ = [
    "DEFAULT_MAX_EXPERIENCE_BYTES",
    "DEFAULT_MAX_LIBRARY_BYTES",
    "SCHEMA",
    "SCHEMA_V1",
    "SCHEMA_V2",
    "SCHEMA_V3",
    "SCHEMA_V4",
    "canonical_json",
    "decode_experience",
    "decode_library",
    "decode_library_parts",
    "encode_experience",
    "encode_library",
    "experience_document",
    "format_confidence",
    "library_document",
    "schema_of",
]


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes of a document holding only dicts, lists, str, int, bool and None."""
    return msgspec.json.encode(obj, order="sorted")


def schema_of(lib: Library) -> str:
    """The schema tag a library is written with: format 2 only when it holds a worked example."""
    return lib.schema


def experience_document(e: Experience) -> dict[str, Any]:
    """The JSON document of one experience (before serialisation)."""
    return msgspec.to_builtins(e)  # type: ignore[no-any-return]


def library_document(lib: Library) -> dict[str, Any]:
    return msgspec.to_builtins(lib)  # type: ignore[no-any-return]


def encode_experience(e: Experience) -> bytes:
    """Canonical bytes of one experience: its Merkle leaf data."""
    return _ENCODER.encode(e)


def encode_library(lib: Library) -> bytes:
    """Canonical bytes of a library version: what is published to IPFS."""
    return _ENCODER.encode(lib)


def decode_library(
    data: bytes,
    *,
    max_size: int = DEFAULT_MAX_LIBRARY_BYTES,
    require_canonical: bool = True,
) -> Library:
    """Parse and validate library bytes; any problem raises ValidationError naming where it is.

    With require_canonical=False, documents that differ from the canonical bytes only in layout (key
    order, whitespace, escapes, experience order, non-NFC strings) are accepted and normalised.

    To take the experiences a caller already holds as they are (a sync reusing the active version's),
    see merkle.decode_library_leaves.
    """
    _check_size(data, max_size, "library")
    if not require_canonical:
        with gc_paused():
            return Library.parse(_library_input(_load(data, "library")))
    try:
        with gc_paused():
            lib = _LIBRARY.decode(data)
    except ValueError as e:  # msgspec's ValidationError and DecodeError, UnicodeDecodeError, a Problem
        # The careful path names what the fast decoder only reports by position: broken UTF-8 or JSON,
        # duplicate keys, non-integer numbers, a wrong top-level shape or schema, a malformed confidence.
        _library_input(_load(data, "library"))
        raise _located(e, "library") from None
    _check_canonical(_ENCODER.encode(lib), data, "library")
    return lib


def decode_library_parts(
    data: bytes,
    lookup: Callable[[Sequence[msgspec.Raw]], list[Experience | None]],
    *,
    max_size: int = DEFAULT_MAX_LIBRARY_BYTES,
) -> tuple[Library, tuple[msgspec.Raw, ...]]:
    """decode_library, experience by experience: also returns each experience's bytes as they stand in
    `data` (zero-copy views: its canonical bytes, its Merkle leaf data, once the library is accepted).

    `lookup(raws)` says, for each experience's bytes, which experience they encode where the caller
    already holds it (by leaf hash, say), else None: a known one is taken as it is, neither decoded nor
    checked again. Every other experience is decoded and must re-encode to its own bytes; the document
    around them is checked against the canonical frame, so no byte of `data` is encoded twice. Refusals
    are decode_library's.
    """
    _check_size(data, max_size, "library")
    data = bytes(data)
    try:
        with gc_paused():
            doc = _LIBRARY_OF_RAW.decode(data)
            raws = doc.experiences
            found = lookup(raws)
            new = [i for i, e in enumerate(found) if e is None]
            if len(new) > len(found) // 2:  # mostly new: one typed decode of the whole is faster
                lib, new = _LIBRARY.decode(data), list(range(len(raws)))
            else:
                for i in new:
                    try:
                        found[i] = _EXPERIENCE.decode(raws[i])
                    except msgspec.ValidationError as err:
                        raise _at_experience(err, i) from err.__cause__
                lib = Library(
                    base_model=doc.base_model,
                    base_model_sha256=doc.base_model_sha256,
                    description=doc.description,
                    experiences=tuple(found),  # type: ignore[arg-type]
                    parent_root=doc.parent_root,
                    schema=doc.schema,
                    version=doc.version,
                )
            # Each decoded experience must re-encode to its own bytes (one at a time: a second copy of the
            # whole library would be the peak of a sync's memory).
            encode, experiences = _ENCODER.encode, lib.experiences
            if any(memoryview(raws[i]) != encode(experiences[i]) for i in new):
                raise _NotCanonical
    except _NotCanonical:
        lib = None
    except ValueError as e:  # as in decode_library
        _library_input(_load(data, "library"))
        raise _located(e, "library") from None
    if lib is None or not _in_canonical_frame(doc, data):
        decode_library(data, max_size=max_size)  # refuses it, naming the first differing byte
        raise ValidationError("library", "is valid but not in canonical form")  # (not reached)
    return lib, doc.experiences


class _NotCanonical(Exception):
    """Not a ZooError: a private signal inside decode_library_parts that leaves its fast path (the slow
    path then decodes again and raises the ValidationError); it never leaves that function."""


def _in_canonical_frame(doc: _LibraryOfRaw, data: bytes) -> bool:
    """Whether `data` is exactly the canonical document around the experiences' bytes (each canonical).

    The frame is the library encoded with no experiences, cut open at its empty list. Prefix and suffix
    match and the lengths add up to len(data) exactly when the experiences sit in the list with single
    commas between them and nothing else: the same test as re-encoding the library, without doing it.
    """
    empty = msgspec.structs.replace(doc, experiences=())
    frame = _ENCODER.encode(empty)
    # A string value cannot hold this needle: its quotes would be escaped.
    cut = frame.index(b'"experiences":[]') + len(b'"experiences":[')
    prefix, suffix = frame[:cut], frame[cut:]
    n = len(doc.experiences)
    middle = sum(len(raw) for raw in doc.experiences) + max(n - 1, 0)
    fits = len(prefix) + middle + len(suffix) == len(data)
    return fits and data.startswith(prefix) and data.endswith(suffix)


def _at_experience(err: msgspec.ValidationError, i: int) -> msgspec.ValidationError:
    """An error of experience i decoded alone, located as if the whole library had been decoded."""
    message, found, path = str(err).rpartition(" - at `$")
    if not found:
        return msgspec.ValidationError(f"{err} - at `$.experiences[{i}]`")
    return msgspec.ValidationError(f"{message} - at `$.experiences[{i}]{path}")


def decode_experience(
    data: bytes, *, max_size: int = DEFAULT_MAX_EXPERIENCE_BYTES, require_canonical: bool = True
) -> Experience:
    """Parse and validate the bytes of one experience (e.g. a Merkle leaf that came with a proof)."""
    _check_size(data, max_size, "experience")
    if not require_canonical:
        return Experience.parse(_experience_input(_load(data, "experience"), ""))
    try:
        e = _EXPERIENCE.decode(data)
    except ValueError as err:
        _experience_input(_load(data, "experience"), "")
        raise _located(err, "experience") from None
    _check_canonical(_ENCODER.encode(e), data, "experience")
    return e


def _located(err: ValueError, what: str) -> ValidationError:
    """A fast-path failure the careful path did not explain, as a ValidationError naming the field."""
    if isinstance(err, msgspec.ValidationError):
        return problem_at(err)
    if isinstance(err, Problem):  # the library's own check, when it was assembled from reused experiences
        return ValidationError(err.field, err.message)
    return ValidationError(what, f"is not valid JSON: {err}")


def _check_size(data: Any, max_size: int, what: str) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValidationError(what, f"must be bytes, not {type(data).__name__}")
    if len(data) > max_size:
        raise ValidationError(what, f"is {len(data)} bytes; the limit is {max_size}", size=len(data))


def _library_input(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValidationError("library", "must be a JSON object")
    if doc.get("schema") not in (SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4):
        known = ", ".join(repr(s) for s in (SCHEMA_V1, SCHEMA_V2, SCHEMA_V3))
        message = f"must be {known} or {SCHEMA_V4!r} (got {str(doc.get('schema'))[:80]!r})"
        raise ValidationError("schema", message)
    experiences = doc.get("experiences")
    if not isinstance(experiences, list):
        raise ValidationError("experiences", "must be a list")
    fields = {k: v for k, v in doc.items() if k != "schema"}
    fields["experiences"] = [_experience_input(x, f"experiences[{i}]") for i, x in enumerate(experiences)]
    return fields


# -- decoding helpers --------------------------------------------------------------------------------


def _load(data: bytes, what: str) -> Any:
    """The careful json-module parse (after `_check_size`): slower, but says what is wrong and where."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValidationError(what, f"is not valid UTF-8 (byte {err.start})") from None
    if _nesting_exceeds(text, MAX_NESTING):
        raise ValidationError(what, f"is nested too deeply (more than {MAX_NESTING} levels)")
    try:
        return json.loads(
            text, object_pairs_hook=_unique_keys, parse_float=_no_float, parse_constant=_no_float
        )
    except json.JSONDecodeError as err:
        message = f"is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        raise ValidationError(what, message) from None
    except _Refused as err:
        raise ValidationError(what, str(err)) from None
    except RecursionError:
        raise ValidationError(what, "is nested too deeply") from None


class _Refused(Exception):
    """Not a ZooError: a private signal of _load's JSON hooks, which _load turns into a ValidationError
    naming the input; it never leaves that function."""


# Canonical documents nest at most 5 levels (library > experiences > experience > factors/provenance).
# json.loads recurses in C once per level and relies on the interpreter's recursion limit to stop; web3
# raises that limit to 100000, so hostile input like "[" * 100000 would overflow the C stack (a
# segfault, not an exception). Depth is therefore checked before parsing.
MAX_NESTING = 32
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting_exceeds(text: str, limit: int) -> bool:
    # Strings (whose brackets do not nest) and everything but brackets are removed by regex, in C; only
    # the brackets left are walked in Python.
    depth = 0
    for c in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python's json keeps the last of duplicate keys silently; other readers may keep the first.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"has duplicate key {key[:80]!r}")
        out[key] = value
    return out


def _no_float(token: str) -> Any:
    raise _Refused(f"contains the JSON number {token[:40]}; the canonical form has no non-integer numbers")


def _experience_input(doc: Any, path: str) -> dict[str, Any]:
    """Turn an experience document into model input: confidence, signs and scales back to values."""

    def where(field: str) -> str:
        return f"{path}.{field}" if path else field

    if not isinstance(doc, dict):
        raise ValidationError(path or "experience", "must be a JSON object")
    out = dict(doc)
    confidence = doc.get("confidence")
    if confidence is not None:
        if not isinstance(confidence, str) or not _CONFIDENCE_RE.fullmatch(confidence):
            message = f'must be a decimal string with six digits like "0.870000" (got {confidence!r:.40})'
            raise ValidationError(where("confidence"), message)
        out["confidence"] = int(confidence.replace(".", "")) / CONFIDENCE_SCALE
    factors = doc.get("factors")
    if isinstance(factors, dict):
        factors = dict(factors)
        if "signs" in factors:
            factors["signs"] = _unb64(factors["signs"], where("factors.signs"))
        if "scales" in factors:
            raw = _unb64(factors["scales"], where("factors.scales"))
            if len(raw) % 4:
                message = f"{len(raw)} bytes is not a whole number of float32 values"
                raise ValidationError(where("factors.scales"), message)
            factors["scales"] = struct.unpack(f"<{len(raw) // 4}f", raw)
        out["factors"] = factors
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: Any, field: str) -> bytes:
    if not isinstance(value, str):
        raise ValidationError(field, "must be a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, "is not valid base64") from None
    if _b64(raw) != value:
        raise ValidationError(field, "is not canonical base64 (padding or unused bits)")
    return raw


def _check_canonical(expected: bytes, data: bytes, what: str) -> None:
    data = bytes(data)
    if expected != data:
        diffs = (i for i, (a, b) in enumerate(zip(expected, data, strict=False)) if a != b)
        at = next(diffs, min(len(expected), len(data)))
        message = f"is valid but not in canonical form (first difference at byte {at}); re-encode it"
        raise ValidationError(what, message, offset=at)
