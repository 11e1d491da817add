"""Admission for generation requests, shared by gRPC and the HTTP API: at most `slots` requests run (the
model's batch), at most `max_queued` wait, and none waits longer than `max_wait_s`.

Waiting requests are in two queues, each in arrival order: signed credit holders' (node.credits) and
everyone else's. A freed slot goes to the oldest credit holder first, and `reserved` slots only ever run
holders' requests, so under load a holder waits only for the holders before it, not for a slot to free;
each queue holds at most `max_queued`, so a flood of anonymous requests that fills its queue never keeps
a holder out.

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

from zoo.registry.errors import Overloaded


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
        reserved: int = 0,
    ) -> None:
        if not 0 <= reserved < slots:
            raise ValueError(f"reserved slots must be from 0 to slots - 1 ({slots - 1}), got {reserved}")
        self.slots = slots
        self.reserved = reserved
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s
        self.on_wait = on_wait  # called with each admitted request's wait in seconds (a metrics histogram)
        # Written by hand rather than two asyncio.Semaphores: a freed slot must go to the first waiter of
        # the first queue that may use it, which no pair of semaphores can decide.
        self._queues: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())
        self.running = 0
        self._running_anonymous = 0
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
        ahead = self._queues[0] if priority else self.waiting
        if self._may_run(priority) and not ahead:
            self._start(priority)
        else:
            await self._wait(self._queues[0 if priority else 1], priority)  # started when granted
            self.queued_then_admitted += 1
        waited = time.perf_counter() - start
        self.admitted += 1
        self.priority_admitted += priority
        self._waited_s += waited
        if self.on_wait is not None:
            self.on_wait(waited)
        try:
            yield waited * 1000
        finally:
            self._finish(priority)

    def _may_run(self, priority: bool) -> bool:
        if self.running >= self.slots:
            return False
        return priority or self._running_anonymous < self.slots - self.reserved

    def _start(self, priority: bool) -> None:
        self.running += 1
        self._running_anonymous += not priority

    def _finish(self, priority: bool) -> None:
        self.running -= 1
        self._running_anonymous -= not priority
        self._dispatch()

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
                self._finish(priority)
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

    def _dispatch(self) -> None:
        """Start waiters while slots allow: credit holders first, then anonymous requests (which never
        take the reserved slots)."""
        for priority, queue in zip((True, False), self._queues, strict=True):
            while queue and self._may_run(priority):
                waiter = queue.popleft()
                if not waiter.done():
                    self._start(priority)  # counted now, so the next waiter sees the slot taken
                    waiter.set_result(None)
