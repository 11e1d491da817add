"""gRPC over libp2p: a peer with no reachable gRPC address (behind NAT) still answers routed requests.

Protocol `/zoo/grpc/1.0.0` carries one TCP connection's bytes each way: the serving side pipes the
stream into its own gRPC server (only that address, never one the peer names: not an open proxy), and
the routing side listens on a loopback port per peer whose accepted connections each open such a stream,
so the router's gRPC channel to that port is a channel to the peer (deadlines, streaming, cancellation
and status codes as over TCP). A peer reaches through it exactly what it reaches on the gRPC port: the
admin calls still need the admin token, and `server.api_key` applies. A peer holds at most
MAX_PER_PEER tunnelled connections and a connection idle for IDLE_S is closed (a router reopens one on
its next request), so no peer can hold every slot.

Why bytes and not a message protocol: HTTP/2 framing, flow control and gRPC's status semantics are what
the router already relies on; a tunnel keeps one routed path, whatever carries it.
"""

from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from zoo.node.logs import get_logger
from zoo.node.p2p.streams import close_stream, read_some

log = get_logger(__name__)

GRPC_PROTOCOL = "/zoo/grpc/1.0.0"
MAX_TUNNELS = 32  # peers with a loopback listener; the least recently used one is closed first
MAX_SERVED = 32  # tunnelled connections served at once, all peers together ...
MAX_PER_PEER = 4  # ... and per peer (a router's channel to a peer is one connection)
IDLE_S = 300.0
CHUNK = 65536

Connect = Callable[[list[str]], Awaitable[None]]  # dial the peer at one of these addresses


async def pipe(stream: Any, sock: trio.SocketStream, idle_s: float = IDLE_S) -> None:
    """Copy bytes both ways between a libp2p stream and a TCP connection until either side ends, fails or
    both are idle for `idle_s`; both are closed after. Never raises (a failure is the connection's end)."""
    last = trio.current_time()

    async def copy(read: Callable[[], Awaitable[bytes]], write: Callable[[bytes], Awaitable[Any]]) -> None:
        nonlocal last
        with contextlib.suppress(Exception):  # reset, refused, closed: the connection is over
            while chunk := await read():
                last = trio.current_time()
                await write(chunk)

    async with trio.open_nursery() as nursery:

        async def one_way(
            read: Callable[[], Awaitable[bytes]], write: Callable[[bytes], Awaitable[Any]]
        ) -> None:
            await copy(read, write)
            nursery.cancel_scope.cancel()

        async def watchdog() -> None:
            while trio.current_time() - last < idle_s:
                await trio.sleep(min(10.0, idle_s))
            nursery.cancel_scope.cancel()

        nursery.start_soon(one_way, lambda: read_some(stream, CHUNK), sock.send_all)
        nursery.start_soon(one_way, lambda: sock.receive_some(CHUNK), stream.write)
        nursery.start_soon(watchdog)
    with trio.CancelScope(shield=True), trio.move_on_after(1), contextlib.suppress(Exception):
        await sock.aclose()
    await close_stream(stream)


class Tunnels:
    """Both sides of gRPC over libp2p for one host (trio thread)."""

    def __init__(self, host: Any, grpc_target: Callable[[], str | None]) -> None:
        self.host = host
        self.grpc_target = grpc_target  # this node's own gRPC address, None while not serving
        self._served = trio.Semaphore(MAX_SERVED)
        self._per_peer: Counter[str] = Counter()
        self._listeners: OrderedDict[str, tuple[str, trio.CancelScope]] = OrderedDict()
        self._addrs: dict[str, list[str]] = {}  # peer -> where to dial it, as last told

    async def serve(self, stream: Any) -> None:
        """A peer's tunnelled connection into this node's gRPC server."""
        peer = str(stream.muxed_conn.peer_id)
        target = self.grpc_target()
        if target is None or self._served.value == 0 or self._per_peer[peer] >= MAX_PER_PEER:
            await close_stream(stream)
            return
        self._per_peer[peer] += 1
        try:
            async with self._served:
                address, _, port = target.rpartition(":")
                try:
                    sock = await trio.open_tcp_stream(address.strip("[]") or "127.0.0.1", int(port))
                except (OSError, ValueError) as e:
                    log.info("p2p gRPC tunnel: own server unreachable", target=target, error=str(e))
                    await close_stream(stream)
                    return
                await pipe(stream, sock)
        finally:
            self._per_peer[peer] -= 1
            if self._per_peer[peer] <= 0:
                del self._per_peer[peer]

    async def open(self, peer_id: str, addrs: list[str], nursery: trio.Nursery, connect: Connect) -> str:
        """The loopback address whose connections reach `peer_id`'s gRPC server (listening from now on
        until MAX_TUNNELS newer ones close it). When the peer is not connected, `connect` dials it at the
        addresses the latest call gave, relayed ones first (the others of a NATed peer are private)."""
        from libp2p.peer.id import ID

        self._addrs[peer_id] = sorted(addrs, key=lambda a: "/p2p-circuit/" not in a)
        if peer_id in self._listeners:
            self._listeners.move_to_end(peer_id)
            return self._listeners[peer_id][0]
        peer = ID.from_base58(peer_id)
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        address = f"127.0.0.1:{listener.socket.getsockname()[1]}"

        async def handle(sock: trio.SocketStream) -> None:
            try:
                if peer not in self.host.get_connected_peers():
                    await connect(self._addrs.get(peer_id, []))
                with trio.fail_after(10):
                    stream = await self.host.new_stream(peer, [GRPC_PROTOCOL])
            except Exception as e:  # the router's channel sees the connection close: UNAVAILABLE
                log.info("p2p gRPC tunnel not opened", peer=peer_id, error=f"{type(e).__name__}: {e}")
                with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await sock.aclose()
                return
            await pipe(stream, sock)

        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    await trio.serve_listeners(handle, [listener])
                except Exception as e:  # never into the host's nursery: that would stop the host
                    log.warning(
                        "p2p gRPC tunnel listener stopped", peer=peer_id, error=f"{type(e).__name__}: {e}"
                    )
            if self._listeners.get(peer_id, (None, None))[1] is scope:
                del self._listeners[peer_id]

        nursery.start_soon(run)
        self._listeners[peer_id] = (address, scope)
        while len(self._listeners) > MAX_TUNNELS:
            old_peer, (_, old) = self._listeners.popitem(last=False)
            self._addrs.pop(old_peer, None)
            old.cancel()
        return address
