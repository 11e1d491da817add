"""LibrarySyncer and LibraryFollower against a real devnet: anvil, js-ipfs, deployed registry.

One devnet serves the module. Every test builds on whatever the chain's current version is and leaves
the chain with a valid current version (a test that approves bad content approves a good one after it),
so the tests do not depend on each other's order.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from zoo.devnet.dev_dao import DevDao
from zoo.devnet.genesis import genesis_library
from zoo.devnet.info import DevnetInfo
from zoo.devnet.manager import Devnet
from zoo.node.components.library import ChainEvents
from zoo.registry.canonical import encode_library
from zoo.registry.chain import RegistryClient, TxResult
from zoo.registry.errors import IpfsUnavailable
from zoo.registry.experience import Experience
from zoo.registry.ipfs import IpfsClient
from zoo.registry.library import Library
from zoo.registry.library_store import LibraryStore, root_hex
from zoo.registry.merkle import library_root
from zoo.registry.sync import LibraryFollower, LibrarySyncer, Refused

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_unique = itertools.count()


def experience(tag: str) -> Experience:
    return Experience.create(
        text=f"When handling case {tag}, check the boundary values first.",
        domain="sync.case",
        confidence=0.6,
        author="job:sync-test",
        base_model=BASE_MODEL,
        created_at="2026-01-02T00:00:00Z",
    )


@dataclass
class Chain:
    """The devnet seen from a test: approve versions the way the DAO does."""

    info: DevnetInfo
    w3: Web3
    ipfs: IpfsClient
    dao: DevDao = field(init=False)

    def __post_init__(self) -> None:
        self.dao = DevDao(self.w3, self.info.registry_address, self.info.settings)

    @property
    def registry(self) -> RegistryClient:
        return self.dao.proposer

    def reader(self) -> RegistryClient:
        """A read-only client, as the node has."""
        return RegistryClient(self.w3, self.info.registry_address)

    def next_library(self, n: int = 2, **changes: Any) -> Library:
        """A valid library for the chain's next version, with `n` experiences no other library has."""
        cur = self.registry.current()
        fields: dict[str, Any] = {
            "version": cur.version + 1,
            "parent_root": "0x" + cur.root.hex(),
            "base_model": BASE_MODEL,
            "experiences": [experience(f"sync-{next(_unique)}") for _ in range(n)],
        }
        fields.update(changes)
        return Library.create(**fields)

    def approve(self, root: bytes, cid: str, tree_size: int = 1) -> TxResult:
        """propose -> warp into voting -> three votes for -> warp past voting and delay -> execute."""
        return self.dao.approve(root, cid, tree_size=tree_size)

    def approve_library(self, lib: Library, tree_size: int | None = None) -> str:
        cid = self.ipfs.add(encode_library(lib))
        self.approve(library_root(lib), cid, len(lib.experiences) if tree_size is None else tree_size)
        return cid


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    devnet = Devnet(tmp_path_factory.mktemp("sync-devnet"))
    info, reused = devnet.up(die_with_parent=True)
    assert not reused
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
    ipfs = IpfsClient(info.ipfs_api, timeout=10)
    try:
        yield Chain(info, w3, ipfs)
    finally:
        ipfs.close()
        assert sorted(devnet.down()) == ["anvil", "chain-state", "ipfs"]


class CountingIpfs:
    """The real IPFS client, recording which CIDs the syncer fetched."""

    def __init__(self, client: IpfsClient) -> None:
        self.client = client
        self.fetched: list[str] = []

    def fetch_verified(self, cid: str, **kwargs: Any) -> bytes:
        self.fetched.append(cid)
        return self.client.fetch_verified(cid, **kwargs)


@dataclass
class Harness:
    syncer: LibrarySyncer
    store: LibraryStore
    ipfs: CountingIpfs
    refusals: list[tuple[int, str, str]]


def make_syncer(chain: Chain, data_dir: Path, **kwargs: Any) -> Harness:
    refusals: list[tuple[int, str, str]] = []
    ipfs = CountingIpfs(chain.ipfs)
    store = LibraryStore(data_dir)
    syncer = LibrarySyncer(
        chain.reader(),
        ipfs,
        store,
        fetch_timeout_s=10,
        on_refused=lambda *args: refusals.append(args),
        **kwargs,
    )
    return Harness(syncer, store, ipfs, refusals)


def synced(chain: Chain, data_dir: Path, **kwargs: Any) -> Harness:
    """A syncer already holding the chain's current (valid) version."""
    h = make_syncer(chain, data_dir, **kwargs)
    h.syncer.sync_once()
    cur = h.store.current()
    assert cur is not None and cur.root == "0x" + chain.registry.current_root().hex()
    return h


def assert_recovers(chain: Chain, h: Harness) -> None:
    """A refused version does not block the next valid one, which names the refused root as its parent."""
    good = chain.next_library()
    chain.approve_library(good)
    result = h.syncer.sync_once()
    assert result.activated is not None and result.activated.library == good
    cur = h.store.current()
    assert cur is not None and cur.library == good


# -- the syncer ---------------------------------------------------------------------------------------


def test_genesis_syncs(chain: Chain, tmp_path: Path) -> None:
    h = make_syncer(chain, tmp_path)
    assert h.store.current() is None
    result = h.syncer.apply(chain.reader().version_at(1))
    genesis = chain.info.genesis
    assert result.activated is not None and result.onchain_version == 1
    assert (result.activated.version, result.activated.root, result.activated.cid) == (
        1,
        genesis["root"],
        genesis["cid"],
    )
    assert result.activated.library == genesis_library()
    assert h.ipfs.fetched == [genesis["cid"]]
    cur = LibraryStore(tmp_path).current()
    assert cur is not None and cur.library == genesis_library() and cur.cid == genesis["cid"]
    # Already current: nothing is fetched again.
    again = h.syncer.apply(chain.reader().version_at(1))
    assert again.activated is None and again.current is not None and again.current.version == 1
    assert h.ipfs.fetched == [genesis["cid"]]


def test_new_approved_version_syncs_and_is_activated(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    assert before is not None
    lib = chain.next_library(3)
    cid = chain.approve_library(lib)
    assert chain.registry.current().version == lib.version

    result = h.syncer.sync_once()
    assert result.onchain_version == lib.version
    assert result.activated is not None
    assert (result.activated.version, result.activated.root, result.activated.cid) == (
        lib.version,
        root_hex(library_root(lib)),
        cid,
    )
    assert h.ipfs.fetched[-1] == cid
    fresh = LibraryStore(tmp_path)
    cur = fresh.current()
    assert cur is not None and cur.library == lib and cur.library.parent_root == before.root
    assert (before.version, before.root) in fresh.list()  # the previous version stays stored
    assert h.syncer.sync_once().activated is None


def test_cid_of_other_content_is_refused_and_not_refetched(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    assert before is not None
    approved = chain.next_library(2)
    # A valid library of the same version and parent but other experiences: its CID is honest about
    # its own bytes, but its Merkle root is not the one the DAO approved.
    other = chain.next_library(2)
    other_cid = chain.ipfs.add(encode_library(other))
    chain.approve(library_root(approved), other_cid, len(approved.experiences))

    with pytest.raises(Refused) as err:
        h.syncer.sync_once()
    assert err.value.values["version"] == approved.version
    assert err.value.values["root"] == root_hex(library_root(approved))
    assert "Merkle root" in str(err.value)
    assert h.store.current() == before
    assert LibraryStore(tmp_path).current() == before
    assert all(v != approved.version for v, _ in h.store.list()), "refused content was stored"
    assert [(v, r) for v, r, _ in h.refusals] == [(approved.version, root_hex(library_root(approved)))]
    assert h.ipfs.fetched.count(other_cid) == 1

    # The next pass does not fetch the refused version again, and does not raise again.
    result = h.syncer.sync_once()
    assert result.activated is None and result.current == before
    assert result.onchain_version == approved.version
    assert h.ipfs.fetched.count(other_cid) == 1 and len(h.refusals) == 1

    assert_recovers(chain, h)


def test_malformed_content_is_refused(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    cid = chain.ipfs.add(b"<html><body>this is not a library</body></html>\n" + os.urandom(8).hex().encode())
    root = os.urandom(32)
    chain.approve(root, cid)

    with pytest.raises(Refused):
        h.syncer.sync_once()
    assert h.store.current() == before
    assert LibraryStore(tmp_path).current() == before
    ((version, refused_root, reason),) = h.refusals
    assert (version, refused_root) == (chain.registry.current().version, "0x" + root.hex())
    assert "not valid JSON" in reason
    assert h.syncer.sync_once().activated is None and h.ipfs.fetched.count(cid) == 1

    assert_recovers(chain, h)


def test_binary_content_is_refused(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    root = os.urandom(32)
    chain.approve(root, chain.ipfs.add(b"\xff\xfe\x00\x01" + os.urandom(64)))
    with pytest.raises(Refused):
        h.syncer.sync_once()
    assert h.store.current() == before
    assert "UTF-8" in h.refusals[0][2]
    assert_recovers(chain, h)


def test_oversized_content_is_refused(chain: Chain, tmp_path: Path) -> None:
    """Content over max_bytes can never become acceptable (a CID is immutable): it is a refusal."""
    h = synced(chain, tmp_path)  # whatever the chain's current version is, with the default limit
    h.syncer.max_bytes = 1024
    before = h.store.current()
    lib = chain.next_library(8)
    assert len(encode_library(lib)) > 1024
    chain.approve_library(lib)  # honest content: right root, right CID, only too big for this node

    with pytest.raises(Refused):
        h.syncer.sync_once()
    assert h.store.current() == before
    assert len(h.refusals) == 1
    assert "over the limit of 1024; refused before download" in h.refusals[0][2]
    fetched = len(h.ipfs.fetched)
    assert h.syncer.sync_once().activated is None
    assert len(h.ipfs.fetched) == fetched, "an oversized version was downloaded again"

    # The same content passes on a node with the default limit.
    other = make_syncer(chain, tmp_path / "roomy")
    result = other.syncer.sync_once()
    assert result.activated is not None and result.activated.library == lib


def test_content_version_disagreeing_with_chain_is_refused(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    onchain_next = chain.registry.current().version + 1
    lib = chain.next_library(2, version=onchain_next + 4)  # the Merkle root covers experiences only
    chain.approve_library(lib)
    assert chain.registry.current().version == onchain_next

    with pytest.raises(Refused) as err:
        h.syncer.sync_once()
    assert f"content says version {onchain_next + 4}" in str(err.value)
    assert before is not None and h.store.current() == before
    assert [v for v, _ in h.store.list()] == [before.version]
    assert_recovers(chain, h)


def test_content_whose_size_disagrees_with_the_chain_is_refused(chain: Chain, tmp_path: Path) -> None:
    """The tree size stored on chain is part of what was approved: content of another size is refused."""
    h = synced(chain, tmp_path)
    before = h.store.current()
    lib = chain.next_library(3)
    chain.approve_library(lib, tree_size=4)
    with pytest.raises(Refused) as err:
        h.syncer.sync_once()
    assert "content holds 3 experiences, the chain's tree size is 4" in str(err.value)
    assert h.store.current() == before
    assert_recovers(chain, h)


def test_content_naming_another_parent_is_refused(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    lib = chain.next_library(2, parent_root="0x" + os.urandom(32).hex())
    chain.approve_library(lib)
    with pytest.raises(Refused) as err:
        h.syncer.sync_once()
    assert "parent" in str(err.value)
    assert h.store.current() == before
    assert_recovers(chain, h)


def test_unreachable_ipfs_is_not_a_refusal(chain: Chain, tmp_path: Path) -> None:
    """An IPFS outage says nothing about the content: the version is retried, not refused."""
    h = synced(chain, tmp_path)
    before = h.store.current()
    lib = chain.next_library()
    chain.approve_library(lib)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once the socket closes
    with IpfsClient(dead, timeout=2) as down:
        h.syncer.ipfs = CountingIpfs(down)
        with pytest.raises(IpfsUnavailable):
            h.syncer.sync_once()
    assert h.refusals == [] and h.syncer.refused == {}
    assert h.store.current() == before
    h.syncer.ipfs = CountingIpfs(chain.ipfs)
    result = h.syncer.sync_once()
    assert result.activated is not None and result.activated.library == lib


# -- the follower -------------------------------------------------------------------------------------


class RecordingEvents:
    """ChainEvents (as the node wires it), recording the block ranges it is asked for."""

    def __init__(self, chain: Chain) -> None:
        self.inner = ChainEvents(chain.reader(), chain.info.deploy_block)
        self.ranges: list[tuple[int, int]] = []

    def block_number(self) -> int:
        return self.inner.block_number()

    def library_updated_events(self, from_block: int, to_block: int) -> list[Any]:
        self.ranges.append((from_block, to_block))
        return self.inner.library_updated_events(from_block, to_block)


def test_follower_cursor_persists_across_restart_and_reconciles(chain: Chain, tmp_path: Path) -> None:
    cursor_file = tmp_path / "library" / "sync-cursor.json"
    h1, events1 = make_syncer(chain, tmp_path), RecordingEvents(chain)
    f1 = LibraryFollower(h1.syncer, events1, cursor_file)
    assert f1.cursor is None

    first = f1.poll()  # reconciles with the chain's current version
    assert first is not None and first.activated is not None
    assert first.activated.root == "0x" + chain.registry.current_root().hex()
    assert events1.ranges == []
    head = chain.w3.eth.block_number
    assert f1.cursor == head and json.loads(cursor_file.read_text()) == {"block": head}

    a = chain.next_library()
    chain.approve_library(a)
    result = f1.poll()
    assert result is not None and result.activated is not None and result.activated.library == a
    assert events1.ranges == [(head + 1, chain.w3.eth.block_number)]
    head = chain.w3.eth.block_number
    assert f1.cursor == head
    assert f1.poll() is None and len(events1.ranges) == 1  # nothing new: no event query

    # The node stops; two versions are approved meanwhile; a new process starts on the same files.
    b = chain.next_library()
    chain.approve_library(b)
    c = chain.next_library()
    chain.approve_library(c)
    h2, events2 = make_syncer(chain, tmp_path), RecordingEvents(chain)
    f2 = LibraryFollower(h2.syncer, events2, cursor_file)
    assert f2.cursor == head  # persisted

    result = f2.poll()  # first pass reconciles: straight to the chain's current version
    assert result is not None and result.activated is not None and result.activated.library == c
    assert h2.ipfs.fetched == [chain.registry.current().cid]  # b is skipped, not fetched
    head = chain.w3.eth.block_number
    assert f2.cursor == head
    cur = LibraryStore(tmp_path).current()
    assert cur is not None and cur.library == c

    d = chain.next_library()
    chain.approve_library(d)
    result = f2.poll()
    assert result is not None and result.activated is not None and result.activated.library == d
    assert events2.ranges == [(head + 1, chain.w3.eth.block_number)]  # resumes after the cursor


def test_follower_waits_for_confirmations(chain: Chain, tmp_path: Path) -> None:
    h = make_syncer(chain, tmp_path)
    follower = LibraryFollower(h.syncer, RecordingEvents(chain), tmp_path / "cursor.json", confirmations=2)
    follower.poll()
    lib = chain.next_library()
    chain.approve_library(lib)
    result = follower.poll()
    assert result is None or result.activated is None  # the execute block has 0 confirmations
    cur = h.store.current()
    assert cur is not None and cur.library != lib
    for _ in range(2):
        chain.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    result = follower.poll()
    assert result is not None and result.activated is not None and result.activated.library == lib


def test_follower_moves_past_a_refused_version(chain: Chain, tmp_path: Path) -> None:
    h = synced(chain, tmp_path)
    before = h.store.current()
    follower = LibraryFollower(h.syncer, RecordingEvents(chain), tmp_path / "cursor.json")
    follower.poll()
    approved, other = chain.next_library(), chain.next_library()
    other_cid = chain.ipfs.add(encode_library(other))
    chain.approve(library_root(approved), other_cid, len(approved.experiences))

    with pytest.raises(Refused):
        follower.poll()
    assert follower.cursor == chain.w3.eth.block_number  # the refusal is final: the cursor moves on
    assert follower.poll() is None
    assert h.store.current() == before and h.ipfs.fetched.count(other_cid) == 1

    good = chain.next_library()
    chain.approve_library(good)
    result = follower.poll()
    assert result is not None and result.activated is not None and result.activated.library == good
