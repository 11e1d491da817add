"""Reading and closing py-libp2p streams the way every protocol of the node needs (content, gRPC tunnel)."""

from __future__ import annotations

import contextlib
from typing import Any

import trio


async def read_some(stream: Any, n: int) -> bytes:
    """Up to n bytes; b"" once the other side has closed (py-libp2p raises StreamEOF)."""
    from libp2p.network.stream.exceptions import StreamEOF

    try:
        return await stream.read(n)
    except StreamEOF:
        return b""


async def close_stream(stream: Any) -> None:
    """Close a stream even from a cancelled scope (a deadline that expired), within a second."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + 1.0
        try:
            await stream.close()
        except Exception:
            with contextlib.suppress(Exception):
                await stream.reset()
