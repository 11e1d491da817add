"""The CID `ipfs add --cid-version=1` gives a file, computed locally: no daemon needed to check content.

Kubo's and js-ipfs's defaults for CIDv1: 262,144-byte chunks stored as raw blocks, a balanced tree of
dag-pb nodes with at most 174 links each, UnixFS `File` data in every inner node (filesize and each
child's blocksize), sha2-256, base32. A file of one chunk is the raw block itself.

Written by hand because no maintained Python package builds UnixFS DAGs (the PyPI `ipfs-cid` hashes
only a single raw block); the dag-pb and UnixFS messages are three tiny protobufs encoded below.
tests/registry/test_unixfs.py checks every result against a real IPFS daemon's `add --only-hash`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from multiformats import CID, multihash

CHUNK = 262_144
MAX_LINKS = 174
_UNIXFS_FILE = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _uint(number: int, value: int) -> bytes:
    """A varint protobuf field."""
    return _varint(number << 3) + _varint(value)


@dataclass(frozen=True)
class _Node:
    cid: bytes  # binary CID
    file_size: int  # bytes of file data under the node
    tsize: int  # bytes of all blocks under the node (what a link's Tsize records)


def _leaf(chunk: bytes) -> _Node:
    cid = CID("base32", 1, "raw", multihash.wrap(hashlib.sha256(chunk).digest(), "sha2-256"))
    return _Node(bytes(cid), len(chunk), len(chunk))


def _parent(children: list[_Node]) -> _Node:
    size = sum(c.file_size for c in children)
    unixfs = _uint(1, _UNIXFS_FILE) + _uint(3, size) + b"".join(_uint(4, c.file_size) for c in children)
    # dag-pb: Links (field 2) before Data (field 1); each link is Hash, Name (empty) and Tsize.
    links = b"".join(_field(2, _field(1, c.cid) + _field(2, b"") + _uint(3, c.tsize)) for c in children)
    block = links + _field(1, unixfs)
    cid = CID("base32", 1, "dag-pb", multihash.wrap(hashlib.sha256(block).digest(), "sha2-256"))
    return _Node(bytes(cid), size, len(block) + sum(c.tsize for c in children))


def unixfs_cid(data: bytes) -> str:
    """The CIDv1 (base32) of `data` added as a file with the daemons' default layout."""
    level = [_leaf(data[i : i + CHUNK]) for i in range(0, max(len(data), 1), CHUNK)]
    while len(level) > 1:
        level = [_parent(level[i : i + MAX_LINKS]) for i in range(0, len(level), MAX_LINKS)]
    return str(CID.decode(level[0].cid).encode("base32"))
