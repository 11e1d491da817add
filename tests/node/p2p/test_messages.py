"""Gossip messages: what is accepted, what is dropped, and why (the reason is the metrics label)."""

from __future__ import annotations

import json

import pytest

from zoo.node.p2p.messages import MAX_MESSAGE_BYTES, Announcement, Capabilities, MessageError, decode, encode

ROOT = "0x" + "12" * 32
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
GOOD = {"version": 3, "root": ROOT, "cid": CID, "chain_id": 31337, "registry": "0x" + "ab" * 20}


def test_round_trip_and_unknown_fields_ignored() -> None:
    message = Announcement(**GOOD)
    assert decode(Announcement, encode(message)) == message
    newer = json.dumps({**GOOD, "signature": "from a future version"}).encode()
    assert decode(Announcement, newer) == message
    caps = Capabilities(models=["m"], backend="transformers", grpc="127.0.0.1:50051", load=0.5)
    assert decode(Capabilities, encode(caps)) == caps


@pytest.mark.parametrize(
    ("data", "reason", "says"),
    [
        (b"\xff\xfe", "malformed", "not JSON"),
        (b"[1, 2]", "malformed", "not an object"),
        (b"[" * 2000 + b"]" * 2000, "malformed", "nested deeper than"),  # beyond the recursion limit
        (b'{"a":' * 100 + b"1" + b"}" * 100, "malformed", "nested deeper than"),
        (b"{" + b" " * MAX_MESSAGE_BYTES + b"}", "oversized", "more than"),
        (json.dumps({**GOOD, "version": 0}).encode(), "invalid", "version"),
        (json.dumps({**GOOD, "root": "0x12"}).encode(), "invalid", "root"),
        (json.dumps({**GOOD, "root": "0x" + "AB" * 32}).encode(), "invalid", "root"),  # roots are lower-case
        (json.dumps({**GOOD, "cid": "not a cid"}).encode(), "invalid", "cid"),
        (json.dumps({**GOOD, "registry": "0x1234"}).encode(), "invalid", "registry"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "chain_id"}).encode(), "invalid", "chain_id"),
        (json.dumps({**GOOD, "version": "3"}).encode(), None, ""),  # JSON strings of numbers coerce
    ],
)
def test_bad_announcements_are_refused_with_a_reason(data: bytes, reason: str | None, says: str) -> None:
    if reason is None:
        assert decode(Announcement, data).version == 3
        return
    with pytest.raises(MessageError) as e:
        decode(Announcement, data)
    assert e.value.reason == reason and says in str(e.value)


def test_capabilities_limits() -> None:
    with pytest.raises(MessageError, match="models"):
        decode(Capabilities, json.dumps({"backend": "x", "models": ["m"] * 65}).encode())
    with pytest.raises(MessageError, match="models"):
        decode(Capabilities, json.dumps({"backend": "x", "models": ["has space"]}).encode())
    with pytest.raises(MessageError, match="load"):
        decode(Capabilities, json.dumps({"backend": "x", "load": -1}).encode())
    with pytest.raises(MessageError, match="addrs"):
        decode(Capabilities, json.dumps({"backend": "x", "addrs": ["not-a-multiaddr"]}).encode())
    with pytest.raises(MessageError, match="oversized"):
        encode(Capabilities(backend="x", models=["m" * 100] * 50))


def test_message_sizes_stay_small() -> None:
    """What one gossip message costs on the wire (the figure in the closing note)."""
    announcement = len(encode(Announcement(**GOOD)))
    caps = Capabilities(
        models=["HuggingFaceTB/SmolLM2-135M-Instruct"],
        backend="transformers",
        library_version=12,
        library_root=ROOT,
        job_types=["tf-grpo", "gspo"],
        grpc="127.0.0.1:50051",
        http="http://127.0.0.1:8080/v1",
        addrs=["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWS1RpvHzD32dg6E9h53tg6Cg1b2XU2PAFL6PqNT2C5D5U"],
        chain_id=31337,
    )
    assert announcement < 300 and len(encode(caps)) < 600
