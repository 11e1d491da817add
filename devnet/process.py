"""Identify processes the devnet started, so `down` stops exactly those and never an unrelated process
that happens to reuse a pid later (the recorded kernel start time must match too)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def pdeathsig(sig: int) -> Callable[[], None]:
    # Resolved here in the parent: loading a library between fork and exec can deadlock on the loader lock.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_signal() -> None:
        # Runs in the child between fork and exec. The kernel sends `sig` when the thread that forked
        # the child exits, so start the daemon from a long-lived thread (normally the main one).
        if prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")

    return set_signal


def dies_with_this_process() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send the child SIGTERM (a node's clean stop) when this process dies,
    however it dies: a test or benchmark killed from outside (SIGKILL, a time limit) leaves no node behind,
    though a node leads its own session and so escapes a signal to its launcher's group. The kernel signals
    when the launching *thread* exits, so it is set only for children launched from the main thread (tests
    and benchmarks launch there); others are stopped by their owners."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return pdeathsig(signal.SIGTERM)


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, name: str, pid: int) -> ProcessRecord:
        ticks = _start_ticks(pid)
        if ticks is None:
            raise ProcessLookupError(f"{name} (pid {pid}) exited right after it started")
        return cls(name, pid, ticks)

    def alive(self) -> bool:
        """The very process recorded is still running (not a zombie, not a reused pid)."""
        if _start_ticks(self.pid) != self.start_ticks:
            return False
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                state = f.read().decode(errors="replace")
            return state[state.rindex(")") + 2] != "Z"
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> bool:
        """SIGTERM the process's own group, SIGKILL after timeout; True if it was running."""
        if not self.alive():
            return False
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                # Each devnet process leads its own session/group (start_new_session), so the group is ours.
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                return True
            except PermissionError:
                os.kill(self.pid, sig)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not self.alive():
                    _reap(self.pid)
                    return True
                time.sleep(0.05)
        return True

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
