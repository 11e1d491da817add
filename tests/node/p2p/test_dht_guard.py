"""Bad DHT traffic (real libp2p hosts on 127.0.0.1): garbage costs its sender score, silent streams are
reset after their deadline instead of holding the DHT's handler slots, a peer answering the node's own
queries with garbage neither crashes nor stalls its walk, and the node keeps serving the DHT throughout."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_uvarint

from tests.node.p2p.test_host import make_host, wait_until  # noqa: F401 (a fixture)
from zoo.node.p2p.host import P2PHost

GARBAGE = encode_uvarint(12) + b"\xff" * 12  # a length prefix, then no protobuf at all (wire type 7)
TOO_LARGE = encode_uvarint(5 << 20) + b"\x08\x04"  # announces 5 MiB, over py-libp2p's 4 MiB limit


def open_dht_stream(sender: P2PHost, to: P2PHost, payload: bytes) -> Any:
    """`sender` opens a DHT stream to `to` and writes `payload`; the stream is left open. None when `to`
    reset it before the protocol negotiation ended (a full handler resets a stream at once)."""

    async def go() -> Any:
        try:
            stream = await sender._host.new_stream(ID.from_base58(to.peer_id), [PROTOCOL_ID])
        except Exception:  # py-libp2p's StreamFailure
            return None
        if payload:
            await stream.write(payload)
        return stream

    return sender._call(go)


def answer_of(sender: P2PHost, stream: Any) -> str:
    """What comes back on the stream within 5 s: "bytes", "closed" (reset or EOF), or "nothing"."""

    async def go() -> str:
        if stream is None:
            return "closed"
        with trio.move_on_after(5):
            try:
                data = await stream.read(1024)
            except Exception:  # the other side reset the stream
                return "closed"
            return "closed" if not data else "bytes"
        return "nothing"

    return sender._call(go)


Lab = tuple[P2PHost, P2PHost, P2PHost, P2PHost, list[tuple[str, str]]]


@pytest.fixture
def lab(make_host) -> Lab:  # noqa: F811
    """The node (its offences recorded), a rogue connected to it, an honest host not yet connected, and a
    third host in the node's routing table (its walk put it there): whom the honest one should learn of."""
    offences: list[tuple[str, str]] = []
    node, _ = make_host("node", on_offence=lambda peer, offence: offences.append((peer, offence)))
    rogue, _ = make_host("rogue")
    honest, _ = make_host("honest")
    third, _ = make_host("third")
    rogue.connect(node.addrs[0])
    third.connect(node.addrs[0])
    third.discover(4.0)
    return node, rogue, honest, third, offences


def learns_through(host: P2PHost, other: P2PHost) -> bool:
    host.discover(4.0)
    return other.peer_id in {peer for peer, _ in host.routing_peers()}


@pytest.mark.parametrize("payload", [GARBAGE, TOO_LARGE], ids=["not-protobuf", "over-4-MiB"])
def test_dht_garbage_costs_its_sender_score_and_the_node_serves_on(lab: Lab, payload: bytes) -> None:
    node, rogue, honest, third, offences = lab
    stream = open_dht_stream(rogue, node, payload)
    assert answer_of(rogue, stream) == "closed"
    wait_until(lambda: offences == [(rogue.peer_id, "dht_garbage")])
    assert rogue.peer_id in node.connected()  # one garbage message is a score, not yet a ban
    honest.connect(node.addrs[0])
    assert learns_through(honest, third)  # the node still answers FIND_NODE


def test_silent_dht_streams_are_reset_after_their_deadline_not_scored(lab: Lab, monkeypatch) -> None:
    """py-libp2p serves 12 inbound DHT streams at once and resets the rest. Thirteen streams that say
    nothing used to hold its slots for good: nobody could walk the DHT through the node again."""
    monkeypatch.setattr("zoo.node.p2p.dht_guard.DHT_STREAM_S", 2.0)
    node, rogue, honest, third, offences = lab
    streams = [open_dht_stream(rogue, node, b"") for _ in range(13)]
    assert answer_of(rogue, streams[-1]) == "closed"  # the 13th: the handler is full
    assert [answer_of(rogue, s) for s in streams[:12]] == ["closed"] * 12  # at 2 s, not held for good
    honest.connect(node.addrs[0])
    assert learns_through(honest, third)
    assert offences == []  # silence and a full handler are nobody's offence


def test_garbage_answers_to_the_node_s_own_walk_neither_crash_nor_stall_it(make_host) -> None:  # noqa: F811
    """A peer that answers FIND_NODE with garbage: py-libp2p drops its answer (no peers from it) within
    its 10 s query deadline; the walk ends on its own deadline and still learns the network elsewhere."""
    node, _ = make_host("node")
    liar, _ = make_host("liar")
    honest, _ = make_host("honest")
    third, _ = make_host("third")

    async def answer_garbage(stream: Any) -> None:
        await stream.read(1024)
        await stream.write(GARBAGE)
        await stream.close()

    async def install() -> None:
        liar._host.set_stream_handler(PROTOCOL_ID, answer_garbage)

    liar._call(install)
    third.connect(honest.addrs[0])
    third.discover(4.0)
    node.connect(liar.addrs[0])
    node.connect(honest.addrs[0])
    for _ in range(3):
        assert node.discover(4.0) >= 1  # returns within its own deadline, no exception
    assert third.peer_id in {peer for peer, _ in node.routing_peers()}
    assert node.running and {liar.peer_id, honest.peer_id} <= set(node.connected())
