"""TCP sockets for the libp2p host that give up on a peer that stops acknowledging (TCP_USER_TIMEOUT).

A peer cut off without a FIN or RST (a partition, a machine gone, a route that refuses) leaves its
connection looking open: Linux retransmits for about 15 minutes before it reports the socket dead, and
py-libp2p's close of such a connection waits on writes that never finish. With TCP_USER_TIMEOUT the kernel
aborts the connection once data it sent has gone unacknowledged for `USER_TIMEOUT_S`; every read and write
on it then fails at once, and py-libp2p removes the connection and tells gossipsub and the DHT the peer is
gone. The node pings every connected peer every 15 s (component LIVENESS_S), so a connection always has
data in flight to time out. A live peer, however busy its process, is acknowledged by its kernel: a slow
node is not cut.

Trio's socket factory hook is the one place every socket the libp2p stack opens passes through (its TCP
transport calls trio.socket.socket for listeners and dials alike; accepted sockets inherit the option from
their listener). It is set inside the host's own trio run, so no other socket in the daemon is affected.
Written here because py-libp2p's TCP transport takes no socket options.
"""

from __future__ import annotations

import socket as stdlib_socket

import trio

USER_TIMEOUT_S = 30.0


class UnacknowledgedGiveUp(trio.abc.SocketFactory):
    """trio sockets as usual; TCP ones with TCP_USER_TIMEOUT set to `timeout_s`."""

    def __init__(self, timeout_s: float = USER_TIMEOUT_S) -> None:
        self.timeout_ms = int(timeout_s * 1000)

    def socket(
        self,
        family: stdlib_socket.AddressFamily | int = stdlib_socket.AF_INET,
        type: stdlib_socket.SocketKind | int = stdlib_socket.SOCK_STREAM,
        proto: int = 0,
    ) -> trio.socket.SocketType:
        sock = stdlib_socket.socket(family, type, proto)
        tcp = family in (stdlib_socket.AF_INET, stdlib_socket.AF_INET6) and type == stdlib_socket.SOCK_STREAM
        if tcp and hasattr(stdlib_socket, "TCP_USER_TIMEOUT"):  # Linux; elsewhere the kernel's default
            sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_USER_TIMEOUT, self.timeout_ms)
        return trio.socket.from_stdlib_socket(sock)
