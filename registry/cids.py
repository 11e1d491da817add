"""Which CIDs the registry accepts and how a CID is shown: the contract's rule, without importing web3
(the node checks CIDs from peers and from sync before any chain client is loaded)."""

from __future__ import annotations

import re

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
