"""The peer book: what survives a restart, what does not, and how scores ban."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from zoo.node.p2p.messages import Capabilities
from zoo.node.p2p.peers import PeerBook, RateLimiter

CAPS = Capabilities(backend="transformers", models=["m"], addrs=["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWPeer"])


def test_flush_keeps_connected_peers_and_scores_not_capabilities(tmp_path: Path) -> None:
    path = tmp_path / "peers.json"
    book = PeerBook(path, ttl_s=60)
    book.set_capabilities("gossiped-only", CAPS)
    book.set_capabilities("connected", CAPS)
    book.mark_connected(["connected"])
    book.penalise("liar", "bad_hint")
    assert not path.exists()  # nothing written until flush (gossip never waits on the disk)
    book.flush()
    assert path.stat().st_mode & 0o777 == 0o600
    again = PeerBook(path, ttl_s=60)
    assert [r.peer_id for r in again.dialable()] == ["connected"]  # only peers it was connected to
    assert again.get("connected").addrs == CAPS.addrs
    assert again.score("liar") == pytest.approx(-10, abs=0.01)
    assert again.get("liar").offences == {"bad_hint": 1}
    assert all(r.capabilities is None for r in again.records())  # never trusted from disk
    assert again.capable() == []


def test_bans_and_expiry(tmp_path: Path) -> None:
    book = PeerBook(tmp_path / "peers.json", ttl_s=0.2, drop_score=-25)
    book.set_capabilities("p", CAPS)
    assert [r.peer_id for r, _ in book.capable()] == ["p"]
    time.sleep(0.3)
    assert book.capable() == []  # stale capabilities expire
    book.set_capabilities("p", CAPS)
    for _ in range(2):
        book.penalise("p", "bad_hint")
    assert not book.banned("p")
    book.penalise("p", "malformed")
    book.penalise("p", "tampered_content")
    assert book.banned("p") and book.capable() == []


def test_negative_scores_recover_with_time(tmp_path: Path) -> None:
    book = PeerBook(tmp_path / "peers.json", drop_score=-25)
    for _ in range(3):
        book.penalise("p", "bad_hint")
    assert book.banned("p")
    with book._lock:  # ten minutes later: a point back, still banned; 50 minutes: unbanned
        book._peers["p"].penalised_at -= 600
    assert book.score("p") == pytest.approx(-29, abs=0.01) and book.banned("p")
    with book._lock:
        book._peers["p"].penalised_at -= 2400
    assert not book.banned("p") and book.score("p") == pytest.approx(-25, abs=0.01)


def test_a_damaged_book_costs_the_peers_not_the_start(tmp_path: Path) -> None:
    path = tmp_path / "peers.json"
    path.write_text("{not json")
    assert PeerBook(path).records() == []
    path.write_text(json.dumps({"peers": [{"peer_id": "x", "unknown_field": 1}]}))
    assert PeerBook(path).records() == []


def test_rate_limiter_bursts_then_refills() -> None:
    limiter = RateLimiter(rate=10, burst=3)
    assert [limiter.allow("p") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("q")  # per key
    time.sleep(0.15)
    assert limiter.allow("p")


def test_capabilities_are_republished_on_change_or_before_peers_expire_them() -> None:
    from zoo.node.p2p.component import advertise_due

    assert advertise_due(CAPS, None, 0.0, 30.0)  # never said
    said = (CAPS.model_dump(exclude={"sent_at"}), 100.0)
    later = CAPS.model_copy(update={"sent_at": CAPS.sent_at + 5})
    assert not advertise_due(later, said, 110.0, 30.0)  # unchanged and fresh: an idle node stays quiet
    assert advertise_due(later, said, 130.0, 30.0)  # a third of the TTL: refreshed before peers expire it
    assert advertise_due(later.model_copy(update={"load": 2.0}), said, 101.0, 30.0)  # load moved
    assert advertise_due(later.model_copy(update={"library_version": 7}), said, 101.0, 30.0)


def test_holders_of_a_cid_are_remembered_latest_first_and_bounded(tmp_path: Path) -> None:
    from zoo.node.p2p.peers import MAX_HOLDER_CIDS, MAX_HOLDERS

    book = PeerBook(tmp_path / "peers.json")
    book.note_holder("a", "cid1")
    book.note_holder("b", "cid1")
    book.note_holder("a", "cid1")
    assert book.holders("cid1") == ["a", "b"] and book.holders("other") == []
    for i in range(MAX_HOLDERS + 5):
        book.note_holder(f"p{i}", "cid2")
    assert len(book.holders("cid2")) == MAX_HOLDERS and book.holders("cid2")[0] == f"p{MAX_HOLDERS + 4}"
    for i in range(MAX_HOLDER_CIDS):
        book.note_holder("a", f"new{i}")
    assert book.holders("cid1") == []  # the oldest CIDs are forgotten first
    book.flush()
    assert PeerBook(tmp_path / "peers.json").holders(f"new{MAX_HOLDER_CIDS - 1}") == []  # memory only


def test_backoff_doubles_to_its_cap_and_a_success_forgets() -> None:
    from zoo.node.p2p.backoff import Backoff

    b = Backoff(first_s=10.0, max_s=30.0)
    assert b.due("x", now=0.0)
    assert [b.failed("x", now=0.0) for _ in range(4)] == [10.0, 20.0, 30.0, 30.0]
    assert not b.due("x", now=29.0) and b.due("x", now=30.0)
    b.succeeded("x")
    assert b.due("x", now=0.0) and b.failed("x", now=0.0) == 10.0
    b.failed("y", now=0.0)
    b.keep_only(["y"])
    assert b.due("x", now=0.0) and not b.due("y", now=0.0)
