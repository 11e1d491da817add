"""Contributors' drafts in the web app: the node validates and encodes, the wallet proposes, the node
publishes.

A draft lives in the contributor's browser as a list of canonical experience documents. The node gives
each new or edited experience its document (`experience`: Experience.create's rules and content-derived
id, every problem named by field), builds a draft into its canonical library bytes with their root, size
and CID (`build`), and, once a proposal on chain names that CID (the proposer paid for it with the proposal
threshold's KEEPER in votes, so an open port pins nothing no KEEPER holder proposed) or the admin token is
sent, publishes them to its IPFS, pinned (`publishable`). Nothing here signs anything.
"""

from __future__ import annotations

from typing import Any

import msgspec

from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.ipfs import local_cid
from zoo.registry.library import Library
from zoo.registry.merkle import library_root

MAX_DRAFT_EXPERIENCES = 100_000
MAX_EXPERIENCE_BODY = 256 * 1024  # a new experience's request (one experience is at most 256 KiB encoded)
_EXPERIENCE = msgspec.json.Decoder(Experience)

EXPERIENCE_FIELDS = frozenset(
    {"kind", "text", "domain", "confidence", "answer", "reasoning", "author", "base_model", "examples"}
)
LIBRARY_FIELDS = frozenset(
    {"version", "parent_root", "base_model", "base_model_sha256", "description", "experiences"}
)


def experience(body: Any) -> dict[str, Any]:
    """The canonical document of the experience `body` describes (a new one, or an edit: edits are new
    experiences with new ids); ValidationError naming each problem."""
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - EXPERIENCE_FIELDS)
    if unknown:
        raise ValidationError(
            unknown[0], f"is not a field of an experience (fields: {sorted(EXPERIENCE_FIELDS)})"
        )
    made = Experience.create(
        kind=body.get("kind", "lesson"),
        text=body.get("text"),
        domain=body.get("domain"),
        confidence=body.get("confidence"),
        answer=body.get("answer"),
        reasoning=body.get("reasoning"),
        author=body.get("author"),
        base_model=body.get("base_model"),
        examples=body.get("examples", ()),
    )
    return msgspec.json.decode(msgspec.json.encode(made))


def build(body: Any) -> dict[str, Any]:
    """A draft's library: its canonical bytes (as text), Merkle root, size and CID; ValidationError for a
    draft that is not a valid next version (each experience must be a canonical document)."""
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    unknown = sorted(set(body) - LIBRARY_FIELDS)
    if unknown:
        raise ValidationError(unknown[0], f"is not a field of a library (fields: {sorted(LIBRARY_FIELDS)})")
    raw = body.get("experiences")
    if not isinstance(raw, list) or len(raw) > MAX_DRAFT_EXPERIENCES:
        raise ValidationError("experiences", f"must be a list of at most {MAX_DRAFT_EXPERIENCES} documents")
    experiences = []
    for i, doc in enumerate(raw):
        try:
            e = _EXPERIENCE.decode(msgspec.json.encode(doc))
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as err:
            raise ValidationError(f"experiences[{i}]", f"is not an experience document: {err}") from None
        experiences.append(e)
    library = Library.create(
        version=body.get("version"),
        parent_root=body.get("parent_root", ""),
        base_model=body.get("base_model"),
        base_model_sha256=body.get("base_model_sha256", ""),
        description=body.get("description", ""),
        experiences=experiences,
    )
    data = encode_library(library)
    return {
        "document": data.decode(),
        "root": "0x" + library_root(library).hex(),
        "size": len(library.experiences),
        "cid": local_cid(data),
    }


def publishable(data: bytes) -> Library:
    """The library in `data`: its one canonical encoding, else ValidationError."""
    return decode_library(data, max_size=len(data))
