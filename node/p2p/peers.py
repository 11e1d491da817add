"""What a node knows about its peers: addresses, capabilities, score; kept across restarts.

The book is a small JSON file in the data dir, written atomically by `flush` (the component flushes it
every few seconds from a worker thread and at stop; gossip never waits for a disk write), so a restarted
node dials the peers it was connected to, not only its bootstrap list. Scores start at 0, go down for
bad behaviour (a fake announcement, tampered content, a wrong answer, garbage) and up a little for good
content, and a negative score recovers a point every ten minutes; a peer at or below `drop_score` is
banned: its messages are dropped and it is not dialled or asked for content. Capabilities live in
memory only and expire after `ttl_s` without a refresh, so a stopped node stops being a routing target.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zoo.node.logs import get_logger
from zoo.node.p2p.messages import Capabilities
from zoo.registry.fsutil import write_atomic

log = get_logger(__name__)

# How much each kind of behaviour moves a peer's score.
PENALTIES = {
    "bad_hint": -10.0,
    "tampered_content": -20.0,
    "wrong_root": -10.0,
    "wrong_model": -20.0,  # a routed answer whose proof names other weights than advertised, or fails
    "malformed": -2.0,  # not JSON, or over the size limit
    "dht_garbage": -2.0,  # a DHT message the library's handler refused (dht_guard)
}
RECOVERY_PER_S = 1 / 600  # a negative score recovers one point every ten minutes: bans do not last forever
REWARD_GOOD_CONTENT = 1.0
MAX_SCORE = 10.0
MAX_PEERS = 1000  # the book keeps the most recently seen ones
MAX_HOLDERS, MAX_HOLDER_CIDS = 32, 16  # who announced which library CID (content asks them first)


@dataclass
class PeerRecord:
    peer_id: str
    addrs: list[str] = field(default_factory=list)
    first_seen: float = field(default_factory=time.time)
    last_seen: float = 0.0
    score: float = 0.0
    capabilities: dict[str, Any] | None = None
    capabilities_at: float = 0.0
    offences: dict[str, int] = field(default_factory=dict)
    was_connected: bool = False  # only peers this node was connected to are dialled from the book
    penalised_at: float = 0.0


class PeerBook:
    """Thread-safe (the libp2p thread and the asyncio loop both use it) and persisted on every change."""

    def __init__(self, path: Path, ttl_s: float = 30.0, drop_score: float = -25.0) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self.drop_score = drop_score
        self._lock = threading.Lock()
        self._dirty = False
        self._peers: dict[str, PeerRecord] = self._load()
        self._holders: dict[str, list[str]] = {}  # cid -> peers that announced it, latest first

    def _load(self) -> dict[str, PeerRecord]:
        try:
            raw = json.loads(self.path.read_text())
            peers = {p["peer_id"]: PeerRecord(**p) for p in raw["peers"]}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as e:
            # A damaged book costs the known peers, never the start: bootstrap peers are still dialled.
            log.warning("peer book unreadable; starting with an empty one", path=str(self.path), error=str(e))
            return {}
        for record in peers.values():
            record.capabilities, record.capabilities_at = None, 0.0  # capabilities are never stale-trusted
        return peers

    def _save(self) -> None:
        """Mark the book changed (the lock is held); `flush` writes it."""
        self._dirty = True
        if len(self._peers) > MAX_PEERS:
            # Keep the most recently seen; banned peers stay (their ban must not be forgotten).
            keep = sorted(self._peers.values(), key=lambda r: (r.score > self.drop_score, r.last_seen))
            self._peers = {r.peer_id: r for r in keep[-MAX_PEERS:]}

    def flush(self) -> None:
        """Write the book if it changed (blocking: call from a worker thread); capabilities are not kept."""
        with self._lock:
            if not self._dirty:
                return
            fresh = {"capabilities": None, "capabilities_at": 0.0}
            records = [asdict(r) | fresh for r in self._peers.values()]
            self._dirty = False
        write_atomic(self.path, json.dumps({"peers": records}, indent=1).encode(), mode=0o600)

    def _record(self, peer_id: str) -> PeerRecord:
        record = self._peers.get(peer_id)
        if record is None:
            record = self._peers[peer_id] = PeerRecord(peer_id)
        return record

    def seen(self, peer_id: str, addrs: list[str] | None = None, connected: bool = False) -> None:
        with self._lock:
            record = self._record(peer_id)
            record.last_seen = time.time()
            record.was_connected = record.was_connected or connected
            if addrs:  # merged: a DHT entry naming only a NATed peer's private address must not push out
                # the relayed one its capabilities gave
                record.addrs = _ordered([*addrs, *record.addrs])
            self._save()

    def set_capabilities(self, peer_id: str, capabilities: Capabilities) -> None:
        """Live capabilities (memory only) and the addresses they advertise (kept for redialling)."""
        with self._lock:
            record = self._record(peer_id)
            record.capabilities = capabilities.model_dump()
            record.capabilities_at = record.last_seen = time.time()
            if capabilities.addrs and _ordered(capabilities.addrs) != record.addrs:
                record.addrs = _ordered(capabilities.addrs)
                self._save()

    def note_holder(self, peer_id: str, cid: str) -> None:
        """`peer_id` said it holds `cid` (an announcement whose root the chain confirmed); memory only."""
        with self._lock:
            peers = [peer_id, *(p for p in self._holders.pop(cid, []) if p != peer_id)][:MAX_HOLDERS]
            self._holders[cid] = peers
            while len(self._holders) > MAX_HOLDER_CIDS:
                self._holders.pop(next(iter(self._holders)))

    def holders(self, cid: str) -> list[str]:
        """Peers that said they hold `cid`, the latest first (unverified: their bytes are checked)."""
        with self._lock:
            return list(self._holders.get(cid, []))

    def mark_connected(self, peer_ids: list[str]) -> None:
        """Peers seen connected: from now on they are redialled from the book after a restart."""
        with self._lock:
            for peer_id in peer_ids:
                record = self._record(peer_id)
                record.last_seen = time.time()
                if not record.was_connected:
                    record.was_connected = True
                    self._save()

    def penalise(self, peer_id: str, offence: str) -> float:
        """Lower a peer's score for `offence` (a key of PENALTIES); returns the new score."""
        with self._lock:
            record = self._record(peer_id)
            now = time.time()
            record.score = _recovered(record, now) + PENALTIES[offence]
            record.penalised_at = now
            record.offences[offence] = record.offences.get(offence, 0) + 1
            record.last_seen = max(record.last_seen, now)
            if record.score <= self.drop_score:
                record.capabilities, record.capabilities_at = None, 0.0
            self._save()
            score = record.score
        log.warning("peer penalised", peer=peer_id, offence=offence, score=score, banned=self.banned(peer_id))
        return score

    def reward(self, peer_id: str) -> None:
        with self._lock:
            record = self._record(peer_id)
            record.score = min(MAX_SCORE, _recovered(record, time.time()) + REWARD_GOOD_CONTENT)
            record.penalised_at = time.time() if record.score < 0 else record.penalised_at
            self._save()

    def banned(self, peer_id: str) -> bool:
        return self.score(peer_id) <= self.drop_score

    def score(self, peer_id: str) -> float:
        """The peer's score now (a negative one recovers with time)."""
        with self._lock:
            record = self._peers.get(peer_id)
            return _recovered(record, time.time()) if record is not None else 0.0

    def get(self, peer_id: str) -> PeerRecord | None:
        with self._lock:
            record = self._peers.get(peer_id)
            return PeerRecord(**asdict(record)) if record is not None else None

    def records(self) -> list[PeerRecord]:
        """Copies of every record, live capabilities only (expired ones cleared), best score first."""
        now = time.time()
        with self._lock:
            out = [PeerRecord(**asdict(r)) for r in self._peers.values()]
        for r in out:
            r.score = _recovered(r, now)
            if r.capabilities is not None and now - r.capabilities_at > self.ttl_s:
                r.capabilities, r.capabilities_at = None, 0.0
        return sorted(out, key=lambda r: (-r.score, -r.last_seen))

    def capable(self) -> list[tuple[PeerRecord, Capabilities]]:
        """Peers with live capabilities that are not banned, best score first."""
        out = []
        for record in self.records():
            if record.capabilities is not None and record.score > self.drop_score:
                out.append((record, Capabilities.model_validate(record.capabilities)))
        return out

    def dialable(self) -> list[PeerRecord]:
        """Peers this node was connected to, with addresses, not banned: what it redials."""
        return [r for r in self.records() if r.was_connected and r.addrs and r.score > self.drop_score]


def _ordered(addrs: list[str]) -> list[str]:
    """At most 8 distinct addresses, relayed ones first (a peer that has them is behind NAT: its others are
    private), otherwise newest first."""
    return sorted(dict.fromkeys(addrs), key=lambda a: "/p2p-circuit/" not in a)[:8]


def _recovered(record: PeerRecord, now: float) -> float:
    if record.score >= 0:
        return record.score
    return min(0.0, record.score + max(0.0, now - record.penalised_at) * RECOVERY_PER_S)


class RateLimiter:
    """Per-peer token buckets: `rate` messages a second on average, bursts up to `burst`.

    Written by hand: a dozen lines, and the only per-key limiter libraries are web-framework middleware.
    """

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._pruned = 0.0
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._buckets) > 10 * MAX_PEERS and now - self._pruned > 10:
                # Forget idle keys so a churn of ids cannot grow this (at most every 10 s).
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
                self._pruned = now
            return allowed
