"""What a node knows about its peers: addresses, capabilities, score; kept across restarts.

The book is a small JSON file in the data dir (written atomically), so a restarted node dials the peers
it knew, not only its bootstrap list. Scores start at 0, go down for bad behaviour (a fake announcement,
tampered content, a flood) and up a little for good content; a peer at or below `drop_score` is banned:
its messages are dropped and it is not dialled or asked for content again. Capabilities expire after
`ttl_s` without a refresh, so a stopped node stops being a routing target.
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
PENALTIES = {"bad_hint": -10.0, "tampered_content": -20.0, "rate_limited": -1.0, "malformed": -2.0}
REWARD_GOOD_CONTENT = 1.0
MAX_SCORE = 10.0
MAX_PEERS = 1000  # the book keeps the most recently seen ones


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


class PeerBook:
    """Thread-safe (the libp2p thread and the asyncio loop both use it) and persisted on every change."""

    def __init__(self, path: Path, ttl_s: float = 30.0, drop_score: float = -25.0) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self.drop_score = drop_score
        self._lock = threading.Lock()
        self._peers: dict[str, PeerRecord] = self._load()

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
        records = sorted(self._peers.values(), key=lambda r: r.last_seen, reverse=True)[:MAX_PEERS]
        self._peers = {r.peer_id: r for r in records}
        data = {"peers": [asdict(r) for r in records]}
        write_atomic(self.path, json.dumps(data, indent=1).encode(), mode=0o600)

    def _record(self, peer_id: str) -> PeerRecord:
        record = self._peers.get(peer_id)
        if record is None:
            record = self._peers[peer_id] = PeerRecord(peer_id)
        return record

    def seen(self, peer_id: str, addrs: list[str] | None = None) -> None:
        with self._lock:
            record = self._record(peer_id)
            record.last_seen = time.time()
            if addrs:
                record.addrs = sorted(set(addrs))[:8]
            self._save()

    def set_capabilities(self, peer_id: str, capabilities: Capabilities) -> None:
        with self._lock:
            record = self._record(peer_id)
            record.capabilities = capabilities.model_dump()
            record.capabilities_at = record.last_seen = time.time()
            self._save()

    def forget_capabilities(self, peer_id: str) -> None:
        with self._lock:
            record = self._peers.get(peer_id)
            if record is not None and record.capabilities is not None:
                record.capabilities, record.capabilities_at = None, 0.0
                self._save()

    def penalise(self, peer_id: str, offence: str) -> float:
        """Lower a peer's score for `offence` (a key of PENALTIES); returns the new score."""
        with self._lock:
            record = self._record(peer_id)
            record.score = record.score + PENALTIES[offence]
            record.offences[offence] = record.offences.get(offence, 0) + 1
            if record.score <= self.drop_score:
                record.capabilities, record.capabilities_at = None, 0.0
            self._save()
            score = record.score
        log.warning("peer penalised", peer=peer_id, offence=offence, score=score, banned=self.banned(peer_id))
        return score

    def reward(self, peer_id: str) -> None:
        with self._lock:
            record = self._record(peer_id)
            record.score = min(MAX_SCORE, record.score + REWARD_GOOD_CONTENT)
            self._save()

    def banned(self, peer_id: str) -> bool:
        with self._lock:
            record = self._peers.get(peer_id)
            return record is not None and record.score <= self.drop_score

    def score(self, peer_id: str) -> float:
        with self._lock:
            record = self._peers.get(peer_id)
            return record.score if record is not None else 0.0

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
        return [r for r in self.records() if r.addrs and r.score > self.drop_score]


class RateLimiter:
    """Per-peer token buckets: `rate` messages a second on average, bursts up to `burst`.

    Written by hand: a dozen lines, and the only per-key limiter libraries are web-framework middleware.
    """

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._buckets) > 10 * MAX_PEERS:  # forget idle keys so a churn of ids cannot grow this
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
            return allowed
