"""What a long-running part of the node is: a `Component` (setup, probe, run_forever, stop), its `State`
as a `Status`, `DisabledComponent` for one switched off by configuration, and `in_background_thread` for
blocking start-up work (loading a model).

Below everything that is or reports a component: the supervisor (components/supervisor.py) runs them, the
metrics (metrics.py) export their states, and the components themselves live in components/, credits/
(settlement), jobs/ and p2p/.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


async def in_background_thread(fn: Callable[[], T], name: str) -> T:
    """Run blocking start-up work (loading a model) in a daemon thread and await its result.

    Unlike asyncio.to_thread, a daemon thread does not hold up shutdown: asyncio.run joins the default
    executor on exit, so a node stopped while a model is still loading would wait for the whole load.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(set_: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this any more
            loop.call_soon_threadsafe(lambda: None if future.done() else set_())

    def work() -> None:
        try:
            result = fn()
        except BaseException as e:
            settle(lambda error=e: future.set_exception(error))
        else:
            settle(lambda: future.set_result(result))

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


class State(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DEGRADED = "degraded"
    FAILED = "failed"
    DISABLED = "disabled"

    @property
    def usable(self) -> bool:
        return self in (State.SERVING, State.DEGRADED)


@dataclass
class Status:
    name: str
    state: State
    detail: str = ""
    since: float = field(default_factory=time.time)


class Component:
    """Base class: override setup/probe (and run_forever/stop where there is background work)."""

    name: str = "component"
    probe_interval_s: float = 5.0
    has_background_task: bool = False

    async def setup(self) -> None:
        """One-time start-up work (load a model, connect). Raising marks the component FAILED and retries."""

    async def probe(self) -> tuple[State, str]:
        """A real health check of the dependency; returns the state and a reason."""
        return State.SERVING, ""

    async def run_forever(self) -> None:
        """Background work (event following, ...); only called when has_background_task is True."""

    async def stop(self) -> None:
        """Release resources."""


class DisabledComponent(Component):
    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
