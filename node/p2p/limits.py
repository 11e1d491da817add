"""How many connections a node keeps: which peers to close when it holds too many.

A node dials while it is below `p2p.target_peers`; peers dialling it and DHT queries (each connects the peers
it asks) can take it higher. Past `p2p.max_peers` it closes the excess, chosen at random so that nodes do not
all close the same peers, and never a protected peer: one in its gossip mesh, one it is exchanging library
bytes with, a bootstrap peer or relay, or one connected less than GRACE_S ago (a peer that has just dialled
must get the time to join the mesh, and a content fetch the time to finish). It closes down to max_peers, not
to the target: a peer it closes may fall below its own target and dial someone else, and closing many at once
set off such dials across the network in turn (at N = 24 every node kept closing and dialling, and content
fetches broke).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

GRACE_S = 60.0


class ConnectionAges:
    """Since when each connected peer has been connected (as seen by the dial rounds that update it)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def update(self, connected: Iterable[str], now: float) -> None:
        connected = set(connected)
        self._since = {p: self._since.get(p, now) for p in connected}

    def young(self, now: float, grace_s: float = GRACE_S) -> set[str]:
        return {p for p, since in self._since.items() if now - since < grace_s}


def surplus(connected: Iterable[str], protected: Iterable[str], high: int, rng: random.Random) -> list[str]:
    """The peers to close: none while at most `high` are connected; otherwise enough unprotected ones, chosen
    at random, to come down to `high` (fewer when too many are protected)."""
    connected = sorted(set(connected))
    keep = set(protected)
    spare = [p for p in connected if p not in keep]
    rng.shuffle(spare)
    return spare[: max(0, len(connected) - high)]
