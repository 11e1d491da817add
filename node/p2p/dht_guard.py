"""Inbound DHT streams, bounded in time and scored: py-libp2p's Kademlia handler behind a deadline.

py-libp2p's DHT server already refuses what it cannot use (a message over 4 MiB, bytes that are not its
protobuf, a message cut short: it resets the stream) and serves at most 12 streams at once, but it bounds
neither how long a stream may stay open nor tells anyone who sent the garbage. So a peer that opens DHT
streams and says nothing holds the handler's slots for good, and one that sends garbage costs nothing.
`guarded` wraps the handler: a stream still open after `DHT_STREAM_S` is reset (no penalty: a slow peer is
not a liar), and a stream the handler read from, answered nothing on and reset carried something it
refused: its peer loses score (`on_offence(peer, "dht_garbage")`, the peer book's penalty, as for garbage
gossip). Not the other resets: before anything was read the handler is turning a stream away when full,
and after an answer it resets an honest stream at its end too (py-libp2p reads the client's close as an
error), which is nobody's offence.

Written by hand: the library has no hook for either, and this is the narrowest wrap that adds both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from zoo.node.logs import get_logger

log = get_logger(__name__)

DHT_STREAM_S = 30.0  # one inbound DHT stream, all its requests: py-libp2p's own queries take at most 10 s
OFFENCE = "dht_garbage"


class _Witnessed:
    """The stream as the handler sees it, recording how much it read and whether it reset it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.bytes_read = 0
        self.answered = False
        self.reset_by_handler = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def read(self, n: int | None = None) -> bytes:
        data = await self._stream.read(n)
        self.bytes_read += len(data)
        return data

    async def write(self, data: bytes) -> None:
        self.answered = True
        await self._stream.write(data)

    async def reset(self) -> None:
        self.reset_by_handler = True
        await self._stream.reset()


def guarded(
    handle: Callable[[Any], Awaitable[None]], on_offence: Callable[[str, str], Any]
) -> Callable[[Any], Awaitable[None]]:
    """`handle` (py-libp2p's `KadDHT.handle_stream`) with a deadline per stream and garbage scored."""

    async def serve(stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        witnessed = _Witnessed(stream)
        with trio.move_on_after(DHT_STREAM_S) as scope:
            await handle(witnessed)
        if scope.cancelled_caught:
            log.info("DHT stream reset after its deadline", peer=peer, seconds=DHT_STREAM_S)
            with contextlib.suppress(Exception):
                await stream.reset()
        elif witnessed.reset_by_handler and witnessed.bytes_read and not witnessed.answered:
            on_offence(peer, OFFENCE)

    return serve
