"""Admission for generation requests, shared by gRPC and the HTTP API: at most `slots` requests run (the
model's batch), at most `max_queued` wait, and none waits longer than `max_wait_s`.

Waiting requests are in two queues, each in arrival order: signed credit holders' (node.credits) and
everyone else's. A freed slot goes to the oldest credit holder first, so under load a holder waits only
for the requests already running and the holders before it; each queue holds at most `max_queued`, so a
flood of anonymous requests that fills its queue never keeps a holder out.

A request beyond its queue, or one whose wait runs out, is refused with Overloaded (RESOURCE_EXHAUSTED,
HTTP 429) and a message saying which limit it hit. What a waiting request holds is its parsed request
only, so memory is bounded by the queues' length.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
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
    priority_admitted: int = 0  # of `admitted`, credit holders'


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
        self._free = slots
        # Written by hand rather than two asyncio.Semaphores: a freed slot must go to the first waiter of
        # the first non-empty queue, which no pair of semaphores can decide.
        self._queues: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())
        self.running = 0
        self.admitted = 0
        self.priority_admitted = 0
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
            self.priority_admitted,
        )

    @property
    def waiting(self) -> int:
        return len(self._queues[0]) + len(self._queues[1])

    @contextlib.asynccontextmanager
    async def slot(self, priority: bool = False) -> AsyncIterator[float]:
        """Hold a running slot for the body; yields the time waited in milliseconds. `priority`: the
        request is a credit holder's, served before every other waiting request."""
        start = time.perf_counter()
        if self._free > 0 and not self.waiting:
            self._free -= 1
        else:
            await self._wait(self._queues[0 if priority else 1], priority)
            self.queued_then_admitted += 1
        waited = time.perf_counter() - start
        self.admitted += 1
        self.priority_admitted += priority
        self._waited_s += waited
        self.running += 1
        if self.on_wait is not None:
            self.on_wait(waited)
        try:
            yield waited * 1000
        finally:
            self.running -= 1
            self._release()

    async def _wait(self, queue: deque[asyncio.Future[None]], priority: bool) -> None:
        if len(queue) >= self.max_queued:
            self.refused_full += 1
            which = "credit holders' queue" if priority else "inference queue"
            raise Overloaded(
                f"{which} is full ({self.slots} running, {len(queue)} waiting; "
                "inference.max_batch_size / inference.max_queued); retry later"
            )
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(granted)
        try:
            async with asyncio.timeout(self.max_wait_s):
                await asyncio.shield(granted)
        except BaseException as e:
            if granted.done():  # the slot was handed over just as the wait ended: pass it on
                self._release()
            else:
                granted.cancel()
                queue.remove(granted)
            if isinstance(e, TimeoutError):
                self.refused_timeout += 1
                raise Overloaded(
                    f"no free slot within {self.max_wait_s:g} s (inference.max_wait_s); the node is busy, "
                    "retry later"
                ) from None
            raise

    def _release(self) -> None:
        """A slot is free: hand it to the first waiter, credit holders first, or keep it."""
        for queue in self._queues:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1
