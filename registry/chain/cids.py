"""Which CIDs the registry accepts, how a CID is shown, and an ABI codec that survives hostile strings."""

from __future__ import annotations

import re

from eth_abi.codec import ABICodec
from eth_abi.decoding import StringDecoder
from eth_abi.encoding import TextStringEncoder
from eth_abi.registry import registry as default_registry

# What the registry accepts as a CID (ExperienceRegistry._checkCID): CIDv0, or a multibase prefix and
# characters of the multibase alphabets IPFS uses.
_CID_V0 = re.compile(r"Qm[1-9A-HJ-NP-Za-km-z]{44}")
_CID_V1 = re.compile(r"[bBzkKfFu][0-9A-Za-z_-]+")


def cid_problem(cid: str) -> str | None:
    """Why `cid` is not a CID the registry would accept, or None when it is one."""
    if not cid:
        return "empty"
    if not cid.isascii() or not cid.isprintable():
        return f"not printable ASCII: {cid[:40]!r}"
    if len(cid) > 256:
        return f"{len(cid)} characters, more than 256"
    if cid.startswith("Q"):
        return None if _CID_V0.fullmatch(cid) else "not a CIDv0 ('Qm' and 44 base58btc characters)"
    return None if _CID_V1.fullmatch(cid) else "not a multibase CIDv1 string"


def shown_cid(cid: str, width: int = 0) -> str:
    """A CID for display: as it is when valid, else marked invalid with its characters escaped."""
    problem = cid_problem(cid)
    text = cid if problem is None else f"<invalid CID {ascii(cid)[1:-1]}>"
    return text[:width] + "…" if width and len(text) > width else text


def _tolerant_codec() -> ABICodec:
    """Web3's ABI codec, except that strings that are not UTF-8 decode (surrogate-escaped) instead of
    raising: one hostile event in a registry's history must not break every listing of it for good."""
    tolerant = default_registry.copy()
    tolerant.unregister("string")
    tolerant.register(
        "string", TextStringEncoder, StringDecoder(handle_string_errors="surrogateescape"), label="string"
    )
    return ABICodec(tolerant)


_TOLERANT_CODEC = _tolerant_codec()
