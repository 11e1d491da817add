"""gRPC over libp2p: a peer with no reachable gRPC address (behind NAT) still answers routed requests.

Protocol `/zoo/grpc/1.0.0` carries one TCP connection's bytes each way: the serving side pipes the
stream into its own gRPC server (only that address, never one the peer names: not an open proxy), and
the routing side listens on a loopback port per peer whose accepted connections each open such a stream,
so the router's gRPC channel to that port is a channel to the peer (deadlines, streaming, cancellation
and status codes as over TCP). A peer reaches through it exactly what it reaches on the gRPC port: the
admin calls still need the admin token, and `server.api_key` applies.

Why bytes and not a message protocol: HTTP/2 framing, flow control and gRPC's status semantics are what
the router already relies on; a tunnel keeps one routed path, whatever carries it.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from zoo.node.logs import get_logger

log = get_logger(__name__)

GRPC_PROTOCOL = "/zoo/grpc/1.0.0"
MAX_TUNNELS = 32  # peers with a loopback listener; the least recently used one is closed first
MAX_SERVED = 32  # tunnelled connections served at once
CHUNK = 65536


async def pipe(stream: Any, sock: trio.SocketStream) -> None:
    """Copy bytes both ways between a libp2p stream and a TCP connection until either side ends."""
    from libp2p.network.stream.exceptions import StreamError

    async def to_sock() -> None:
        with contextlib.suppress(StreamError, trio.BrokenResourceError, trio.ClosedResourceError):
            while chunk := await stream.read(CHUNK):
                await sock.send_all(chunk)

    async def to_stream() -> None:
        with contextlib.suppress(StreamError, trio.BrokenResourceError, trio.ClosedResourceError):
            while chunk := await sock.receive_some(CHUNK):
                await stream.write(chunk)

    async with trio.open_nursery() as nursery:

        async def one_way(copy: Callable[[], Awaitable[None]]) -> None:
            await copy()
            nursery.cancel_scope.cancel()  # one side ended: the connection is over

        nursery.start_soon(one_way, to_sock)
        nursery.start_soon(one_way, to_stream)
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        await sock.aclose()
        with contextlib.suppress(Exception):
            await stream.reset()


class Tunnels:
    """Both sides of gRPC over libp2p for one host (trio thread)."""

    def __init__(self, host: Any, grpc_target: Callable[[], str | None]) -> None:
        self.host = host
        self.grpc_target = grpc_target  # this node's own gRPC address, None while not serving
        self._served = trio.Semaphore(MAX_SERVED)
        self._listeners: OrderedDict[str, tuple[str, trio.CancelScope]] = OrderedDict()

    async def serve(self, stream: Any) -> None:
        """A peer's tunnelled connection into this node's gRPC server."""
        target = self.grpc_target()
        if target is None or self._served.value == 0:
            with contextlib.suppress(Exception):
                await stream.reset()
            return
        async with self._served:
            host, _, port = target.rpartition(":")
            try:
                sock = await trio.open_tcp_stream(host.strip("[]") or "127.0.0.1", int(port))
            except OSError as e:
                log.info("p2p gRPC tunnel: own server unreachable", target=target, error=str(e))
                with contextlib.suppress(Exception):
                    await stream.reset()
                return
            await pipe(stream, sock)

    async def open(self, peer_id: str, nursery: trio.Nursery, connect: Callable[[], Awaitable[None]]) -> str:
        """The loopback address whose connections reach `peer_id`'s gRPC server (listening from now on
        until MAX_TUNNELS newer ones close it). `connect` is awaited when the peer is not connected."""
        from libp2p.peer.id import ID

        if peer_id in self._listeners:
            self._listeners.move_to_end(peer_id)
            return self._listeners[peer_id][0]
        peer = ID.from_base58(peer_id)
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        address = f"127.0.0.1:{listener.socket.getsockname()[1]}"

        async def handle(sock: trio.SocketStream) -> None:
            try:
                if peer not in self.host.get_connected_peers():
                    await connect()
                with trio.fail_after(10):
                    stream = await self.host.new_stream(peer, [GRPC_PROTOCOL])
            except Exception as e:  # the router's channel sees the connection close: UNAVAILABLE
                log.info("p2p gRPC tunnel not opened", peer=peer_id, error=f"{type(e).__name__}: {e}")
                await sock.aclose()
                return
            await pipe(stream, sock)

        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await trio.serve_listeners(handle, [listener])

        nursery.start_soon(run)
        self._listeners[peer_id] = (address, scope)
        while len(self._listeners) > MAX_TUNNELS:
            _, (_, old) = self._listeners.popitem(last=False)
            old.cancel()
        return address
