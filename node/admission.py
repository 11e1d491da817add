"""Admission for generation requests, shared by gRPC and the HTTP API: at most `slots` requests run (the
model's batch), at most `max_queued` wait in arrival order, and none waits longer than `max_wait_s`.

A request beyond the queue, or one whose wait runs out, is refused with Overloaded (RESOURCE_EXHAUSTED,
HTTP 429) and a message saying which limit it hit. What a waiting request holds is its parsed request
only, so memory is bounded by the queue's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from zoo.node.errors import Overloaded


@dataclass
class AdmissionStats:
    running: int
    waiting: int
    slots: int
    max_queued: int
    admitted: int
    queued_then_admitted: int
    refused_full: int
    refused_timeout: int
    mean_wait_ms: float


class Admission:
    def __init__(
        self,
        slots: int,
        max_queued: int,
        max_wait_s: float,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.slots = slots
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s
        self.on_wait = on_wait  # called with each admitted request's wait in seconds (a metrics histogram)
        self._free = asyncio.Semaphore(slots)  # FIFO: waiters are woken in arrival order
        self.running = 0
        self.waiting = 0
        self.admitted = 0
        self.queued_then_admitted = 0
        self.refused_full = 0
        self.refused_timeout = 0
        self._waited_s = 0.0

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            self.running,
            self.waiting,
            self.slots,
            self.max_queued,
            self.admitted,
            self.queued_then_admitted,
            self.refused_full,
            self.refused_timeout,
            self._waited_s * 1000 / self.admitted if self.admitted else 0.0,
        )

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold a running slot for the body; yields the time waited in milliseconds."""
        start = time.perf_counter()
        queued = self._free.locked() or self.waiting > 0
        if queued:
            if self.waiting >= self.max_queued:
                self.refused_full += 1
                raise Overloaded(
                    f"inference queue is full ({self.slots} running, {self.max_queued} waiting; "
                    "inference.max_batch_size / inference.max_queued); retry later"
                )
            self.waiting += 1
            try:
                await asyncio.wait_for(self._free.acquire(), self.max_wait_s)
            except TimeoutError:
                self.refused_timeout += 1
                raise Overloaded(
                    f"no free slot within {self.max_wait_s:g} s (inference.max_wait_s); the node is busy, "
                    "retry later"
                ) from None
            finally:
                self.waiting -= 1
            self.queued_then_admitted += 1
        else:
            await self._free.acquire()
        waited = time.perf_counter() - start
        self.admitted += 1
        self._waited_s += waited
        self.running += 1
        if self.on_wait is not None:
            self.on_wait(waited)
        try:
            yield waited * 1000
        finally:
            self.running -= 1
            self._free.release()
