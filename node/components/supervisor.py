"""Background components (chain, ipfs, model, library, ...) and the supervisor that runs them.

Each component is an async object with `setup()`, `probe()` and optionally `run_forever()` and `stop()`.
The supervisor runs setup, probes health on an interval and keeps `run_forever` alive: a crash is
logged with its traceback, shown as FAILED in health and status, and retried with exponential backoff.
It never silently kills the process and never leaves a dead task looking healthy.
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

from zoo.node.logs import get_logger

log = get_logger(__name__)
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


ChangeCallback = Callable[[Status], None]


class Supervisor:
    """Runs components, tracks their states and reports every change to the callbacks."""

    def __init__(self, components: list[Component], max_backoff_s: float = 60.0) -> None:
        self.components = {c.name: c for c in components}
        self.statuses = {
            c.name: Status(c.name, State.DISABLED, c.reason)
            if isinstance(c, DisabledComponent)
            else Status(c.name, State.STARTING, "starting")
            for c in components
        }
        self.max_backoff_s = max_backoff_s
        self._callbacks: list[ChangeCallback] = []
        self._tasks: list[asyncio.Task[None]] = []

    def on_change(self, callback: ChangeCallback) -> None:
        self._callbacks.append(callback)
        for status in self.statuses.values():
            callback(status)

    def set_state(self, name: str, state: State, detail: str = "") -> None:
        old = self.statuses[name]
        if old.state == state and old.detail == detail:
            return
        new = Status(name, state, detail)
        self.statuses[name] = new
        if state != old.state:
            level = log.warning if state in (State.FAILED, State.DEGRADED) else log.info
            level("component state", component=name, state=state.value, was=old.state.value, detail=detail)
        for cb in self._callbacks:
            cb(new)

    def start(self) -> None:
        for comp in self.components.values():
            if not isinstance(comp, DisabledComponent):
                self._tasks.append(asyncio.create_task(self._supervise(comp), name=f"component:{comp.name}"))

    async def _supervise(self, comp: Component) -> None:
        backoff = 1.0
        while True:
            try:
                await comp.setup()
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("component setup failed", component=comp.name, retry_in_s=backoff)
                self.set_state(comp.name, State.FAILED, f"setup failed: {type(e).__name__}: {e}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        await self._probe_once(comp)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._probe_loop(comp))
            if comp.has_background_task:
                tg.create_task(self._keep_running(comp))

    async def _probe_once(self, comp: Component) -> None:
        try:
            state, detail = await comp.probe()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            state, detail = State.FAILED, f"probe failed: {type(e).__name__}: {e}"
        # A crashed background task stays FAILED until it runs again, whatever its probe says.
        if getattr(comp, "_crashed", False) and state.usable:
            return
        self.set_state(comp.name, state, detail)

    async def _probe_loop(self, comp: Component) -> None:
        while True:
            await asyncio.sleep(comp.probe_interval_s)
            await self._probe_once(comp)

    async def _keep_running(self, comp: Component) -> None:
        backoff = 1.0
        while True:
            started = time.monotonic()
            try:
                await comp.run_forever()
                raise RuntimeError("background task returned unexpectedly")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                comp._crashed = True  # type: ignore[attr-defined]
                log.exception("component task crashed", component=comp.name, restart_in_s=backoff)
                self.set_state(comp.name, State.FAILED, f"task crashed: {type(e).__name__}: {e}")
                if time.monotonic() - started > 60:
                    backoff = 1.0  # it ran a good while: treat the next crash as a fresh one
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                comp._crashed = False  # type: ignore[attr-defined]
                await self._probe_once(comp)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for comp in self.components.values():
            try:
                await comp.stop()
            except Exception:
                log.exception("component stop failed", component=comp.name)
