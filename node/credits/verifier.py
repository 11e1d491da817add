"""The node's check of signed requests: signature, freshness and single use (see signing.py).

A signature is accepted once: its (signer, nonce) is remembered until its timestamp leaves the accepted
window, so a replay inside the window is refused and one after it is stale. What is remembered is lost
on restart, so a request signed before this node started is refused as stale too (a client signs
again; a clock behind the node's by up to max_skew_s waits that long after a restart).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from eth_utils import to_checksum_address

from zoo.node.credits.signing import SignatureError, body_digest, parse_header, recover_signer, request_digest
from zoo.registry.spend import SpendAuthorization


class TooManyNonces(SignatureError):
    """The node remembers as many recent signed requests as it may (credits.max_remembered_nonces)."""


@dataclass(frozen=True)
class Client:
    """Who sent a request: the signer's checksum address, or anonymous ('' ), and the signer's consent to
    be charged credits here this epoch, if it sent one (consent.py)."""

    address: str = ""
    spend: SpendAuthorization | None = None

    @property
    def anonymous(self) -> bool:
        return not self.address


ANONYMOUS = Client()


class RequestVerifier:
    """Checks zoo-signature headers addressed to `node_address` (thread-safe)."""

    def __init__(
        self,
        node_address: str,
        *,
        max_skew_s: float = 60.0,
        not_before: float | None = None,
        max_remembered: int = 200_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_address = to_checksum_address(node_address)
        self._node = bytes.fromhex(self.node_address[2:])
        self.max_skew_s = max_skew_s
        self.not_before = clock() if not_before is None else not_before
        self.max_remembered = max_remembered
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: set[tuple[str, int]] = set()
        self._expiry: list[tuple[float, str, int]] = []  # a heap: forget each nonce once it is stale anyway

    def verify(self, header: str, method: str, body: bytes) -> Client:
        """The client that signed this request; SignatureError saying why not."""
        signed = parse_header(header)
        now = self._clock()
        if signed.timestamp < self.not_before:
            raise SignatureError(
                "stale",
                f"request signed at {signed.timestamp}, before this node started ({self.not_before:.3f}): "
                f"sign it again with a timestamp from {math.floor(self.not_before) + 1} on",
            )
        if abs(now - signed.timestamp) > self.max_skew_s:
            raise SignatureError(
                "stale",
                f"request signed at {signed.timestamp} but the node's time is {int(now)}: more than "
                f"{self.max_skew_s:g} s apart (sign with a fresh timestamp; check the client's clock)",
            )
        digest = request_digest(self._node, method, body_digest(body), signed.timestamp, signed.nonce)
        recovered = recover_signer(digest, signed.signature)
        if recovered.hex() != signed.signer[2:].lower():
            raise SignatureError(
                "forged",
                f"signature is not {signed.signer}'s for this request (it must sign node "
                f"{self.node_address}, method {method}, the SHA-256 of the body as sent, the timestamp "
                "and the nonce)",
            )
        key = (signed.signer, signed.nonce)
        with self._lock:
            self._forget(now)
            if key in self._seen:
                raise SignatureError("replayed", f"nonce {signed.nonce} of {signed.signer} was used already")
            if len(self._seen) >= self.max_remembered:
                raise TooManyNonces(
                    "busy", f"the node holds {len(self._seen)} recent nonces, its limit: retry in a moment"
                )
            self._seen.add(key)
            heapq.heappush(self._expiry, (signed.timestamp + self.max_skew_s, *key))
        return Client(signed.signer)

    def _forget(self, now: float) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            _, signer, nonce = heapq.heappop(expiry)
            self._seen.discard((signer, nonce))

    def remembered(self) -> int:
        with self._lock:
            return len(self._seen)
