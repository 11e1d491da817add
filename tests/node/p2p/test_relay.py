"""Circuit relay v2 and gRPC over libp2p between real hosts on 127.0.0.1 (the NAT itself: test_nat.py)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.node.p2p.test_host import make_host, wait_until  # noqa: F401 (a fixture)
from zoo.node.p2p.host import P2PError
from zoo.node.p2p.relay import Relaying, RelayLimits


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(b"echo:" + data)


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A TCP server standing in for the node's gRPC port (the tunnel carries bytes; gRPC: test_nat.py)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def circuit_of(host) -> str:  # type: ignore[no-untyped-def]
    return next(a for a in host.addrs if "/p2p-circuit/" in a)


def test_a_node_reserves_at_a_relay_and_is_dialled_and_tunnelled_through_it(make_host, echo_server) -> None:  # noqa: F811
    relay, _ = make_host("relay", relaying=Relaying(hop=RelayLimits(max_reservations=1), relays=[]))
    behind, _ = make_host(
        "behind",
        content={"bafy-test": b"library bytes"},
        relaying=Relaying(hop=None, relays=[relay.addrs[0]]),
        grpc_target=lambda: echo_server,
    )
    wait_until(lambda: any("/p2p-circuit/" in a for a in behind.addrs), 20)
    circuit = circuit_of(behind)
    assert circuit == f"{relay.addrs[0]}/p2p-circuit/p2p/{behind.peer_id}"

    client, _ = make_host("client")  # dials through the relay with no relay protocol running itself
    assert client.relaying.protocol is not None and not client.relaying.relays and client.relaying.hop is None
    assert client.connect(circuit) == behind.peer_id
    assert client.fetch(behind.peer_id, "bafy-test", 1 << 20, 10.0) == b"library bytes"

    address = client.tunnel(behind.peer_id, [circuit])
    assert client.tunnel(behind.peer_id, [circuit]) == address  # one listener per peer
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"hello")
        assert sock.recv(100) == b"echo:hello"

    # The relay holds one slot (max_reservations = 1): a second node behind it gets no circuit address,
    # and a circuit to a node with no slot is refused.
    second, _ = make_host("second", relaying=Relaying(hop=None, relays=[relay.addrs[0]]))
    wait_until(lambda: relay.addrs[0] in second.relaying.refused, 20)
    assert not any("/p2p-circuit/" in a for a in second.addrs)
    with pytest.raises(P2PError):
        client.connect(f"{relay.addrs[0]}/p2p-circuit/p2p/{second.peer_id}")


def test_a_tunnel_to_a_node_that_serves_no_grpc_closes_at_once(make_host) -> None:  # noqa: F811
    server, _ = make_host("server")  # no grpc_target: the protocol is not offered
    client, _ = make_host("client")
    address = client.tunnel(server.peer_id, [server.addrs[0]])
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"hello")
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed or reset, never left hanging: a gRPC
            assert sock.recv(100) == b""  # channel sees UNAVAILABLE at once and asks the next peer
