"""Library bytes from peers, verified like an IPFS fetch, and the fallback from IPFS to peers.

`PeerContent` is a ContentSource (registry.sync) that asks connected peers (those that announced the
CID first, then best score first) for the bytes of a CID, and then the holders the DHT's provider
records name (dialled first: they may be anywhere in the network). Every answer is checked against the
CID before it is returned (the syncer then checks the Merkle root against the chain, as for IPFS); a
peer whose bytes do not match is penalised and the next one is asked. Failing everywhere raises
P2PError, which the library component treats as a transient sync failure (retry later), never as a
verdict on the on-chain version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zoo.node.logs import get_logger
from zoo.node.p2p.host import P2PError, P2PHost
from zoo.node.p2p.peers import PeerBook
from zoo.registry.errors import ContentTooLarge, IntegrityError, ValidationError
from zoo.registry.ipfs import parse_cid, verify_local

log = get_logger(__name__)


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


class PeerContent:
    def __init__(
        self,
        host: Callable[[], P2PHost | None],
        book: PeerBook,
        verify: Callable[[str, bytes], None],
        max_peers: int = 4,
        timeout_s: float = 20.0,
    ) -> None:
        self.host = host
        self.book = book
        self.verify = verify
        self.max_peers = max_peers
        self.timeout_s = timeout_s

    def fetch_verified(self, cid: str, *, timeout: float | None = None, max_size: int = 64 << 20) -> bytes:
        parse_cid(cid)  # a CID that does not parse is the chain's problem, not a peer's (ValidationError)
        host = self.host()
        if host is None or not host.running:
            raise P2PError("the p2p host is not running")
        connected = set(host.connected())
        # Peers that announced this CID first (they hold it), then the rest by score: at N = 16 with the
        # best-scored four asked first, a node without IPFS often asked four that did not have it yet.
        ranked = [p for p in self.book.holders(cid) if p in connected]
        ranked += [
            r.peer_id for r in self.book.records() if r.peer_id in connected and r.peer_id not in ranked
        ]
        candidates = [p for p in ranked + sorted(connected - set(ranked)) if not self.book.banned(p)]
        problems: list[str] = []
        tried = set(candidates[: self.max_peers])
        for peer in candidates[: self.max_peers]:
            data = self._ask(host, peer, cid, max_size, problems)
            if data is not None:
                return data
        try:  # holders beyond the connected peers, as the DHT's provider records name them (unverified)
            providers = host.find_providers(cid, self.timeout_s)
        except P2PError as e:
            providers = []
            problems.append(f"DHT: {e}")
        for peer, addrs in providers:
            if len(tried) >= 2 * self.max_peers:
                break
            if peer in tried or peer == host.peer_id or self.book.banned(peer) or not addrs:
                continue
            tried.add(peer)
            # A holder behind NAT is reached through its relay: the DHT knows only its private address, its
            # capabilities (in the peer book) name the relayed one.
            record = self.book.get(peer)
            relayed = [a for a in (record.addrs if record else []) if "/p2p-circuit/" in a]
            if not self._connect(host, peer, (relayed + addrs)[:3], problems):
                continue
            data = self._ask(host, peer, cid, max_size, problems)
            if data is not None:
                return data
        if not tried:
            raise P2PError(f"no connected peer to ask for {cid}, and the DHT names no holder")
        raise P2PError(f"no peer served verified content for {cid}: " + "; ".join(problems))

    def _connect(self, host: P2PHost, peer: str, addrs: list[str], problems: list[str]) -> bool:
        problem = f"{peer[:16]}… (a DHT provider): no address"
        for addr in addrs:
            try:
                host.connect(addr, 5.0)
                return True
            except P2PError as e:
                problem = f"{peer[:16]}… (a DHT provider): {e}"
        problems.append(problem)
        return False

    def _ask(self, host: P2PHost, peer: str, cid: str, max_size: int, problems: list[str]) -> bytes | None:
        """`peer`'s bytes for `cid` once verified, else None with the reason appended to `problems`."""
        try:
            # p2p.fetch_timeout_s: the caller's timeout is the IPFS one.
            data = host.fetch(peer, cid, max_size, self.timeout_s)
        except P2PError as e:
            problems.append(f"{peer[:16]}…: {e}")
            return None
        try:
            self.verify(cid, data)
        except ValidationError as e:  # a CID this node cannot check: nobody's fault, nothing taken
            raise P2PError(f"cannot check content for {cid}: {e}") from None
        except IntegrityError as e:
            self.book.penalise(peer, "tampered_content")
            problems.append(f"{peer[:16]}…: sent content that fails verification ({e})")
            return None
        self.book.reward(peer)
        log.info("library content fetched from a peer", cid=cid, peer=peer, size=len(data))
        return data


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
