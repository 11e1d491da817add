"""The supervisor that runs the node's background components (chain, ipfs, model, library, ...).

Each component (zoo.node.lifecycle) is an async object with `setup()`, `probe()` and optionally
`run_forever()` and `stop()`. The supervisor runs setup, probes health on an interval and keeps
`run_forever` alive: a crash is logged with its traceback, shown as FAILED in health and status, and
retried with exponential backoff. It never silently kills the process and never leaves a dead task
looking healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from zoo.node.lifecycle import Component, DisabledComponent, State, Status
from zoo.node.logs import get_logger

log = get_logger(__name__)


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
