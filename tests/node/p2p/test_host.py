"""Two real libp2p hosts on 127.0.0.1: identity, gossip with validation, the content protocol."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zoo.node.p2p.host import ContentRefused, P2PError, P2PHost, load_identity, peer_id_of

TOPIC = "/zoo/test/1"


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, str, bytes]] = []
        self.cond = threading.Condition()

    def __call__(self, topic: str, sender: str, data: bytes) -> None:
        with self.cond:
            self.messages.append((topic, sender, data))
            self.cond.notify_all()

    def wait_for(self, n: int, timeout: float = 10.0) -> list[tuple[str, str, bytes]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, timeout), self.messages
            return list(self.messages)


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def make_host(tmp_path: Path) -> Iterator[Callable[..., tuple[P2PHost, Inbox]]]:
    hosts: list[P2PHost] = []

    def make(
        name: str,
        content: dict[str, bytes] | None = None,
        accept: Callable[[str, str, str, bytes], bool] = lambda *_: True,
        **kwargs: Any,
    ) -> tuple[P2PHost, Inbox]:
        inbox = Inbox()
        store = content or {}
        host = P2PHost(
            load_identity(tmp_path / name / "identity.key"),
            "/ip4/127.0.0.1/tcp/0",
            [TOPIC],
            validator=accept,
            on_message=inbox,
            content=store.get,
            max_content_bytes=1 << 20,
            **kwargs,
        )
        host.start()
        hosts.append(host)
        return host, inbox

    yield make
    for host in hosts:
        host.stop()


def test_identity_is_created_once_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "p2p" / "identity.key"
    seed = load_identity(path)
    assert len(seed) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_identity(path) == seed
    assert peer_id_of(seed) == peer_id_of(load_identity(path))
    assert peer_id_of(os.urandom(32)) != peer_id_of(seed)
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="not a 32-byte identity seed"):
        load_identity(path)


def test_gossip_reaches_the_peer_and_the_validator_drops_what_it_refuses(make_host) -> None:
    a, _ = make_host("a")
    b, inbox = make_host("b", accept=lambda _t, _p, _f, data: not data.startswith(b"bad"))
    assert b.connect(a.addrs[0]) == a.peer_id
    wait_until(lambda: b.peer_id in a.mesh_peers(TOPIC))
    a.publish(TOPIC, b"bad: dropped")
    a.publish(TOPIC, b"good")
    topic, sender, data = inbox.wait_for(1)[0]
    assert (topic, sender, data) == (TOPIC, a.peer_id, b"good")
    time.sleep(0.3)
    assert [m[2] for m in inbox.messages] == [b"good"]  # the refused one never arrived


def test_content_protocol_serves_bytes_refuses_unknown_and_oversized(make_host) -> None:
    blob = os.urandom(300_000)
    a, _ = make_host("a", content={"cid-a": blob, "cid-big": b"x" * 2_000_000})
    b, _ = make_host("b")
    b.connect(a.addrs[0])
    assert b.fetch(a.peer_id, "cid-a", max_bytes=1 << 20, timeout=10) == blob
    with pytest.raises(ContentRefused, match="over the limit"):
        b.fetch(a.peer_id, "cid-a", max_bytes=1000, timeout=10)
    with pytest.raises(ContentRefused, match="no content for cid-missing"):
        b.fetch(a.peer_id, "cid-missing", max_bytes=1 << 20, timeout=10)
    with pytest.raises(ContentRefused, match="no content"):  # over the server's own limit: not served
        b.fetch(a.peer_id, "cid-big", max_bytes=1 << 22, timeout=10)


def test_bad_addresses_and_stopped_hosts_raise_p2p_errors(make_host) -> None:
    a, _ = make_host("a")
    with pytest.raises(P2PError, match="not a dialable"):
        a.connect("/ip4/127.0.0.1/tcp/1")
    with pytest.raises(P2PError):
        a.connect(f"/ip4/127.0.0.1/tcp/1/p2p/{a.peer_id}", timeout=3)
    a.stop()
    with pytest.raises(P2PError, match="not running"):
        a.publish(TOPIC, b"x")


def test_a_dht_walk_meshes_peers_that_only_knew_the_bootstrap_and_survives_its_death(make_host) -> None:
    boot, _ = make_host("boot")
    others = [make_host(f"n{i}")[0] for i in range(4)]
    for host in others:
        host.connect(boot.addrs[0])
    assert all(len(host.connected()) == 1 for host in others)  # a star
    for host in others:
        assert host.discover(10.0) >= 1
    ids = {host.peer_id for host in others}
    for host in others:
        assert ids - {host.peer_id} <= set(host.connected())  # every other node, not only the bootstrap
        found = dict(host.routing_peers())
        assert boot.peer_id in found and all("/p2p/" in a for a in found[boot.peer_id])
    boot.stop()
    time.sleep(1)
    for host in others:  # at least min(4, N - 2) live peers each, with the bootstrap gone (N = 5)
        assert len(set(host.connected()) - {boot.peer_id}) >= 3
