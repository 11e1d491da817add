"""The library component: holds the active verified library and keeps it in step with the chain.

Inference reads `active` once per request; a new version replaces that reference in one assignment, so
a request never sees a mix of two versions and never waits for a sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

from zoo.node.lifecycle import Component, State
from zoo.node.logs import get_logger
from zoo.registry.errors import IntegrityError
from zoo.registry.library_store import LibraryStore, StoredVersion
from zoo.registry.sync import LibraryFollower, Refused

log = get_logger(__name__)


class ChainEvents:
    """Adapts a RegistryClient to the follower's EventSource (block height + LibraryUpdated events)."""

    def __init__(self, registry: Any, from_block: int = 0) -> None:
        self.registry = registry
        self.from_block = from_block

    def block_number(self) -> int:
        return int(self.registry.w3.eth.block_number)

    def library_updated_events(self, from_block: int, to_block: int) -> list[Any]:
        return self.registry.library_updated_events(max(from_block, self.from_block), to_block)


class LibraryComponent(Component):
    name = "library"
    probe_interval_s = 1.0

    def __init__(
        self,
        store: LibraryStore,
        follower_factory: Callable[[], LibraryFollower] | None = None,
        poll_interval_s: float = 2.0,
        on_activate: Callable[[StoredVersion], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.follower_factory = follower_factory
        self.poll_interval_s = poll_interval_s
        self.on_activate = on_activate
        self.on_refused = on_refused
        self.has_background_task = follower_factory is not None
        self.active: StoredVersion | None = None
        self.last_error = ""
        self.last_refusal = ""
        self.refused_version = 0  # the newest on-chain version this node refused (0: none since the last)
        self.last_sync = 0.0
        self.on_change: Callable[[], None] | None = None
        self._wake = asyncio.Event()

    # GetStatus reads these.
    @property
    def root(self) -> str:
        return self.active.root if self.active else ""

    @property
    def version(self) -> int:
        return self.active.version if self.active else 0

    @property
    def cid(self) -> str:
        return self.active.cid if self.active else ""

    @property
    def experience_count(self) -> int:
        return len(self.active.library.experiences) if self.active else 0

    async def setup(self) -> None:
        try:
            current = await asyncio.to_thread(self.store.current)
        except IntegrityError as e:
            # A corrupt local copy is never served; the sync fetches the version again.
            log.error("local library is corrupt; not serving it", reason=str(e))
            current = None
        if current is not None:
            self._activate(current)

    def _activate(self, stored: StoredVersion) -> None:
        self.active = stored
        if stored.version >= self.refused_version:
            self.last_refusal, self.refused_version = "", 0
        log.info(
            "library active",
            version=stored.version,
            root=stored.root,
            experiences=len(stored.library.experiences),
        )
        if self.on_activate:
            self.on_activate(stored)
        if self.on_change:
            self.on_change()

    async def run_forever(self) -> None:
        assert self.follower_factory is not None
        follower = await asyncio.to_thread(self.follower_factory)
        backoff = self.poll_interval_s
        next_poll = time.monotonic()
        while True:
            # Wait for the next scheduled poll, or for a checked peer announcement that there is news.
            woken = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_poll - time.monotonic()))
                woken = True
            self._wake.clear()
            log.debug("library poll", woken=woken)
            try:
                result = await asyncio.to_thread(follower.poll)
                self.last_error = ""
                self.last_sync = time.time()
                backoff = self.poll_interval_s
                if result is not None and result.activated is not None:
                    self._activate(result.activated)
            except Refused as e:
                self.last_refusal = str(e)
                self.refused_version = max(self.refused_version, int(e.values.get("version", 0) or 0))
                log.warning("library version refused", reason=str(e))
                if self.on_refused:
                    self.on_refused(e.kind)
            except Exception as e:
                # RPC or IPFS trouble: keep serving the last verified version and retry with backoff.
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("library sync failed; retrying", error=self.last_error, retry_in_s=backoff)
                backoff = min(backoff * 2, 30.0)
            if not woken:
                # An extra poll on a wake-up leaves the schedule alone, and each interval is jittered by
                # up to 20 %: nodes must not poll in step (started together, or woken by one
                # announcement), so that a new version is found early by whichever polls first.
                next_poll = time.monotonic() + backoff * random.uniform(0.8, 1.2)

    def wake(self) -> None:
        """Poll the chain now (a peer announced a version that checks out against the chain)."""
        self._wake.set()

    async def probe(self) -> tuple[State, str]:
        serving = f"version {self.version} root {self.root[:18]}…" if self.active else "no verified library"
        if self.last_error:
            return State.DEGRADED, f"sync failing ({self.last_error}); serving {serving}"
        if self.active is None:
            if self.follower_factory is None:
                return (
                    State.DEGRADED,
                    "no verified library and no chain to sync from; answering without experiences",
                )
            return State.DEGRADED, "no verified library version is active yet; answering without experiences"
        if self.refused_version > self.version:
            # The chain's current library is not what this node serves: clients must not take it for current.
            return (
                State.DEGRADED,
                f"serving {serving}, older than the chain's version {self.refused_version}, which this node "
                f"refused: {self.last_refusal[:300]}",
            )
        return State.SERVING, serving
