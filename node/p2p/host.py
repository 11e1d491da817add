"""A libp2p host (py-libp2p, which runs on trio) in its own thread, callable from any other thread.

The daemon runs on asyncio; py-libp2p runs on trio. The host owns one thread with one trio loop:
the libp2p host, gossipsub, the topic subscriptions and the content protocol's handler live there.
Other threads call in with blocking methods (`publish`, `connect`, `fetch`, ...) that run a coroutine
on the trio loop and wait for it (`trio.from_thread.run`); the asyncio side wraps them in
`asyncio.to_thread`. Messages flow out through `on_message`, called on the trio thread, which must only
hand them over (the component uses `loop.call_soon_threadsafe`).

Discovery and content routing are libp2p's Kademlia DHT (py-libp2p's `kad_dht`, server mode, provider
records on, value records off: the node stores nothing on a peer's behalf but "who holds this CID"). A
lookup of the node's own id (and of a random one) walks from the peers it is connected to towards the
whole network; the peers it meets land in the routing table with their addresses, which the component
dials to keep a mesh of its own (`discover`, `routing_peers`). `provide` and `find_providers` announce and
find holders of a library CID.

Content protocol `/zoo/library-bytes/1.0.0`: the client writes one JSON line `{"cid": CID}`; the server
answers one JSON line `{"size": N}` and N bytes, or `{"error": MESSAGE}` (a MESSAGE that begins "busy:"
means it serves its limit of requests at once: ask again shortly). The client refuses a size over
its limit before reading any content and bounds the whole exchange by a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from multiaddr import Multiaddr

from zoo.node.logs import get_logger
from zoo.node.p2p.dht_guard import guarded
from zoo.node.p2p.limits import GRACE_S
from zoo.node.p2p.relay import Relaying
from zoo.node.p2p.sockets import KEEPALIVE_IDLE_S, USER_TIMEOUT_S, UnacknowledgedGiveUp
from zoo.node.p2p.streams import close_stream, read_some
from zoo.node.p2p.tunnel import GRPC_PROTOCOL, Tunnels
from zoo.registry import untrusted_json
from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic

log = get_logger(__name__)

CONTENT_PROTOCOL = "/zoo/library-bytes/1.0.0"
GOSSIP_PROTOCOL = "/meshsub/1.0.0"
MAX_REQUEST_LINE = 1024
MAX_SERVING = 4  # content requests served at once; more are answered "busy" (each may hold 64 MiB)
CALL_TIMEOUT_S = 10.0  # publish, list, disconnect
DIAL_TIMEOUT_S = 15.0  # a content request's dial, when the peer is not connected yet

Validator = Callable[[str, str, str, bytes], bool]  # (topic, publisher, forwarder, data) -> accept
MessageSink = Callable[[str, str, bytes], None]  # (topic, publisher peer id, data)
ContentLookup = Callable[[str], bytes | None]  # cid -> bytes this node holds, or None


class P2PError(ZooError):
    """A peer operation failed (unreachable, refused, timed out, protocol violation)."""


class ContentRefused(P2PError):
    """The peer answered, but not with content we can take (it lacks it, or announced too much)."""


class ContentBusy(ContentRefused):
    """The peer holds its limit of content requests at once (MAX_SERVING): ask again shortly."""


def load_identity(path: Path) -> bytes:
    """The node's 32-byte ed25519 seed, created (mode 0600) on first use; the peer id derives from it."""
    try:
        seed = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        seed = os.urandom(32)
        write_atomic(path, seed, mode=0o600)  # a crash leaves no file or the whole key, never half
        return seed
    if len(seed) != 32:
        raise ValueError(f"{path} holds {len(seed)} bytes, not a 32-byte identity seed; move it aside")
    return seed


def peer_id_of(seed: bytes) -> str:
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    return ID.from_pubkey(create_new_key_pair(seed).public_key).to_base58()


async def _read_line(stream: Any, limit: int) -> bytes:
    buf = b""
    while b"\n" not in buf:
        if len(buf) > limit:
            raise P2PError(f"no line within {limit} bytes")
        chunk = await read_some(stream, limit)
        if not chunk:
            raise P2PError("stream closed before a full line")
        buf += chunk
    return buf


class P2PHost:
    def __init__(
        self,
        seed: bytes,
        listen: str,
        topics: list[str],
        *,
        validator: Validator,
        on_message: MessageSink,
        content: ContentLookup,
        max_content_bytes: int,
        relaying: Relaying | None = None,
        grpc_target: Callable[[], str | None] | None = None,
        user_timeout_s: float = USER_TIMEOUT_S,
        keepalive_idle_s: int = KEEPALIVE_IDLE_S,
        target_peers: int = 8,
        max_peers: int = 0,
        on_offence: Callable[[str, str], Any] = lambda _peer, _offence: None,
    ) -> None:
        self.seed = seed
        self.on_offence = on_offence  # (peer id, offence): the peer book's penalise, on the trio thread
        self.target_peers, self.max_peers = target_peers, max_peers
        self.sockets = UnacknowledgedGiveUp(user_timeout_s, keepalive_idle_s)
        self.listen = listen
        self.topics = topics
        self.validator = validator
        self.on_message = on_message
        self.content = content
        self.max_content_bytes = max_content_bytes
        self.peer_id = peer_id_of(seed)
        self.relaying = relaying or Relaying(hop=None, relays=[])
        self.grpc_target = grpc_target
        self._listen_addrs: list[str] = []
        self._tunnels: Tunnels | None = None
        self._nursery: trio.Nursery | None = None
        self._token: Any = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._host: Any = None
        self._pubsub: Any = None
        self._serving: Any = None
        self._dht: Any = None
        self._busy: Counter[str] = Counter()  # peer -> content exchanges in flight (trio thread only)

    # -- lifecycle (any non-trio thread) --------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="p2p", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise P2PError(f"the libp2p host did not start within {timeout:.0f} s")
        if self._error is not None:
            raise P2PError(f"the libp2p host failed to start: {self._error}") from self._error

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        stop = self._stop
        if stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join(timeout)

    @property
    def addrs(self) -> list[str]:
        """Where peers reach this node: its addresses through relays first (a node that has relays is
        behind NAT, and its listen addresses are private), then its listen addresses."""
        return self.relaying.circuit_addrs(self.peer_id) + self._listen_addrs

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # a start-up failure is reported by start(); later ones end the host
            self._error = e
            log.error("libp2p host stopped", error=f"{type(e).__name__}: {e}")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        from libp2p import new_host
        from libp2p.crypto.ed25519 import create_new_key_pair
        from libp2p.kad_dht.common import PROTOCOL_ID as DHT_PROTOCOL
        from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
        from libp2p.network.config import ConnectionConfig
        from libp2p.pubsub.gossipsub import GossipSub
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.tools.anyio_service import background_trio_service

        _route_libp2p_logs()
        # Only this trio run's sockets (node/p2p/sockets.py).
        trio.socket.set_custom_socket_factory(self.sockets)
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._serving = trio.Semaphore(MAX_SERVING)
        # py-libp2p's connection manager (go-libp2p's watermarks): its auto-connector dials the peerstore's
        # peers up to half-way between the low and high marks (at its defaults, 100 and 300, every peer it
        # knows). With a limit (max_peers) the marks make that exactly target_peers. Its pruner never closes
        # a connection with an open stream, and gossipsub holds one on every connection, so the component
        # closes the excess itself (p2p/limits.py).
        limits = None
        if self.max_peers:
            low = max(0, 2 * self.target_peers - self.max_peers)
            limits = ConnectionConfig(
                min_connections=low // 2,
                low_watermark=low,
                high_watermark=max(low, 2 * self.target_peers - low),
                max_connections=max(64, 4 * self.max_peers),
                grace_period=GRACE_S,
            )
        host = new_host(key_pair=create_new_key_pair(self.seed), connection_config=limits)
        # The router's own spam filter drops floods silently and unattributed; the validator's per-peer
        # limits (counted in metrics, scored, configurable) take its place.
        gossip = GossipSub(
            protocols=[GOSSIP_PROTOCOL],
            degree=6,
            degree_low=4,
            degree_high=12,
            spam_protection_enabled=False,
        )
        pubsub = Pubsub(host, gossip, max_inbound_rpc_size=64 * 1024)
        # Random walks are this node's to schedule (the component's discovery loop), not the library's
        # two-minute timer; values are off: a peer cannot make this node store anything but provider records.
        dht = KadDHT(host, DHTMode.SERVER, enable_random_walk=False, enable_values=False)
        host.set_stream_handler(DHT_PROTOCOL, guarded(dht.handle_stream, self.on_offence))
        relay = self.relaying.attach(host)
        async with host.run(listen_addrs=[Multiaddr(self.listen)]), trio.open_nursery() as nursery:
            host.set_stream_handler(CONTENT_PROTOCOL, self._serve_content)
            self._tunnels = Tunnels(host, self.grpc_target or (lambda: None))
            if self.grpc_target is not None:
                host.set_stream_handler(GRPC_PROTOCOL, self._tunnels.serve)
            async with (
                background_trio_service(pubsub),
                background_trio_service(gossip),
                background_trio_service(dht),
                background_trio_service(relay) if relay is not None else contextlib.nullcontext(),
            ):
                await pubsub.wait_until_ready()
                for topic in self.topics:
                    pubsub.set_topic_validator(topic, self._validator_for(topic), False)
                    subscription = await pubsub.subscribe(topic)
                    nursery.start_soon(self._pump, topic, subscription)
                self._host, self._pubsub, self._dht, self._nursery = host, pubsub, dht, nursery
                self._listen_addrs = [str(a) for a in host.get_addrs()]
                if self.relaying.relays:
                    nursery.start_soon(self.relaying.keep_reservations, host, self._dial, nursery)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def _validator_for(self, topic: str) -> Callable[[Any, Any], bool]:
        def validate(forwarder: Any, msg: Any) -> bool:
            try:
                return self.validator(topic, _peer_str(msg.from_id), forwarder.to_base58(), bytes(msg.data))
            except Exception:
                log.exception("p2p validator failed; dropping the message", topic=topic)
                return False

        return validate

    async def _pump(self, topic: str, subscription: Any) -> None:
        while True:
            msg = await subscription.get()
            sender = _peer_str(msg.from_id)
            if sender == self.peer_id:
                continue
            try:
                self.on_message(topic, sender, bytes(msg.data))
            except Exception:
                log.exception("p2p message handler failed", topic=topic)

    # -- calls from other threads ---------------------------------------------------------------------

    def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        if not self.running or self._token is None:
            raise P2PError("the libp2p host is not running")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except (trio.RunFinishedError, trio.Cancelled):
            # Cancelled is a BaseException: the host stopped (or crashed) while this call was running.
            raise P2PError("the libp2p host stopped") from None

    def _guarded(self, fn: Callable[[], Awaitable[Any]], what: str, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Run `fn` on the host's loop within `timeout`; every failure a P2PError saying `what` failed."""

        async def call() -> Any:
            with trio.fail_after(timeout):
                return await fn()

        try:
            return self._call(call)
        except trio.TooSlowError:
            raise P2PError(f"{what} timed out after {timeout:.0f} s") from None
        except P2PError:
            raise
        except Exception as e:
            raise P2PError(f"{what} failed: {type(e).__name__}: {e}") from None

    def publish(self, topic: str, data: bytes) -> None:
        self._guarded(lambda: self._pubsub.publish(topic, data), f"publishing on {topic}")

    def connect(self, addr: str, timeout: float = 10.0) -> str:
        """Dial a /p2p/ multiaddr (a /p2p-circuit one through its relay); returns the peer id."""
        peer = self._guarded(lambda: self._dial(addr), f"connecting to {addr}", timeout)
        return peer.to_base58()

    async def _dial(self, addr: str) -> Any:
        from libp2p.peer.peerinfo import info_from_p2p_addr

        try:
            info = info_from_p2p_addr(Multiaddr(addr))
        except Exception as e:
            raise P2PError(f"not a dialable /p2p/ multiaddr: {addr!r} ({e})") from None
        if "/p2p-circuit" in addr:  # the swarm does not dial circuit addresses: the relay transport does
            await self.relaying.dial(addr)
            return info.peer_id
        # py-libp2p's swarm refuses, for 60 s, every dial to a peer whose addresses all failed once (its
        # "negative cache"): a node that started before its bootstrap peer could not join for a minute,
        # and a healed partition stayed split as long. This node's dialler keeps its own backoff per
        # address; a dial it asks for is made.
        cache = getattr(getattr(self._host, "get_network", lambda: None)(), "_negative_peer_cache", None)
        if hasattr(cache, "evict"):
            cache.evict(str(info.peer_id))
        await self._host.connect(info)
        return info.peer_id

    def tunnel(self, peer_id: str, addrs: list[str]) -> str:
        """A loopback HOST:PORT whose connections reach `peer_id`'s gRPC server over libp2p (tunnel.py);
        the peer is dialled at `addrs` (relayed ones first) when a connection is opened and it is not
        connected."""

        async def connect(addrs: list[str]) -> None:
            with trio.move_on_after(15):  # one deadline for them all; then new_stream tries the peerstore
                for addr in addrs[:4]:
                    with contextlib.suppress(Exception), trio.move_on_after(8):
                        await self._dial(addr)
                        return

        async def open_() -> str:
            assert self._tunnels is not None and self._nursery is not None
            return await self._tunnels.open(peer_id, addrs, self._nursery, connect)

        return self._guarded(open_, f"opening a gRPC tunnel to {peer_id}")

    def connected(self) -> list[str]:
        async def peers() -> list[str]:
            return [p.to_base58() for p in self._host.get_connected_peers()]

        return self._guarded(peers, "listing connected peers")

    def mesh_peers(self, topic: str) -> list[str]:
        """Peers that have told us they subscribe to `topic` (gossip reaches them)."""

        async def peers() -> list[str]:
            return [p.to_base58() for p in self._pubsub.peer_topics.get(topic, set())]

        return self._guarded(peers, f"listing peers on {topic}")

    def gossip_mesh(self) -> list[str]:
        """Peers in gossipsub's mesh of any of this node's topics: the ones full messages flow through."""

        async def peers() -> list[str]:
            mesh = self._pubsub.router.mesh
            return sorted({p.to_base58() for topic in self.topics for p in mesh.get(topic, ())})

        return self._guarded(peers, "listing the gossip mesh")

    def discover(self, timeout: float = 20.0) -> int:
        """One Kademlia walk: look up this node's own id and a random one, starting from the peers it is
        connected to (the routing table takes them first). Returns the routing table's size after."""

        async def walk() -> int:
            for peer in self._host.get_connected_peers():
                if not self._dht.routing_table.peer_in_table(peer):
                    await self._dht.add_peer(peer)
            targets = [self._host.get_id().to_bytes(), os.urandom(32)]
            for target in targets:
                with trio.move_on_after(timeout / len(targets)):
                    await self._dht.peer_routing.find_closest_peers_network(target)
            return self._dht.routing_table.size()

        return self._guarded(walk, "a DHT walk", timeout + 5.0)

    def routing_peers(self) -> list[tuple[str, list[str]]]:
        """The DHT routing table: (peer id, its known addresses), for the component to dial."""

        from libp2p.peer.peerstore import PeerStoreError

        async def peers() -> list[tuple[str, list[str]]]:
            store = self._host.get_peerstore()
            out = []
            for peer in self._dht.routing_table.get_peer_ids():
                try:
                    addrs = store.addrs(peer)
                except PeerStoreError:  # unknown, or its addresses expired
                    addrs = []
                out.append((peer.to_base58(), _dialable(peer, addrs)))
            return out

        return self._guarded(peers, "listing the DHT routing table")

    def provide(self, cid: str, timeout: float = 20.0) -> bool:
        """Tell the DHT this node holds `cid` (provider records at the peers closest to it)."""
        return bool(self._guarded(lambda: self._dht.provide(cid), f"providing {cid}", timeout))

    def find_providers(self, cid: str, timeout: float = 10.0) -> list[tuple[str, list[str]]]:
        """Peers the DHT says hold `cid` (unverified: their bytes are checked like anyone's)."""

        async def find() -> list[tuple[str, list[str]]]:
            found = await self._dht.find_providers(cid, 20)
            return [(p.peer_id.to_base58(), _dialable(p.peer_id, p.addrs)) for p in found]

        return self._guarded(find, f"finding holders of {cid}", timeout)

    def disconnect(self, peer_id: str) -> None:
        from libp2p.peer.id import ID

        self._guarded(lambda: self._host.disconnect(ID.from_base58(peer_id)), f"disconnecting {peer_id}")

    def fetch(self, peer_id: str, cid: str, max_bytes: int, timeout: float) -> bytes:
        """The bytes `peer_id` holds for `cid`, unverified (the caller checks them against the CID)."""
        from libp2p.peer.id import ID

        async def exchange() -> bytes:
            # The whole exchange has the fetch's deadline: a slow peer is the caller's to hedge (it asks
            # another one meanwhile, content.first_served), not a reason to give up on this one. A 5 s
            # budget for the stream open and the answer header failed every holder at N = 24 on two cores,
            # where a stream open alone took longer, and a node restarted under churn never caught up. A
            # connection cut without a FIN no longer looks open for long: the kernel aborts it
            # (sockets.USER_TIMEOUT_S). A peer not connected yet is dialled first, on a budget of its own.
            peer = ID.from_base58(peer_id)
            self._busy[peer_id] += 1  # the component does not close this connection meanwhile
            try:
                if peer not in self._host.get_connected_peers():
                    await self._dial_known(peer, min(timeout, DIAL_TIMEOUT_S))
                stream = await self._host.new_stream(peer, [CONTENT_PROTOCOL])
                return await read_answer(stream)
            finally:
                self._busy[peer_id] -= 1

        async def read_answer(stream: Any) -> bytes:
            try:
                await stream.write(json.dumps({"cid": cid}).encode() + b"\n")
                head, _, rest = (await _read_line(stream, MAX_REQUEST_LINE)).partition(b"\n")
                try:
                    header = untrusted_json.loads(head)
                    size = header.get("size") if isinstance(header, dict) else None
                except ValueError:
                    raise P2PError("the peer's answer header is not JSON") from None
                if size is None:
                    error = str(header.get("error") if isinstance(header, dict) else None)[:200]
                    refused = ContentBusy if error.startswith("busy:") else ContentRefused
                    raise refused(f"the peer refused: {error}")
                if not isinstance(size, int) or size < 0:
                    raise P2PError(f"the peer announced a bad size {size!r}")
                if size > max_bytes:
                    raise ContentRefused(f"the peer announced {size} bytes, over the limit {max_bytes}")
                chunks, got = [rest], len(rest)
                while got < size:
                    chunk = await read_some(stream, min(65536, size - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                data = b"".join(chunks)
                if len(data) != size:
                    raise P2PError(f"the peer sent {len(data)} bytes, announced {size}")
                return data
            finally:
                await close_stream(stream)

        return self._guarded(exchange, f"fetching {cid} from {peer_id}", timeout)

    async def _dial_known(self, peer: Any, timeout: float) -> None:
        """Connect to `peer` at the addresses the peerstore holds (what new_stream would dial)."""
        from libp2p.peer.peerinfo import PeerInfo
        from libp2p.peer.peerstore import PeerStoreError

        try:
            addrs = self._host.get_peerstore().addrs(peer)
        except PeerStoreError:
            return  # no address known: new_stream says so
        with trio.move_on_after(timeout):
            try:
                await self._host.connect(PeerInfo(peer, addrs))
            except Exception as e:  # the transport's many errors: the stream open below reports the peer
                log.debug("p2p dial for content failed", peer=peer.to_base58(), error=str(e))

    def busy_peers(self) -> list[str]:
        """Peers with a content exchange in flight, either way (a connection not to close under it)."""

        async def peers() -> list[str]:
            return [p for p, n in self._busy.items() if n > 0]

        return self._guarded(peers, "listing busy peers")

    # -- the content protocol's server side (trio thread) ---------------------------------------------

    async def _serve_content(self, stream: Any) -> None:
        peer_id = stream.muxed_conn.peer_id.to_base58() if hasattr(stream, "muxed_conn") else ""
        self._busy[peer_id] += 1
        try:
            try:
                self._serving.acquire_nowait()
            except trio.WouldBlock:
                await stream.write(b'{"error": "busy: too many content requests at once; retry"}\n')
                return
            try:
                with trio.fail_after(30):
                    await self._serve_one(stream)
            finally:
                self._serving.release()
        except Exception as e:
            log.info("p2p content request failed", error=f"{type(e).__name__}: {e}")
        finally:
            self._busy[peer_id] -= 1
            await close_stream(stream)

    async def _serve_one(self, stream: Any) -> None:
        line, _, _ = (await _read_line(stream, MAX_REQUEST_LINE)).partition(b"\n")
        try:
            request = untrusted_json.loads(line)
            cid = request["cid"]
            if not isinstance(cid, str) or len(cid) > 256:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            await stream.write(b'{"error": "bad request: expected {\\"cid\\": CID}"}\n')
            return
        data = await trio.to_thread.run_sync(self.content, cid)
        if data is None or len(data) > self.max_content_bytes:
            await stream.write(json.dumps({"error": f"no content for {cid}"}).encode() + b"\n")
            return
        await stream.write(json.dumps({"size": len(data)}).encode() + b"\n")
        for start in range(0, len(data), 65536):
            await stream.write(data[start : start + 65536])


def _dialable(peer: Any, addrs: Any) -> list[str]:
    """A peer's addresses as /p2p/ multiaddrs `connect` takes (at most four)."""
    suffix = f"/p2p/{peer.to_base58()}"
    return [a if "/p2p/" in a else a + suffix for a in map(str, addrs)][:4]


def _route_libp2p_logs() -> None:
    """py-libp2p's logger does not propagate, so its warnings reached stderr unformatted (Python's last-resort
    handler): send them through the node's structured log instead. The DHT's per-stream warnings and the
    TCP transport's errors about peers that went away (hundreds a minute while a peer is down) say what
    the component's own "p2p dial failed" and "DHT walk failed" lines already say; they are kept out."""
    import logging

    logging.getLogger("libp2p").propagate = True
    logging.getLogger("libp2p").setLevel(logging.WARNING)
    logging.getLogger("libp2p.network.auto_connector").setLevel(logging.WARNING)  # it sets INFO itself
    logging.getLogger("libp2p.kad_dht").setLevel(logging.ERROR)
    logging.getLogger("libp2p.transport.tcp").setLevel(logging.CRITICAL)


def _peer_str(raw: bytes) -> str:
    from libp2p.peer.id import ID

    return ID(raw).to_base58()
