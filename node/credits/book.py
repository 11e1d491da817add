"""Who holds credits, and what their answers cost: signed clients' balances on the UsageLedger, less what
they spent at this node that the ledger does not show yet.

A client is a credit holder while that amount is above zero: its requests wait in the admission queue
ahead of everyone else's (node/admission.py), and each answer is charged `price_per_token` credits per
token (prompt and completion), up to what it holds. Charges are metered with the answer (meter.py) and
go into this node's next usage report as the client's spent record, so its balance goes down on chain.

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

log = get_logger(__name__)


class CreditBook:
    """Cached credit balances of signed clients (thread-safe; async reads)."""

    def __init__(
        self,
        balance_of: Callable[[str], int],
        *,
        spent_unsettled: Callable[[str], int] = lambda _client: 0,
        price_per_token: float = 1.0,
        ttl_s: float = 5.0,
        read_timeout_s: float = 2.0,
        max_clients: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """balance_of: the client's balance on the ledger (blocking: a chain read). spent_unsettled: what
        the client spent at this node that the ledger does not reflect yet (the meter's record)."""
        self._balance_of = balance_of
        self._spent_unsettled = spent_unsettled
        self.price_per_token = price_per_token
        self.ttl_s = ttl_s
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        # client -> (credits, read at), least recently read first; bounded, since anyone can sign with as
        # many fresh keys as they like
        self._available: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.max_clients = max_clients

    async def available(self, client: str) -> int:
        """Credits `client` may still spend here (0 for anonymous clients)."""
        if not client:
            return 0
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

    async def is_holder(self, client: str) -> bool:
        return await self.available(client) > 0

    def charge(self, client: str, tokens: int) -> int:
        """The credits an answer of `tokens` costs a holder, at most what it holds (0 for anyone else);
        taken off the cached amount at once, so concurrent answers never spend the same credits twice."""
        if not client or tokens <= 0:
            return 0
        with self._lock:
            credits, read_at = self._available.get(client, (0, 0.0))
            cost = min(credits, math.ceil(tokens * self.price_per_token))
            if cost:
                self._available[client] = (credits - cost, read_at)
            return cost
