"""Library bytes from peers, verified like an IPFS fetch, and the fallback from IPFS to peers.

`PeerContent` is a ContentSource (registry.sync) that asks connected peers (those that announced the
CID first, then best score first) for the bytes of a CID, and then holders anywhere in the network (dialled
first): those the DHT's provider records name, and any peer that announces the CID while it looks. Every
answer is checked against the CID before it is returned (the syncer then checks the Merkle root against
the chain, as for IPFS); a peer whose bytes do not match is penalised and the next one is asked. Failing
everywhere raises P2PError, which the library component treats as a transient sync failure (retry later),
never as a verdict on the on-chain version.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from zoo.node.logs import get_logger
from zoo.node.p2p.host import ContentBusy, P2PError, P2PHost
from zoo.node.p2p.peers import PeerBook
from zoo.registry.errors import ContentTooLarge, IntegrityError, ValidationError
from zoo.registry.ipfs import parse_cid, verify_local

log = get_logger(__name__)
T = TypeVar("T")
Holders = list[tuple[str, list[str]]]  # peer ids and their multiaddrs, as the DHT names them


def content_verifier(ipfs: Any = None) -> Callable[[str, bytes], None]:
    """Checks peer bytes against their CID: locally for raw blocks and CIDv1 files (what the registry's
    publishers produce); other CIDs (CIDv0) need the IPFS daemon's hashing, so without one such content
    is not taken from peers (P2PError, not a penalty: the peer did nothing wrong)."""

    def verify(cid: str, data: bytes) -> None:
        try:
            verify_local(cid, data)
        except ValidationError:
            if ipfs is None:
                raise P2PError(
                    f"{cid} is a CID only an IPFS daemon can check, and this node has none configured "
                    "(ipfs.api_url), so it does not take that content from peers"
                ) from None
            ipfs.verify(cid, data)

    return verify


# How long a fetch that found no holder among its connected peers keeps listening for one to announce the
# CID (a node with IPFS that finds the version on its next chain poll, the default 2 s): a node without IPFS
# whose own poll found the version first otherwise failed its sync, and at N = 8 that failure, after a DHT
# lookup saying nobody held it yet, was most of the slowest node's 2.4 s (docs/network.md).
HOLDER_WAIT_S = 2.0
BUSY_RETRIES = 10  # times a peer that answered "busy" is asked again, 0.1 s apart at least
# A peer that has not served within HEDGE_S is joined by the next one (a hedged request), instead of being
# given up on: at N = 24 on two cores a stream open alone took longer than the 5 s that used to skip a
# peer, so every holder was skipped. Each ask keeps the fetch's whole deadline; the first verified answer
# wins. Hedging by hand (threads over the host's blocking calls): no library here does it for libp2p.
HEDGE_S = 2.0


class PeerContent:
    def __init__(
        self,
        host: Callable[[], P2PHost | None],
        book: PeerBook,
        verify: Callable[[str, bytes], None],
        max_peers: int = 4,
        timeout_s: float = 20.0,
        holder_wait_s: float = HOLDER_WAIT_S,
        hedge_s: float = HEDGE_S,
    ) -> None:
        self.host = host
        self.book = book
        self.verify = verify
        self.max_peers = max_peers
        self.timeout_s = timeout_s
        self.holder_wait_s = holder_wait_s
        self.hedge_s = hedge_s

    def fetch_verified(self, cid: str, *, timeout: float | None = None, max_size: int = 64 << 20) -> bytes:
        parse_cid(cid)  # a CID that does not parse is the chain's problem, not a peer's (ValidationError)
        host = self.host()
        if host is None or not host.running:
            raise P2PError("the p2p host is not running")
        fetch = _Fetch(self, host, cid, max_size)
        connected = set(host.connected())
        # Peers that announced this CID first (they hold it), then the rest by score: at N = 16 with the
        # best-scored four asked first, a node without IPFS often asked four that did not have it yet.
        holders = self.book.holders(cid)
        ranked = [p for p in holders if p in connected]
        ranked += [
            r.peer_id for r in self.book.records() if r.peer_id in connected and r.peer_id not in ranked
        ]
        candidates = [p for p in ranked + sorted(connected - set(ranked)) if not self.book.banned(p)]
        if (data := first_served(fetch.ask, candidates[: self.max_peers], self.hedge_s)) is not None:
            return data
        # A peer asked before it had the version (it said "no content") is asked again once it announces it.
        fetch.asked_holders = fetch.asked.intersection(holders)
        if (data := self._beyond_connected(fetch)) is not None:
            return data
        if not fetch.asked:
            raise P2PError(f"no connected peer to ask for {cid}, and the DHT names no holder")
        problems = "; ".join(dict.fromkeys(fetch.problems))  # a peer asked again says the same once
        raise P2PError(f"no peer served verified content for {cid}: {problems}")

    def _beyond_connected(self, fetch: _Fetch) -> bytes | None:
        """Holders beyond the connected peers: those the DHT's provider records name (anywhere in the
        network), and, while the lookup runs and for holder_wait_s, any peer that announces the CID meanwhile
        (asked as soon as it is heard; the announcement's root was checked against the chain). Peers that
        answered "busy" are asked again meanwhile: at N = 24, twelve nodes without IPFS asked the one node
        that had announced a version at the same moment, and it serves MAX_SERVING at a time."""
        lookup = _in_background(fetch.host.find_providers, fetch.cid, self.timeout_s)
        listen_until = time.monotonic() + self.holder_wait_s
        deadline = time.monotonic() + self.timeout_s
        providers_asked = False
        while True:
            announced = [p for p in self.book.holders(fetch.cid) if p not in fetch.asked_holders]
            announced = [p for p in announced if not self.book.banned(p)]
            fetch.asked_holders.update(announced)
            if (data := first_served(fetch.ask, announced + fetch.busy_to_retry(), self.hedge_s)) is not None:
                return data
            if not providers_asked and lookup.done():
                providers_asked = True
                found = _providers(lookup, fetch.problems)
                fresh = [(p, a) for p, a in found if a and p not in fetch.asked and not self.book.banned(p)]
                fresh = fresh[: max(0, 2 * self.max_peers - len(fetch.asked))]
                if (data := first_served(lambda h: fetch.ask(*h), fresh, self.hedge_s)) is not None:
                    return data
            now = time.monotonic()
            if providers_asked and ((now >= listen_until and not fetch.busy) or now >= deadline):
                return None
            time.sleep(0.1)


class _Fetch:
    """One fetch: the CID, whom it asked and what they answered."""

    def __init__(self, source: PeerContent, host: P2PHost, cid: str, max_size: int) -> None:
        self.source, self.host, self.cid, self.max_size = source, host, cid, max_size
        self.problems: list[str] = []
        self.asked: set[str] = set()
        self.asked_holders: set[str] = set()  # asked since they announced the CID
        self.busy: set[str] = set()  # answered "busy" (serving their limit at once): asked again
        self.tries: dict[str, int] = {}

    def busy_to_retry(self) -> list[str]:
        peers, self.busy = sorted(self.busy), set()
        for peer in peers:
            self.tries[peer] = self.tries.get(peer, 0) + 1
        return [p for p in peers if self.tries[p] <= BUSY_RETRIES]

    def ask(self, peer: str, addrs: Sequence[str] = ()) -> bytes | None:
        """`peer`'s bytes for the CID once verified, else None with the reason in `problems`. A peer not
        connected is dialled first, one behind NAT through its relay (the DHT knows only its private
        address; its capabilities, in the peer book, name the relayed one)."""
        if peer == self.host.peer_id:
            return None
        self.asked.add(peer)
        if peer not in self.host.connected():
            record = self.source.book.get(peer)
            known = record.addrs if record else []
            relayed = [a for a in known if "/p2p-circuit/" in a]
            others = [a for a in [*addrs, *known] if a not in relayed]
            if not self._connect(peer, list(dict.fromkeys(relayed + others))[:3]):
                return None
        started = time.monotonic()
        try:
            # p2p.fetch_timeout_s: the caller's timeout is the IPFS one.
            data = self.host.fetch(peer, self.cid, self.max_size, self.source.timeout_s)
        except P2PError as e:
            if isinstance(e, ContentBusy):
                self.busy.add(peer)
            self.problems.append(f"{peer[:16]}…: {e}")
            seconds = round(time.monotonic() - started, 3)
            log.info(
                "library content not served by a peer", cid=self.cid, peer=peer, error=str(e), seconds=seconds
            )
            return None
        try:
            self.source.verify(self.cid, data)
        except ValidationError as e:  # a CID this node cannot check: nobody's fault, nothing taken
            raise P2PError(f"cannot check content for {self.cid}: {e}") from None
        except IntegrityError as e:
            self.source.book.penalise(peer, "tampered_content")
            self.problems.append(f"{peer[:16]}…: sent content that fails verification ({e})")
            return None
        self.source.book.reward(peer)
        seconds = round(time.monotonic() - started, 3)
        log.info(
            "library content fetched from a peer", cid=self.cid, peer=peer, size=len(data), seconds=seconds
        )
        return data

    def _connect(self, peer: str, addrs: list[str]) -> bool:
        problem = f"{peer[:16]}… (a holder not connected): no address"
        for addr in addrs:
            try:
                self.host.connect(addr, 5.0)
                return True
            except P2PError as e:
                problem = f"{peer[:16]}… (a holder not connected): {e}"
        self.problems.append(problem)
        return False


def first_served(ask: Callable[[T], bytes | None], peers: Sequence[T], hedge_s: float) -> bytes | None:
    """The first verified answer of `ask` over `peers`, asked one at a time, the next one as soon as one
    fails or after `hedge_s` without an answer (so several slow peers run at once). None when all fail.
    Asks still running when one answers end on their own deadline; what they bring is dropped."""
    done: queue.SimpleQueue[tuple[bytes | None, BaseException | None]] = queue.SimpleQueue()
    waiting, running = iter(peers), 0

    def one(peer: T) -> None:
        try:
            done.put((ask(peer), None))
        except BaseException as e:  # handed to the caller's thread, raised there
            done.put((None, e))

    def start_next() -> None:
        nonlocal running
        if (peer := next(waiting, None)) is not None:
            threading.Thread(target=one, args=(peer,), name="zoo-p2p-fetch", daemon=True).start()
            running += 1

    start_next()
    while running:
        try:
            data, error = done.get(timeout=hedge_s)
        except queue.Empty:
            start_next()
            continue
        running -= 1
        if error is not None:
            raise error
        if data is not None:
            return data
        start_next()
    return None


class FirstThatServes:
    """Ask each content source in turn (IPFS, then peers); the first verified answer wins.

    Only transport failures move on to the next source: content that fails verification at IPFS is
    the chain's content and is refused as it always was.
    """

    def __init__(self, sources: Sequence[Any]) -> None:
        self.sources = list(sources)

    def fetch_verified(self, cid: str, *, timeout: float | None = None, max_size: int = 64 << 20) -> bytes:
        errors = []
        for source in self.sources:
            try:
                return source.fetch_verified(cid, timeout=timeout, max_size=max_size)
            except (IntegrityError, ValidationError, ContentTooLarge):
                raise
            except Exception as e:
                errors.append(f"{type(source).__name__}: {type(e).__name__}: {e}")
        raise P2PError(f"no source served {cid}: " + " | ".join(errors))


def _in_background(fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn(*args)` on a daemon thread (a DHT lookup that outlives the fetch ends on its own deadline, and
    never holds up the process's exit as an executor's worker would)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=run, name="zoo-p2p-providers", daemon=True).start()
    return future


def _providers(lookup: Future[Holders], problems: list[str]) -> Holders:
    try:
        return lookup.result()
    except P2PError as e:
        problems.append(f"DHT: {e}")
        return []
