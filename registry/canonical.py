"""The one deterministic byte encoding of experiences and libraries: what Merkle leaves and CIDs hash.

Rules (the encoding is a JSON text):
- Objects have sorted keys, no insignificant whitespace, UTF-8 output with non-ASCII characters written
  as themselves; Python's json module then escapes exactly `"`, `\\` and control characters (as \\n,
  \\t, ... or \\u00xx). With no floats in the document this coincides with RFC 8785 (JCS).
- Every string is NFC (the models normalise on validation) and the key set of each object is fixed:
  optional values are written as null or [] rather than left out.
- No JSON floats at all, so no reader can round a number differently:
  confidence is a decimal string with exactly six fractional digits ("0.870000"), the model holding
  the same value quantised to millionths; factor scales are the little-endian float32 bytes in base64;
  packed sign bits are base64 (RFC 4648, with padding); created_at is "YYYY-MM-DDTHH:MM:SSZ".
  Integers (version, token ids, block size) stay below 2**53.
- A library lists its experiences sorted by id and carries a schema tag. A library of lessons only is
  "zoo.experience-library/1", exactly as before worked examples existed; one that holds an example is
  "zoo.experience-library/2" (a reader of format 1 must refuse it: it cannot show examples). A lesson's
  document is the same in both, so its Merkle leaf, and the root of every format-1 library, never change;
  an example's document adds "kind": "example", "answer" and "reasoning" (null when it has none).

decode_library() accepts exactly these bytes: anything that does not re-encode byte for byte (other
key order, whitespace, escapes, non-NFC text, unsorted experiences) is refused, so one library has one
encoding and therefore one CID.

Speed: orjson writes the same bytes as the json module with these settings (a property test holds it to
that) at a tenth of the cost, and parses faster. Each experience keeps its canonical bytes once computed
(they are its Merkle leaf), so a decoded library re-encodes, and roots, without encoding anything again.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from typing import Any

import orjson

from zoo.registry.errors import ValidationError
from zoo.registry.experience import CONFIDENCE_SCALE, EXAMPLE, Experience, Library
from zoo.registry.gc_pause import gc_paused

SCHEMA_V1 = "zoo.experience-library/1"
SCHEMA_V2 = "zoo.experience-library/2"
SCHEMA = SCHEMA_V2  # the newest; a library is written in the oldest format that can hold it (schema_of)
DEFAULT_MAX_LIBRARY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_EXPERIENCE_BYTES = 256 * 1024
_CONFIDENCE_RE = re.compile(r"(0\.[0-9]{6}|1\.000000)")


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes of a document holding only dicts, lists, str, int, bool and None.

    The bytes of json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False), written by
    orjson. Documents come from the builders below, which never hold a float (orjson would write NaN as
    null where json refuses it).
    """
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


# An experience's canonical bytes are kept in its instance __dict__ under this key: not a field, so
# pydantic's ==, hash and model_dump ignore it; the model is frozen, so the bytes never go stale.
_CACHED = "_canonical_bytes"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def format_confidence(confidence: float) -> str:
    millionths = round(confidence * CONFIDENCE_SCALE)
    return f"{millionths // CONFIDENCE_SCALE}.{millionths % CONFIDENCE_SCALE:06d}"


def schema_of(lib: Library) -> str:
    """The schema tag a library is written with: format 2 only when it holds a worked example."""
    return SCHEMA_V2 if any(e.kind == EXAMPLE for e in lib.experiences) else SCHEMA_V1


def experience_document(e: Experience) -> dict[str, Any]:
    """The JSON document of one experience (before serialisation)."""
    doc = _lesson_document(e)
    if e.kind == EXAMPLE:
        doc.update(kind=EXAMPLE, answer=e.answer, reasoning=e.reasoning)
    return doc


def _lesson_document(e: Experience) -> dict[str, Any]:
    created = e.provenance.created_at
    factors = e.factors
    return {
        "id": e.id,
        "text": e.text,
        "domain": e.domain,
        "confidence": format_confidence(e.confidence),
        "examples": list(e.examples),
        "factors": None
        if factors is None
        else {
            "tokenizer": factors.tokenizer,
            "token_ids": list(factors.token_ids),
            "signs": _b64(factors.signs),
            "block_size": factors.block_size,
            "scales": _b64(struct.pack(f"<{len(factors.scales)}f", *factors.scales)),
        },
        "provenance": {
            # Spelled out rather than strftime("%Y"), which does not zero-pad years below 1000 everywhere.
            "created_at": f"{created.year:04d}-{created.month:02d}-{created.day:02d}T"
            f"{created.hour:02d}:{created.minute:02d}:{created.second:02d}Z",
            "author": e.provenance.author,
            "base_model": e.provenance.base_model,
        },
    }


def library_document(lib: Library) -> dict[str, Any]:
    return {**_library_header(lib), "experiences": [experience_document(e) for e in lib.experiences]}


def _library_header(lib: Library) -> dict[str, Any]:
    return {
        "schema": schema_of(lib),
        "version": lib.version,
        "parent_root": lib.parent_root,
        "base_model": lib.base_model,
        "description": lib.description,
    }


def encode_experience(e: Experience) -> bytes:
    """Canonical bytes of one experience: its Merkle leaf data (computed once per instance)."""
    cached = e.__dict__.get(_CACHED)
    if cached is None:
        cached = e.__dict__[_CACHED] = canonical_json(experience_document(e))
    return cached


def encode_library(lib: Library) -> bytes:
    """Canonical bytes of a library version: what is published to IPFS."""
    with gc_paused():
        doc = _library_header(lib)
        doc["experiences"] = [orjson.Fragment(encode_experience(e)) for e in lib.experiences]
        return canonical_json(doc)


def decode_library(
    data: bytes,
    *,
    max_size: int = DEFAULT_MAX_LIBRARY_BYTES,
    require_canonical: bool = True,
    reuse: Library | None = None,
) -> Library:
    """Parse and validate library bytes; any problem raises ValidationError naming where it is.

    With require_canonical=False, documents that differ from the canonical bytes only in layout (key
    order, whitespace, escapes, experience order, non-NFC strings) are accepted and normalised.

    `reuse` (e.g. the version being replaced) lends its validated experiences: an experience whose
    canonical bytes it already holds is taken as it is, not validated again. Sound because validation
    is a function of those bytes alone; a new version that changes a few experiences of 100k validates
    only those few.
    """
    with gc_paused():
        if require_canonical:
            lib = _decode_canonical(data, max_size, reuse)
            if lib is not None:
                return lib
        return _decode_library(data, max_size, require_canonical)


def _decode_canonical(data: bytes, max_size: int, reuse: Library | None) -> Library | None:
    """The fast path for canonical bytes, the common case: None whenever anything is wrong.

    orjson parses (it limits nesting itself, so no depth scan is needed); the same validation as the
    careful path builds the library, and re-encoding it must give the input back. Any failure returns
    None and the careful path (_decode_library) decides, naming the problem exactly as it always has
    (duplicate keys, non-integer numbers, the field at fault, the first differing byte).
    """
    if not isinstance(data, bytes) or len(data) > max_size:
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") not in (SCHEMA_V1, SCHEMA_V2):
        return None
    experiences = doc.pop("experiences", None)
    if not isinstance(experiences, list):
        return None
    del doc["schema"]
    known = {encode_experience(e): e for e in reuse.experiences} if reuse is not None else {}
    try:
        if known:
            parse = Experience.parse
            doc["experiences"] = [
                known.get(canonical_json(x)) or parse(_experience_input(x, "")) for x in experiences
            ]
        else:
            doc["experiences"] = [_experience_input(x, "") for x in experiences]
        lib = Library.parse(doc)
    except ValidationError:
        return None
    return lib if encode_library(lib) == data else None


def _decode_library(data: bytes, max_size: int, require_canonical: bool) -> Library:
    doc = _load(data, max_size, "library")
    if not isinstance(doc, dict):
        raise ValidationError("library", "must be a JSON object")
    if doc.get("schema") not in (SCHEMA_V1, SCHEMA_V2):
        message = f"must be {SCHEMA_V1!r} or {SCHEMA_V2!r} (got {str(doc.get('schema'))[:80]!r})"
        raise ValidationError("schema", message)
    experiences = doc.get("experiences")
    if not isinstance(experiences, list):
        raise ValidationError("experiences", "must be a list")
    fields = {k: v for k, v in doc.items() if k != "schema"}
    fields["experiences"] = [_experience_input(x, f"experiences[{i}]") for i, x in enumerate(experiences)]
    lib = Library.parse(fields)
    if require_canonical:
        _check_canonical(encode_library(lib), data, "library")
    return lib


def decode_experience(
    data: bytes, *, max_size: int = DEFAULT_MAX_EXPERIENCE_BYTES, require_canonical: bool = True
) -> Experience:
    """Parse and validate the bytes of one experience (e.g. a Merkle leaf that came with a proof)."""
    e = Experience.parse(_experience_input(_load(data, max_size, "experience"), ""))
    if require_canonical:
        _check_canonical(encode_experience(e), data, "experience")
    return e


# -- decoding helpers --------------------------------------------------------------------------------


def _load(data: bytes, max_size: int, what: str) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValidationError(what, f"must be bytes, not {type(data).__name__}")
    if len(data) > max_size:
        raise ValidationError(what, f"is {len(data)} bytes; the limit is {max_size}", size=len(data))
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
    pass


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
