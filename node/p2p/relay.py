"""Reachability behind NAT: circuit relay v2 (py-libp2p's `relay.circuit_v2`), on the host's trio loop.

Every node can dial a `/p2p-circuit` address. A public node with `p2p.relay_service` on relays for
others (the HOP side), bounded by its limits: reservations it holds, circuits per reserved peer, bytes
and seconds per circuit. A node behind NAT lists relays in `p2p.relays`: it keeps a connection to each,
reserves a slot there (again whenever the connection it was made over is gone, and every
RESERVE_EVERY_S), advertises `RELAY/p2p-circuit/p2p/SELF` so peers can dial it, and accepts relayed
connections (the STOP side; a node with no relays does not, so no peer can open them there).

What py-libp2p 0.8.1 does not do, and so this module does instead (each seen in a prototype against the
library): the swarm never dials a circuit address by itself (`dial` goes to the circuit transport); a
reservation is not dropped when the connection to its relay is (re-reserving on reconnect is ours);
AutoNAT answers "public" for any address, since its dial-back reuses the existing connection, so a node
cannot learn it is behind NAT and the operator says so by listing relays; hole punching (DCUtR) only
upgraded loopback connections, never through a real NAT, so relayed connections stay relayed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from multiaddr import Multiaddr

from zoo.node.logs import get_logger
from zoo.node.p2p.backoff import Backoff
from zoo.node.p2p.streams import close_stream

log = get_logger(__name__)

RESERVE_EVERY_S = 600.0  # well within the relay's reservation TTL (an hour by default)
CHECK_EVERY_S = 2.0
MAX_BACKOFF_S = 30.0  # a node behind NAT is unreachable without its relay: never wait long to retry


@dataclass(frozen=True)
class RelayLimits:
    """What a relay grants (p2p.relay_* settings)."""

    max_reservations: int = 64
    max_circuits: int = 16  # per reserved peer
    circuit_bytes: int = 256 << 20
    circuit_s: int = 3600


def _protocol_class() -> Any:
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

    class ConnectionPeerRelay(CircuitV2Protocol):  # type: ignore[misc]
        """py-libp2p 0.8.1 reserves the slot for the peer id the RESERVE message names, so one peer could
        fill every slot with made-up ids: the slot is for the peer on the connection, as the spec says
        (the library falls back to it when the message names none)."""

        async def _handle_reserve(self, stream: Any, msg: Any) -> None:
            msg.ClearField("peer")
            await super()._handle_reserve(stream, msg)

    return ConnectionPeerRelay


@dataclass
class Relaying:
    """The circuit relay protocol and transport of one host, and its reservations.

    `reserved` and `refused` are replaced, never changed in place: other threads read them (`addrs`)."""

    hop: RelayLimits | None  # None: this node does not relay for others
    relays: list[str]  # /p2p/ multiaddrs of relays to reserve a slot at
    protocol: Any = None
    transport: Any = None
    reserved: dict[str, float] = field(default_factory=dict)  # relay multiaddr -> when reserved
    refused: frozenset[str] = frozenset()  # relays whose last answer was a refusal

    def attach(self, host: Any) -> Any:
        """Create the protocol and transport on `host`; returns the protocol, a service to run, or None
        when this node neither relays nor reserves (it can still dial through relays: that needs only the
        transport, while accepting relayed connections would let any peer open them unbounded)."""
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
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
        self.protocol = _protocol_class()(host, limits=limits, allow_hop=self.hop is not None)
        # STOP only: with the CLIENT role the transport reserves a slot for itself before every dial.
        self.transport = CircuitV2Transport(host, self.protocol, RelayConfig(roles=RelayRole.STOP))
        return self.protocol if self.hop is not None or self.relays else None

    def circuit_addrs(self, peer_id: str) -> list[str]:
        """This node's addresses through the relays that hold a slot for it."""
        return [f"{relay}/p2p-circuit/p2p/{peer_id}" for relay in self.reserved]

    async def dial(self, addr: str) -> None:
        await self.transport.dial(Multiaddr(addr))

    async def keep_reservations(
        self, host: Any, dial: Callable[[str], Awaitable[Any]], nursery: trio.Nursery
    ) -> None:
        """Forever: for each relay, reserve a slot when there is none, it is old, or the connection it was
        made over is gone (a relay that restarted has forgotten it, even if a new connection came up in
        between); a relay that cannot be reached or refuses is retried with backoff."""
        from libp2p.peer.peerinfo import info_from_p2p_addr

        held: dict[str, list[Any]] = {}  # relay -> the connections its slot was reserved over (kept, not
        # their ids: a closed connection's id can be a new one's)
        retries = Backoff(CHECK_EVERY_S, MAX_BACKOFF_S)
        while True:
            network = host.get_network()
            for relay in self.relays:
                info = info_from_p2p_addr(Multiaddr(relay))
                conns = network.get_connections(info.peer_id)
                fresh = time.monotonic() - self.reserved.get(relay, -1e9) < RESERVE_EVERY_S
                if fresh and any(c is h for c in conns for h in held.get(relay, [])):
                    continue
                if relay in self.reserved:
                    self.reserved = {k: v for k, v in self.reserved.items() if k != relay}
                if not retries.due(relay):
                    continue
                ok = await self._reserve(host, dial, relay, info.peer_id, nursery)
                if ok:
                    self.reserved = {**self.reserved, relay: time.monotonic()}
                    self.refused = self.refused - {relay}
                    held[relay] = list(network.get_connections(info.peer_id))
                    retries.succeeded(relay)
                    log.info("p2p relay slot reserved", relay=relay)
                else:
                    retries.failed(relay)
            await trio.sleep(CHECK_EVERY_S)

    async def _reserve(
        self,
        host: Any,
        dial: Callable[[str], Awaitable[Any]],
        relay: str,
        relay_id: Any,
        nursery: trio.Nursery,
    ) -> bool:
        from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

        try:
            with trio.fail_after(15):
                await dial(relay)
                stream = await host.new_stream(relay_id, [PROTOCOL_ID])
                try:
                    ok = bool(await self.transport.reserve(stream, relay_id, nursery))
                finally:
                    await close_stream(stream)
        except Exception as e:  # unreachable, timed out, not speaking the protocol
            log.info("p2p relay reservation failed", relay=relay, error=f"{type(e).__name__}: {e}")
            return False
        if not ok:
            self.refused = self.refused | {relay}
            log.warning("p2p relay refused a reservation (full, or not a relay)", relay=relay)
        return ok
