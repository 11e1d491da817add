"""The p2p component: the node's libp2p host, its gossip, its peer book and its dialling, supervised
like the other components (setup, a real health probe, background work, stop).

Inbound gossip is validated on the libp2p thread before it is delivered or relayed (size, JSON shape,
banned or flooding publisher); accepted messages cross to the asyncio loop through a queue. There:
- an announcement of a newer library version is a hint. Its root is checked against this node's own
  chain client (one bounded call per version: the on-chain root is cached); a match wakes the library
  follower at once, a mismatch scores the publisher down. Nothing is fetched on a peer's word.
- capabilities go into the peer book, which routing and `zoo-node peers` read; they expire.
Outbound: an announcement whenever this node finds a version on chain first, capabilities every
`capabilities_interval_s`. The peer book is re-dialled (with backoff per address) so a restarted node
finds its peers again, and banned peers are disconnected.
Discovery: a Kademlia walk every `discovery_interval_s` (every `redial_interval_s` while the node has no peer,
or is below `target_peers` with peers found and not connected) learns the network beyond this node's
connections. Below the target, the node dials its bootstrap peers, its book and the peers it found; at or
above it, one known peer after each walk; above `max_peers`, when set, it closes the excess (p2p/limits.py).
Whoever the node is connected to is remembered in the book, so it rejoins through any of them after a restart,
not only through its bootstrap list. The library CID it holds is announced as a DHT provider record on
activation (within PROVIDE_SPREAD_S when another node announced the version) and every ten minutes, so nodes
that are not connected to it can find it.
Liveness is the kernel's: a connection cut without a FIN or RST, as in a partition, is probed and dropped
by TCP keepalive and the user timeout (node/p2p/sockets.py); a slow peer is never dropped for being slow.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from zoo.node.config import P2PConfig
from zoo.node.lifecycle import Component, State
from zoo.node.logs import get_logger
from zoo.node.p2p.backoff import Backoff
from zoo.node.p2p.host import ContentLookup, P2PError, P2PHost, load_identity
from zoo.node.p2p.limits import GRACE_S, ConnectionAges, surplus
from zoo.node.p2p.messages import (
    CAPABILITIES_TOPIC,
    LIBRARY_TOPIC,
    Announcement,
    Capabilities,
    MessageError,
    decode,
    encode,
)
from zoo.node.p2p.peers import PeerBook, RateLimiter
from zoo.node.p2p.relay import Relaying, RelayLimits

log = get_logger(__name__)

TOPICS = {LIBRARY_TOPIC: Announcement, CAPABILITIES_TOPIC: Capabilities}
REPROVIDE_S = 600.0
PROVIDE_SPREAD_S = 30.0  # a version's provider records, by the nodes that did not announce it
MAX_DIALS_PER_ROUND = 16  # bootstrap peers first, then the book's best: a big book cannot stall a round


class ChainView(Protocol):
    """What the component asks the chain: its id, the registry address, a version's on-chain root."""

    chain_id: int  # 0 until connect() succeeded
    registry: str

    def connect(self) -> None:
        """Reach the chain once (blocking)."""
        ...

    def root_of(self, version: int) -> str | None:
        """0x-hex root of `version`, or None when the registry has no such version."""
        ...


class P2PComponent(Component):
    name = "p2p"
    probe_interval_s = 2.0
    has_background_task = True

    def __init__(
        self,
        settings: P2PConfig,
        data_dir: Path,
        *,
        content: ContentLookup,
        capabilities: Callable[[], Capabilities] | None = None,
        chain: Callable[[], ChainView | None] | None = None,
        on_newer_version: Callable[[int], None] | None = None,
        metrics: Any = None,
        max_content_bytes: int = 64 << 20,
    ) -> None:
        self.settings = settings
        self.max_content_bytes = max_content_bytes
        self.dir = data_dir / "p2p"
        self.capabilities = capabilities
        self.grpc_target: Callable[[], str | None] | None = None  # this node's gRPC, for peers' tunnels
        self.content = content
        self.chain = chain
        self.on_newer_version = on_newer_version
        self.metrics = metrics
        self.book = PeerBook(self.dir / "peers.json", settings.capabilities_ttl_s, settings.drop_score)
        self.limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
        self.relay_limiter = RateLimiter(10 * settings.rate_limit_per_s, 10 * settings.rate_limit_burst)
        self.host: P2PHost | None = None
        self.current_version = 0  # the version this node serves (set by the daemon on activation)
        self._hints: asyncio.Queue[tuple[str, bytes]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # version -> its root on chain (immutable once approved): one chain call per version answers every
        # claim about it, so liars announcing several wrong roots first cost one call, not one each.
        self._onchain_roots: OrderedDict[int, str] = OrderedDict()
        self._accepted: OrderedDict[tuple[int, str], None] = OrderedDict()  # announcements that checked out
        self._woken: dict[int, float] = {}  # version -> when a hint last woke the library for it
        self._chain_tried = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._found: list[tuple[str, list[str]]] = []  # the DHT's routing table after the last walk
        self.current_cid = ""  # the library CID this node holds (provided on the DHT)
        self._provided: tuple[str, float] = ("", -1e9)  # what was last provided, and when
        self._dials = Backoff(settings.redial_interval_s, 300.0)  # per address
        self._ages = ConnectionAges()
        self.grace_s = GRACE_S  # a new connection is never closed as surplus sooner
        self._rng = random.Random()
        self.connected: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------------------

    async def setup(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._hints = asyncio.Queue(maxsize=64)
        seed = load_identity(self.dir / "identity.key")
        s = self.settings
        hop = None
        if s.relay_service:
            hop = RelayLimits(
                s.relay_max_reservations, s.relay_max_circuits, s.relay_circuit_mb << 20, s.relay_circuit_s
            )
        host = P2PHost(
            seed,
            s.listen,
            list(TOPICS),
            validator=self._validate,
            on_message=self._deliver,
            content=self.content,
            max_content_bytes=self.max_content_bytes,
            relaying=Relaying(hop=hop, relays=list(s.relays)),
            grpc_target=self.grpc_target,
            target_peers=s.target_peers,
            max_peers=s.max_peers,
            on_offence=self.book.penalise,
        )
        await asyncio.to_thread(host.start)
        self.host = host
        log.info("p2p host listening", peer_id=host.peer_id, addrs=host.addrs)

    async def probe(self) -> tuple[State, str]:
        host = self.host
        if host is None or not host.running:
            return State.FAILED, "the libp2p host is not running"
        self.connected = await asyncio.to_thread(host.connected)
        self.book.mark_connected(self.connected)
        if self.metrics is not None:
            self.metrics.p2p_peers.set(len(self.connected))
        capable = len(self.book.capable())
        detail = f"peer {host.peer_id}, {len(self.connected)} connected, {capable} with live capabilities"
        if not self.connected and self.settings.bootstrap:
            return State.DEGRADED, detail + "; no bootstrap peer reachable yet"
        return State.SERVING, detail

    async def run_forever(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._handle_hints())
            tg.create_task(self._advertise())
            tg.create_task(self._dial())
            if self.settings.discovery:
                tg.create_task(self._discover())

    async def stop(self) -> None:
        if self.host is not None:
            await asyncio.to_thread(self.host.stop)
        await asyncio.to_thread(self.book.flush)

    @property
    def peer_id(self) -> str:
        return self.host.peer_id if self.host is not None else ""

    # -- gossip in (the libp2p thread) ----------------------------------------------------------------

    def _count(self, topic: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.p2p_messages.labels(topic, outcome).inc()

    def _validate(self, topic: str, publisher: str, forwarder: str, data: bytes) -> bool:
        """Accept or drop before delivery and relay; runs on the libp2p thread.

        Rate limits apply to the publisher (signed, so attributable) and, ten times looser, to the peer
        that relayed the message (which carries many publishers' traffic but must not carry a flood).
        """
        if self.host is not None and publisher == self.host.peer_id:
            return True
        if self.book.banned(publisher) or self.book.banned(forwarder):
            self._count(topic, "banned")
            return False
        # Floods are dropped, not scored: gossip replays a burst of cached messages to a peer that
        # (re)connects, and an honest relay may carry someone else's flood.
        if not self.limiter.allow(publisher) or not self.relay_limiter.allow(forwarder):
            self._count(topic, "rate_limited")
            return False
        try:
            decode(TOPICS[topic], data)
        except MessageError as e:
            self._count(topic, e.reason)
            if e.reason != "invalid":  # a schema mismatch may be a newer node's message: not held against it
                self.book.penalise(publisher, "malformed")
            log.info("p2p message dropped", topic=topic, peer=publisher, reason=str(e))
            return False
        return True

    def _deliver(self, topic: str, publisher: str, data: bytes) -> None:
        """An accepted message (libp2p thread): capabilities go straight into the book; announcements
        cross to the asyncio loop, where checking them may wait on the chain."""
        try:
            if topic == CAPABILITIES_TOPIC:
                self._capabilities(publisher, decode(Capabilities, data))
                return
        except MessageError as e:  # validated on arrival; only a bug gets here
            self._count(topic, e.reason)
            return
        loop, hints = self._loop, self._hints
        if loop is None or hints is None:
            return

        def put() -> None:
            if hints.full():
                self._count(topic, "queue_full")
            else:
                hints.put_nowait((publisher, data))

        loop.call_soon_threadsafe(put)

    # -- gossip in (the asyncio loop) -----------------------------------------------------------------

    async def _handle_hints(self) -> None:
        assert self._hints is not None
        while True:
            publisher, data = await self._hints.get()
            try:
                await self._hint(publisher, decode(Announcement, data))
            except MessageError as e:  # validated on arrival; only a bug gets here
                self._count(LIBRARY_TOPIC, e.reason)
            except Exception:
                log.exception("p2p announcement handling failed", peer=publisher)

    def _capabilities(self, publisher: str, caps: Capabilities) -> None:
        chain = self.chain() if self.chain is not None else None
        if chain is not None and caps.chain_id and chain.chain_id and caps.chain_id != chain.chain_id:
            self._count(CAPABILITIES_TOPIC, "other_network")
            return
        self.book.set_capabilities(publisher, caps)
        if caps.addrs:
            self.book.seen(publisher, caps.addrs)
        self._count(CAPABILITIES_TOPIC, "accepted")

    async def _hint(self, publisher: str, hint: Announcement) -> None:
        chain = await self._chain()
        if chain is None:
            self._count(LIBRARY_TOPIC, "unchecked")  # no chain: a hint cannot be checked, so it is unused
            return
        if hint.chain_id != chain.chain_id or hint.registry.lower() != chain.registry.lower():
            self._count(LIBRARY_TOPIC, "other_network")
            return
        onchain = self._onchain_roots.get(hint.version)
        if onchain is None:
            try:
                onchain = await asyncio.to_thread(chain.root_of, hint.version)
            except Exception as e:  # the chain is unreachable: no verdict on the peer, nothing done
                log.info("p2p hint not checked: chain call failed", version=hint.version, error=str(e))
                self._count(LIBRARY_TOPIC, "unchecked")
                return
            if onchain is None:
                # Not on this node's chain view yet: a lie or just a lagging RPC. No verdict, no penalty,
                # nothing done; the version arrives by polling if it is real.
                self._count(LIBRARY_TOPIC, "unknown_version")
                return
            onchain = onchain.lower()
            _remember(self._onchain_roots, hint.version, onchain)
        verdict = onchain == hint.root
        if not verdict:
            self._count(LIBRARY_TOPIC, "bad_hint")
            score = self.book.penalise(publisher, "bad_hint")
            log.warning(
                "p2p announcement does not match the chain; ignored",
                peer=publisher,
                version=hint.version,
                root=hint.root,
                score=score,
            )
            return
        self._count(LIBRARY_TOPIC, "accepted")
        _remember(self._accepted, (hint.version, hint.root), None)
        self.book.note_holder(publisher, hint.cid)  # content asks it first
        now = time.monotonic()
        # One wake-up per version and second at most: replaying an honest announcement cannot make the
        # node poll back to back.
        if hint.version > self.current_version and now - self._woken.get(hint.version, -1e9) > 1.0:
            self._woken = {v: t for v, t in self._woken.items() if v > self.current_version}
            self._woken[hint.version] = now
            if self.on_newer_version is not None:
                log.info("p2p announcement checks out; syncing now", peer=publisher, version=hint.version)
                self.on_newer_version(hint.version)

    # -- gossip out -----------------------------------------------------------------------------------

    async def _chain(self) -> ChainView | None:
        """The chain view once it has been reached (its chain id known), else None."""
        chain = self.chain() if self.chain is not None else None
        if chain is not None and not chain.chain_id:
            if time.monotonic() - self._chain_tried < 5.0:
                return None  # the chain was unreachable moments ago: do not queue more attempts
            self._chain_tried = time.monotonic()
            try:
                await asyncio.to_thread(chain.connect)
            except Exception as e:
                log.info("p2p: the chain is unreachable", error=f"{type(e).__name__}: {e}")
                return None
        return chain

    def announce(self, version: int, root: str, cid: str) -> None:
        """Tell peers this node activated a version (called on the event loop; publishes in background)."""
        if version >= self.current_version:
            self.current_cid = cid
        _remember(self._onchain_roots, version, root.lower())  # activated: checked against the chain
        self.current_version = max(self.current_version, version)
        if self.host is not None and self._loop is not None:
            task = self._loop.create_task(self._announce(version, root, cid))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _announce(self, version: int, root: str, cid: str) -> None:
        chain = await self._chain()
        if chain is None:
            return
        # A version this node heard of from a peer (an announcement that checked out) is news to nobody:
        # only the nodes that found it on chain first say so, instead of every node once more.
        if (version, root.lower()) not in self._accepted:
            message = Announcement(
                version=version, root=root, cid=cid, chain_id=chain.chain_id, registry=chain.registry
            )
            await self._publish(LIBRARY_TOPIC, encode(message))
        else:
            # Every node activates a version within a second or two of the others, and a provider record
            # is a DHT walk and a signed record for each of the k closest peers: all at once, that load is
            # what slowed the last nodes' own activation at N = 16. Holders that announced are the ones
            # asked first; the others' records are spread over the next PROVIDE_SPREAD_S.
            await asyncio.sleep(random.uniform(0, PROVIDE_SPREAD_S))
        await self._provide()

    async def _provide(self) -> None:
        """Announce the CID this node holds as a DHT provider record (on activation, then every
        REPROVIDE_S, well within the records' 24 h lifetime, so a record lost with a peer comes back)."""
        host, cid = self.host, self.current_cid
        if host is None or not cid:
            return
        try:
            await asyncio.to_thread(host.provide, cid)
            self._provided = (cid, time.monotonic())
        except P2PError as e:
            log.info("p2p provider record not published", cid=cid, error=str(e))

    async def _publish(self, topic: str, data: bytes) -> None:
        host = self.host
        if host is None:
            return
        try:
            await asyncio.to_thread(host.publish, topic, data)
        except P2PError as e:
            log.info("p2p publish failed", topic=topic, error=str(e))

    async def _advertise(self) -> None:
        """Every capabilities_interval_s, publish what this node serves if it changed (load, models,
        version, addresses) or a third of capabilities_ttl_s has passed since the last publish; an idle
        node's refreshes are what costs every peer CPU, and they grow with N (docs/network.md)."""
        said: tuple[dict[str, Any], float] | None = None  # the last published capabilities, and when
        while True:
            try:
                if self.capabilities is None:  # the daemon sets it once the servers are bound
                    await asyncio.sleep(0.2)
                    continue
                caps = self.capabilities()
                chain = self.chain() if self.chain is not None else None
                caps = caps.model_copy(
                    update={
                        "addrs": (self.host.addrs if self.host else [])[:8],
                        "chain_id": chain.chain_id if chain is not None else 0,
                        "grpc_over_p2p": self.grpc_target is not None and bool(caps.models),
                    }
                )
                if advertise_due(caps, said, time.monotonic(), self.settings.capabilities_ttl_s / 3):
                    await self._publish(CAPABILITIES_TOPIC, encode(caps))
                    said = (caps.model_dump(exclude={"sent_at"}), time.monotonic())
            except Exception:
                log.exception("p2p capabilities not published")
            await asyncio.sleep(self.settings.capabilities_interval_s)

    # -- dialling -------------------------------------------------------------------------------------

    async def _dial(self) -> None:
        while True:
            host = self.host
            if host is not None and host.running:
                await self._dial_once(host)
            await asyncio.to_thread(self.book.flush)
            await asyncio.sleep(self.settings.redial_interval_s)

    async def _discover(self) -> None:
        """Walk the DHT (see the module docstring); the first walk as soon as a peer is connected."""
        while True:
            host = self.host
            connected = await asyncio.to_thread(host.connected) if host is not None and host.running else []
            if host is not None and connected:
                try:
                    size = await asyncio.to_thread(host.discover)
                    self._found = await asyncio.to_thread(host.routing_peers)
                    connected = await asyncio.to_thread(host.connected)
                    for peer, addrs in self._found:  # remembered with their addresses: rejoin via any
                        if peer in connected and addrs:
                            self.book.seen(peer, addrs, connected=True)
                    log.debug("p2p DHT walk", routing_table=size, connected=len(connected))
                except P2PError as e:
                    log.info("p2p DHT walk failed", error=str(e))
                await self._explore(host)
                if time.monotonic() - self._provided[1] > REPROVIDE_S:
                    await self._provide()
            # Walk again soon only while there is no peer, or the routing table knows peers this node is
            # below its target and not connected to; otherwise every discovery_interval_s.
            short = not connected or len(connected) < min(self.settings.target_peers, len(self._found))
            interval = self.settings.redial_interval_s if short else self.settings.discovery_interval_s
            await asyncio.sleep(interval)

    async def _dial_once(self, host: P2PHost) -> None:
        connected = set(await asyncio.to_thread(host.connected))
        for peer in connected:
            if self.book.banned(peer):
                log.warning("disconnecting a banned peer", peer=peer)
                await self._disconnect(host, peer)
        self._ages.update(connected, time.monotonic())
        await self._trim(host, connected)
        if len(connected) >= max(1, self.settings.target_peers):
            return  # enough: the walks' exploration (_explore) keeps the mesh mixing
        targets = [(a, _peer_of(a)) for a in self.settings.bootstrap]
        targets += [(a, r.peer_id) for r in self.book.dialable() for a in r.addrs[:2]]
        # The DHT's peers (none with discovery off): what keeps a mesh of its own.
        targets += [(a, peer) for peer, addrs in self._found for a in addrs[:1] if peer not in connected]
        targets = targets[:MAX_DIALS_PER_ROUND]
        self._dials.keep_only(a for a, _ in targets)
        tried: set[str] = set()
        for addr, peer in targets:
            if len(connected) >= self.settings.target_peers > 0:
                break
            if peer in connected or peer in tried or peer == host.peer_id or self.book.banned(peer):
                continue
            if not self._dials.due(addr):
                continue
            tried.add(peer)
            if (got := await self._connect(host, addr)) is not None:
                connected.add(got)

    async def _connect(self, host: P2PHost, addr: str) -> str | None:
        try:
            got = await asyncio.to_thread(host.connect, addr, 5.0)
        except P2PError as e:
            log.info("p2p dial failed", addr=addr, error=str(e), retry_in_s=self._dials.failed(addr))
            return None
        self._dials.succeeded(addr)
        self.book.seen(got, [addr], connected=True)
        log.info("p2p peer connected", peer=got, addr=addr)
        return got

    async def _disconnect(self, host: P2PHost, peer: str) -> None:
        try:
            await asyncio.to_thread(host.disconnect, peer)
        except P2PError as e:
            log.info("p2p disconnect failed", peer=peer, error=str(e))

    async def _trim(self, host: P2PHost, connected: set[str]) -> None:
        """Above max_peers (when set), close the excess (node/p2p/limits.py)."""
        s = self.settings
        if not s.max_peers or len(connected) <= s.max_peers:
            return
        protected = {_peer_of(a) for a in [*s.bootstrap, *s.relays]}
        protected |= self._ages.young(time.monotonic(), self.grace_s)
        protected |= set(await asyncio.to_thread(host.gossip_mesh))
        protected |= set(await asyncio.to_thread(host.busy_peers))
        closing = surplus(connected, protected, s.max_peers, self._rng)
        if closing:
            log.info("p2p closing surplus connections", closing=len(closing), connected=len(connected))
        for peer in closing:
            await self._disconnect(host, peer)
            connected.discard(peer)

    async def _explore(self, host: P2PHost) -> None:
        """At or above target_peers, one known peer this node is not connected to is dialled after each walk:
        without it a node that has its target never meets anyone new, and two halves of a healed partition,
        each at its target, would never join again."""
        connected = set(await asyncio.to_thread(host.connected))
        if len(connected) < self.settings.target_peers:
            return  # the dial rounds are at work
        known = [(a, r.peer_id) for r in self.book.dialable() for a in r.addrs[:1]]
        known += [(a, peer) for peer, addrs in self._found for a in addrs[:1]]
        known = [
            (a, peer)
            for a, peer in known
            if peer not in connected and peer != host.peer_id and not self.book.banned(peer)
        ]
        if known:
            await self._connect(host, self._rng.choice(known)[0])

    def tunnel(self, peer_id: str, addrs: list[str]) -> str:
        """A loopback address reaching `peer_id`'s gRPC API over libp2p (blocking; P2PHost.tunnel)."""
        host = self.host
        if host is None or not host.running:
            raise P2PError("the libp2p host is not running")
        return host.tunnel(peer_id, addrs)

    # -- what GetStatus, ListPeers and `zoo-node peers` show ------------------------------------------

    def peers(self) -> list[dict[str, Any]]:
        connected = set(self.connected)
        out = []
        for r in self.book.records():
            out.append(
                {
                    "peer_id": r.peer_id,
                    "connected": r.peer_id in connected,
                    "addrs": r.addrs,
                    "last_seen": r.last_seen,
                    "score": r.score,
                    "banned": r.score <= self.book.drop_score,
                    "capabilities": r.capabilities,
                }
            )
        return out


def _remember(memory: OrderedDict[Any, Any], key: Any, value: Any, limit: int = 1024) -> None:
    memory[key] = value
    while len(memory) > limit:
        memory.popitem(last=False)


def _peer_of(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[-1] if "/p2p/" in addr else addr


def advertise_due(
    caps: Capabilities, said: tuple[dict[str, Any], float] | None, now: float, refresh_s: float
) -> bool:
    """Whether `caps` must be published: never published, changed (anything but sent_at) since `said`,
    or `said` is `refresh_s` old (peers expire capabilities after three times that)."""
    return said is None or now - said[1] >= refresh_s or caps.model_dump(exclude={"sent_at"}) != said[0]
