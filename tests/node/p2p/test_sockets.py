"""A peer whose packets stop arriving (no FIN, no RST) is dropped by the kernel: keepalive probes an idle
connection, and the host's TCP user timeout aborts it once they go unacknowledged (node/p2p/sockets.py);
a peer whose process is stalled is acknowledged by its kernel, and kept."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.node.p2p.netlab import nat_unavailable
from zoo.node.p2p.host import P2PHost, load_identity
from zoo.node.p2p.sockets import UnacknowledgedGiveUp


def test_the_factory_sets_keepalive_and_the_user_timeout_on_dialled_and_accepted_sockets() -> None:
    async def main() -> list[tuple[int, int, int, int]]:
        trio.socket.set_custom_socket_factory(UnacknowledgedGiveUp(7.5, idle_s=4))
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        dialled = await trio.open_tcp_stream("127.0.0.1", port)
        accepted = await listeners[0].accept()
        options = [
            (
                s.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                s.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                s.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                s.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            )
            for s in (dialled, accepted)
        ]
        for closeable in (dialled, accepted, *listeners):
            await closeable.aclose()
        return options

    assert trio.run(main) == [(7500, 1, 4, 4)] * 2
    # Another trio run (the daemon's other trio users) keeps trio's own sockets.
    assert trio.run(_default_options) == (0, 0)


async def _default_options() -> tuple[int, int]:
    sock = trio.socket.socket()
    try:
        return (
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        )
    finally:
        sock.close()


def _host(tmp_path: Path, name: str, user_timeout_s: float, idle_s: int) -> P2PHost:
    host = P2PHost(load_identity(tmp_path / name / "id.key"), "/ip4/127.0.0.1/tcp/0", [],
                   validator=lambda *_: True, on_message=lambda *_: None, content=lambda _cid: None,
                   max_content_bytes=1 << 20, user_timeout_s=user_timeout_s,
                   keepalive_idle_s=idle_s)  # fmt: skip
    host.start()
    return host


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[P2PHost, P2PHost]]:
    a, b = _host(tmp_path, "a", 3.0, 1), _host(tmp_path, "b", 3.0, 1)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_a_peer_whose_process_stalls_is_kept(hosts) -> None:
    a, b = hosts
    a.connect(b.addrs[0])
    # b's event loop stalls for 8 s, far past the user timeout: its kernel still acknowledges.
    stall = threading.Thread(
        target=trio.from_thread.run_sync, args=(time.sleep, 8), kwargs={"trio_token": b._token}
    )
    stall.start()
    time.sleep(7)
    assert b.peer_id in a.connected()
    stall.join()
    assert b.peer_id in a.connected()


@pytest.mark.skipif(nat_unavailable() is not None, reason=str(nat_unavailable()))
def test_an_idle_peer_that_stops_acknowledging_is_dropped_by_keepalive(hosts) -> None:
    a, b = hosts
    a.connect(b.addrs[0])
    assert b.peer_id in a.connected()
    port = b.addrs[0].split("/tcp/")[1].split("/")[0]
    # Packets to and from b's port vanish (the test's own port on loopback; removed below), as in a partition.
    rules = [["-p", "tcp", "--dport", port, "-j", "DROP"], ["-p", "tcp", "--sport", port, "-j", "DROP"]]
    for rule in rules:
        subprocess.run(["iptables", "-I", "INPUT", "-i", "lo", *rule], check=True)
    try:
        started = time.monotonic()
        # The test sends nothing: the kernel's probes (and whatever libp2p itself sends) meet the cut.
        while b.peer_id in a.connected() and time.monotonic() - started < 30:
            time.sleep(0.2)
        gone_after = time.monotonic() - started
    finally:
        for rule in rules:
            subprocess.run(["iptables", "-D", "INPUT", "-i", "lo", *rule], check=False)
    # Idle 1 s, a probe every second, the user timeout 3 s: gone after 3.8 s (two runs). py-libp2p's own
    # traffic on the connection made it 3.8 s with keepalive off too; keepalive is what catches a connection
    # that carries nothing at all. With neither (the kernel's defaults) it stayed connected past 20 s.
    assert b.peer_id not in a.connected(), f"still connected {gone_after:.1f} s after the cut"
    assert gone_after < 20
    a.connect(b.addrs[0])  # the path is back: a fresh connection works
    assert b.peer_id in a.connected()
