"""TCP sockets for the libp2p host that give up on a peer that stops acknowledging: kernel keepalive
probes on an idle connection (SO_KEEPALIVE after `KEEPALIVE_IDLE_S`) and TCP_USER_TIMEOUT.

A peer cut off without a FIN or RST (a partition, a machine gone, a route that refuses) leaves its
connection looking open: an idle connection never notices, and a busy one retransmits for about 15
minutes before Linux reports it dead (py-libp2p's close of it then waits on writes that never finish).
Here the kernel probes a connection idle for `KEEPALIVE_IDLE_S`, and aborts any connection whose data
(probes included) has gone unacknowledged for `USER_TIMEOUT_S`; every read and write on it then fails at
once, and py-libp2p removes the connection and tells gossipsub and the DHT the peer is gone. A live peer,
however busy its process, is acknowledged by its kernel: a slow node is never cut. (The node once pinged
its peers and dropped those that answered late; under load, at 24 nodes on two cores, that dropped live
peers by the dozen and the mesh never settled. The kernel's probes cost no Python and are never late.)

Trio's socket factory hook is the one place every socket the libp2p stack opens passes through (its TCP
transport calls trio.socket.socket for listeners and dials alike; accepted sockets inherit the option from
their listener). It is set inside the host's own trio run, so no other socket in the daemon is affected.
Written here because py-libp2p's TCP transport takes no socket options.
"""

from __future__ import annotations

import socket as stdlib_socket

import trio

USER_TIMEOUT_S = 30.0
KEEPALIVE_IDLE_S = 10  # idle seconds before the first probe; then one every KEEPALIVE_INTERVAL_S
KEEPALIVE_INTERVAL_S = 5


class UnacknowledgedGiveUp(trio.abc.SocketFactory):
    """trio sockets as usual; TCP ones with keepalive probes after `idle_s` idle seconds and
    TCP_USER_TIMEOUT set to `timeout_s`."""

    def __init__(self, timeout_s: float = USER_TIMEOUT_S, idle_s: int = KEEPALIVE_IDLE_S) -> None:
        self.timeout_ms = int(timeout_s * 1000)
        self.idle_s = idle_s

    def socket(
        self,
        family: stdlib_socket.AddressFamily | int = stdlib_socket.AF_INET,
        type: stdlib_socket.SocketKind | int = stdlib_socket.SOCK_STREAM,
        proto: int = 0,
    ) -> trio.socket.SocketType:
        sock = stdlib_socket.socket(family, type, proto)
        tcp = family in (stdlib_socket.AF_INET, stdlib_socket.AF_INET6) and type == stdlib_socket.SOCK_STREAM
        if tcp and hasattr(stdlib_socket, "TCP_USER_TIMEOUT"):  # Linux; elsewhere the kernel's default
            tcp_level = stdlib_socket.IPPROTO_TCP
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
            sock.setsockopt(tcp_level, stdlib_socket.TCP_KEEPIDLE, self.idle_s)
            sock.setsockopt(tcp_level, stdlib_socket.TCP_KEEPINTVL, min(self.idle_s, KEEPALIVE_INTERVAL_S))
            sock.setsockopt(tcp_level, stdlib_socket.TCP_USER_TIMEOUT, self.timeout_ms)
        return trio.socket.from_stdlib_socket(sock)
