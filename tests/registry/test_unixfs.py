"""Local UnixFS CIDs against a real IPFS daemon's `add --only-hash` (cid-version 1, its defaults)."""

from __future__ import annotations

import os

import pytest

from zoo.registry.ipfs import IpfsClient
from zoo.registry.unixfs import CHUNK, MAX_LINKS, unixfs_cid


@pytest.mark.parametrize(
    "size",
    [0, 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 4 * 1024 * 1024],
)
def test_matches_the_daemon(ipfs: IpfsClient, size: int) -> None:
    data = os.urandom(size)
    assert unixfs_cid(data) == ipfs.add(data, pin=False, only_hash=True)


@pytest.mark.slow
def test_matches_the_daemon_past_one_level_of_links(ipfs: IpfsClient) -> None:
    data = os.urandom((MAX_LINKS + 2) * CHUNK)  # 46 MB: a root over two inner nodes
    assert unixfs_cid(data) == ipfs.add(data, pin=False, only_hash=True)


def test_one_changed_byte_changes_the_cid() -> None:
    data = bytearray(os.urandom(2 * CHUNK + 5))
    before = unixfs_cid(bytes(data))
    data[CHUNK + 3] ^= 1
    assert unixfs_cid(bytes(data)) != before
