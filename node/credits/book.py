"""Who holds credits, and what their answers cost: signed clients' balances on the UsageLedger, less what
they spent at this node that the ledger does not show yet.

A client is a credit holder here while that amount is above zero and it sent its consent to be charged
(a spend authorization for this node and epoch, consent.py) that its spends this epoch have not used up:
its requests wait in the admission queue ahead of everyone else's (node/api/admission.py), and each answer is
charged `price_per_token` credits per token (prompt and completion), up to what it holds and what its
authorization still allows. Charges are metered with the answer and its authorization (meter.py) and go
into this node's next usage report as the client's spent record, so its balance goes down on chain. A
signed client without an authorization is served like anyone else, never charged.

Balances are read from the chain in a worker thread and kept for `ttl_s` seconds (about a block); a
client seen for the first time waits for one read. A read that fails counts the client as holding
nothing until the next try: the node keeps serving, without priority.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from zoo.node.logs import get_logger
from zoo.registry.spend import SpendAuthorization

log = get_logger(__name__)


class CreditBook:
    """Cached credit balances of signed clients (thread-safe; async reads)."""

    def __init__(
        self,
        balance_of: Callable[[str], int],
        *,
        spent_unsettled: Callable[[str], int] = lambda _client: 0,
        spent_in: Callable[[str, int], int] = lambda _client, _epoch: 0,
        price_per_token: float = 1.0,
        ttl_s: float = 5.0,
        read_timeout_s: float = 2.0,
        max_clients: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """balance_of: the client's balance on the ledger (blocking: a chain read). spent_unsettled: what
        the client spent at this node that the ledger does not reflect yet; spent_in: what it spent here
        in an epoch (both the meter's record)."""
        self._balance_of = balance_of
        self._spent_unsettled = spent_unsettled
        self._spent_in = spent_in
        # (client, epoch) -> credits charged under its authorizations (read from the meter once, then
        # counted here as charges are made, so concurrent answers never exceed what was authorized)
        self._charged: dict[tuple[str, int], int] = {}
        self.price_per_token = price_per_token
        self.ttl_s = ttl_s
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        # client -> (credits, read at), least recently read first; bounded, since anyone can sign with as
        # many fresh keys as they like
        self._available: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.max_clients = max_clients

    async def available(self, client: str, spend: SpendAuthorization | None = None) -> int:
        """Credits `client` may still spend here under its authorization `spend` (0 without one)."""
        if not client or spend is None or spend.client != client:
            return 0
        key = (client, spend.epoch)
        with self._lock:
            charged = self._charged.get(key)
        if charged is None:  # the first request of this client and epoch: the meter's count (a disk read)
            charged = await asyncio.to_thread(self._spent_in, client, spend.epoch)
            with self._lock:
                charged = self._charged.setdefault(key, charged)
                while len(self._charged) > self.max_clients:
                    self._charged.pop(next(iter(self._charged)))
        if spend.units <= charged:
            return 0
        return min(spend.units - charged, await self._credits(client))

    async def _credits(self, client: str) -> int:
        """What `client` holds, less what it spent here that the ledger does not show yet (cached)."""
        with self._lock:
            cached = self._available.get(client)
        if cached is not None and self._clock() - cached[1] < self.ttl_s:
            return cached[0]
        try:
            credits = await asyncio.wait_for(asyncio.to_thread(self._read, client), self.read_timeout_s)
        except Exception as e:  # a chain that is down or slow: no priority, the request is still served
            log.warning("credit balance unavailable", client=client, error=str(e) or type(e).__name__)
            credits = 0
        with self._lock:
            self._available[client] = (credits, self._clock())
            self._available.move_to_end(client)
            while len(self._available) > self.max_clients:
                self._available.popitem(last=False)
        return credits

    def _read(self, client: str) -> int:
        return max(0, self._balance_of(client) - self._spent_unsettled(client))

    async def is_holder(self, client: str, spend: SpendAuthorization | None = None) -> bool:
        return await self.available(client, spend) > 0

    def charge(self, client: str, tokens: int, spend: SpendAuthorization | None = None) -> int:
        """The credits an answer of `tokens` costs a holder, at most what it holds and what its
        authorization `spend` still allows (0 for anyone else, and without one); taken off the cached
        amounts at once, so concurrent answers never spend the same credits twice."""
        if not client or tokens <= 0 or spend is None or spend.client != client:
            return 0
        with self._lock:
            credits, read_at = self._available.get(client, (0, 0.0))
            key = (client, spend.epoch)
            charged = self._charged.get(key)
            if charged is None:  # forgotten since is_holder (over max_clients): the meter's count
                charged = self._spent_in(client, spend.epoch)
            cost = max(0, min(credits, spend.units - charged, math.ceil(tokens * self.price_per_token)))
            if cost:
                self._available[client] = (credits - cost, read_at)
                self._charged[key] = charged + cost
            return cost
