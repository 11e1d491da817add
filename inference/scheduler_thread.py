"""The thread each local scheduler runs (the transformers batcher, the llama.cpp scheduler): a queue of
waiting requests that `submit` fills from any thread, `close`, and the loop that admits requests under the
lock, steps outside it, fails the running requests (not the thread) when a step raises, and fails what is
left when the node shuts down. A subclass says how to admit, how to step, and what is running.

`call` runs other work on the thread between two steps (a proof's prefill): whatever uses the model goes
through the thread that owns it, so nothing changes the model (an adapter set for a batch) under it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from zoo.inference.decoding import BatchStats, DecodingState

State = TypeVar("State", bound=DecodingState)


class SchedulerThread(Generic[State]):
    """One scheduler thread and its queue; subclasses call `_start` at the end of their __init__."""

    noun = "scheduler"  # what errors and logs call it

    def _start(self, thread_name: str) -> None:
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._waiting: deque[State] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._closed = False
        self._log = logging.getLogger(type(self).__module__)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _enqueue(self, state: State) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the {self.noun} is closed")
            self._waiting.append(state)
            self.stats.waiting = len(self._waiting)
            self._cond.notify()

    def call(self, work: Callable[[], Any]) -> Future[Any]:
        """Run `work` on the scheduler thread before its next step; its result (or error) in the future."""
        future: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the {self.noun} is closed")
            self._calls.append((work, future))
            self._cond.notify()
        return future

    def close(self) -> None:
        """Stop the thread (waiting up to 30 s for its step); unfinished requests fail."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)
        self._closed_thread(stopped=not self._thread.is_alive())

    # -- what a subclass says --------------------------------------------------------------------------

    def _running(self) -> list[State]:
        """Every admitted request not yet finished."""
        raise NotImplementedError

    def _admit(self) -> list[State]:
        """Take waiting requests (under the lock: nothing slow)."""
        raise NotImplementedError

    def _step(self, admitted: list[State]) -> None:
        """Prefill what was admitted and decode a step of what runs (outside the lock)."""
        raise NotImplementedError

    def _fail_running(self, error: Exception, admitted: list[State]) -> None:
        """A step raised: fail every running request and forget them."""
        raise NotImplementedError

    def _closed_thread(self, stopped: bool) -> None:
        """After `close`: free what the thread held (nothing by default)."""

    # -- the thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running() and not self._calls:
                    self._cond.wait()
                calls, self._calls = list(self._calls), deque()
                if self._closed:
                    pending = [*self._waiting, *self._running()]
                    self._waiting.clear()
                    break
                admitted = self._admit()
            for work, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(work())
                    except Exception as e:  # the caller's error, not the thread's
                        future.set_exception(e)
            if calls and not admitted and not self._running():
                continue  # woken for the calls alone
            try:
                self._step(admitted)
            except Exception as e:  # anything unforeseen fails the running requests, not the thread
                self._log.exception("%s step failed", self.noun)
                self._fail_running(e, admitted)
            self.stats.running = len(self._running())
        for state in pending:
            state.fail(RuntimeError("the model is shutting down"))
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("the model is shutting down"))
