"""Reachability behind NAT: circuit relay v2 (py-libp2p's `relay.circuit_v2`), on the host's trio loop.

Every node accepts relayed connections (the STOP side) and can dial a `/p2p-circuit` address. A public
node with `p2p.relay_service` on relays for others (the HOP side), bounded by its limits: reservations
it holds, circuits per reserved peer, bytes and seconds per circuit. A node behind NAT lists relays in
`p2p.relays`: it keeps a connection to each, reserves a slot there (again whenever the connection was
lost, and every RESERVE_EVERY_S), and advertises `RELAY/p2p-circuit/p2p/SELF` so peers can dial it.

What py-libp2p 0.8.1 does not do, and so this module does instead (each seen in a prototype against the
library): the swarm never dials a circuit address by itself (`dial` goes to the circuit transport); a
reservation is not dropped when the connection to its relay is (re-reserving on reconnect is ours);
AutoNAT answers "public" for any address, since its dial-back reuses the existing connection, so a node
cannot learn it is behind NAT and the operator says so by listing relays; hole punching (DCUtR) only
upgraded loopback connections, never through a real NAT, so relayed connections stay relayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import trio
from multiaddr import Multiaddr

from zoo.node.logs import get_logger

log = get_logger(__name__)

RESERVE_EVERY_S = 600.0  # well within the relay's reservation TTL (an hour by default)
CHECK_EVERY_S = 2.0


@dataclass(frozen=True)
class RelayLimits:
    """What a relay grants (p2p.relay_* settings)."""

    max_reservations: int = 64
    max_circuits: int = 16  # per reserved peer
    circuit_bytes: int = 256 << 20
    circuit_s: int = 3600


@dataclass
class Relaying:
    """The circuit relay protocol and transport of one host, and its reservations."""

    hop: RelayLimits | None  # None: this node does not relay for others
    relays: list[str]  # /p2p/ multiaddrs of relays to reserve a slot at
    protocol: Any = None
    transport: Any = None
    reserved: dict[str, float] = field(default_factory=dict)  # relay multiaddr -> when reserved

    def attach(self, host: Any) -> Any:
        """Create the protocol and transport on `host`; returns the protocol (a service to run)."""
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
        from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
        from libp2p.relay.circuit_v2.resources import RelayLimits as LibLimits
        from libp2p.relay.circuit_v2.transport import CircuitV2Transport

        limits = None
        if self.hop is not None:
            h = self.hop
            limits = LibLimits(
                duration=h.circuit_s,
                data=h.circuit_bytes,
                max_circuit_conns=h.max_circuits,
                max_reservations=h.max_reservations,
            )
        self.protocol = CircuitV2Protocol(host, limits=limits, allow_hop=self.hop is not None)
        # STOP only: with the CLIENT role the transport reserves a slot for itself before every dial.
        self.transport = CircuitV2Transport(host, self.protocol, RelayConfig(roles=RelayRole.STOP))
        return self.protocol

    def circuit_addrs(self, peer_id: str) -> list[str]:
        """This node's addresses through the relays that hold a slot for it."""
        return [f"{relay}/p2p-circuit/p2p/{peer_id}" for relay in self.reserved]

    async def dial(self, addr: str) -> None:
        await self.transport.dial(Multiaddr(addr))

    async def keep_reservations(self, host: Any, nursery: trio.Nursery) -> None:
        """Forever: for each relay, (re)connect and reserve when not connected, or the slot is old."""
        from libp2p.peer.peerinfo import info_from_p2p_addr
        from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

        held: dict[str, list[Any]] = {}  # relay -> the connections its slot was reserved over (kept, not
        # their ids: a closed connection's id can be a new one's)
        while True:
            network = host.get_network()
            for relay in self.relays:
                info = info_from_p2p_addr(Multiaddr(relay))
                conns = network.get_connections(info.peer_id)
                fresh = time.monotonic() - self.reserved.get(relay, -1e9) < RESERVE_EVERY_S
                if fresh and any(c is h for c in conns for h in held.get(relay, [])):
                    continue  # reserved over a connection that is still up: the slot is still ours
                # No slot, an old one, or the connection it was made over is gone (a relay that restarted
                # has forgotten it, even if a new connection came up in between): reserve again.
                self.reserved.pop(relay, None)
                try:
                    with trio.fail_after(15):
                        await host.connect(info)
                        stream = await host.new_stream(info.peer_id, [PROTOCOL_ID])
                        try:
                            ok = await self.transport.reserve(stream, info.peer_id, nursery)
                        finally:
                            await stream.close()
                except Exception as e:  # unreachable, timed out, not a relay: tried again next round
                    log.info("p2p relay reservation failed", relay=relay, error=f"{type(e).__name__}: {e}")
                    continue
                if ok:
                    self.reserved[relay] = time.monotonic()
                    held[relay] = list(network.get_connections(info.peer_id))
                    log.info("p2p relay slot reserved", relay=relay)
                else:
                    log.warning("p2p relay refused a reservation (full, or not a relay)", relay=relay)
            await trio.sleep(CHECK_EVERY_S)
