"""Per-key exponential backoff for retrying what failed (a dial, a relay reservation): after a failure the
key waits `first_s`, then twice as long after each further failure, up to `max_s`; a success forgets it."""

from __future__ import annotations

import time
from collections.abc import Iterable


class Backoff:
    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s, self.max_s = first_s, max_s
        self._delay: dict[str, float] = {}  # key -> its current wait
        self._next: dict[str, float] = {}  # key -> monotonic time of its next attempt

    def due(self, key: str, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self._next.get(key, 0.0)

    def failed(self, key: str, now: float | None = None) -> float:
        """Record a failure; returns how long `key` now waits."""
        delay = min(self.max_s, 2 * self._delay.get(key, self.first_s / 2))
        self._delay[key] = delay
        self._next[key] = (time.monotonic() if now is None else now) + delay
        return delay

    def succeeded(self, key: str) -> None:
        self._delay.pop(key, None)
        self._next.pop(key, None)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget every key not in `keys` (addresses no longer dialled): the memory stays bounded."""
        keep = set(keys)
        self._delay = {k: v for k, v in self._delay.items() if k in keep}
        self._next = {k: v for k, v in self._next.items() if k in keep}
