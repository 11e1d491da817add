"""Devnet tests: real anvil and js-ipfs processes in temporary data dirs, driven through the CLI.

The helpers below are shared by the modules of this package: they run `zoo-node` as a subprocess with a
clean environment, and find processes by what they hold open, so a test can prove that nothing it caused
to be started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zoo.devnet.manager import Devnet


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment minus ZOO_NODE_* settings, with a console wide enough for rich's tables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOO_NODE_") or k == "ZOO_NODE_CACHE_DIR"}
    env["COLUMNS"] = "250"
    env.update(extra or {})
    return env


def zoo(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `zoo-node ARGS` to completion and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", *args],
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def zoo_popen(*args: str) -> subprocess.Popen[bytes]:
    """Start `zoo-node ARGS` without waiting (output discarded)."""
    return subprocess.Popen(
        [sys.executable, "-m", "zoo.node.cli", *args],
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def proc_state(pid: int) -> tuple[int, str] | None:
    """(start ticks, state letter) of a process, None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]), fields[0]


def running(pid: int, start_ticks: int) -> bool:
    """That very process (same start time) exists and has not exited (zombies count as gone)."""
    st = proc_state(pid)
    return st is not None and st[0] == start_ticks and st[1] != "Z"


def holders(path: Path) -> list[int]:
    """Live processes (other than this one) with a file, cwd or IPFS_PATH under `path`."""
    prefix = str(Path(path).resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        st = proc_state(pid)
        if st is None or st[1] == "Z":
            continue
        targets: list[str] = []
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"/proc/{pid}/cwd"))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            targets += [v[10:].decode(errors="replace") for v in env if v.startswith(b"IPFS_PATH=")]
        if any(t == prefix or t.startswith(prefix + "/") for t in targets):
            found.append(pid)
    return found


def describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        lines.append(f"pid {pid}: {cmd.strip()[:160]}")
    return "; ".join(lines) or "none"


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def tear_down(data_dir: Path) -> list[int]:
    """Stop a test's devnet and SIGKILL (by pid) anything still holding its files; returns those pids.

    Leftovers are processes this test caused to be started (they hold files in its own temporary dir), so
    killing them keeps the machine clean even when the code under test leaked them.
    """
    with contextlib.suppress(Exception):
        Devnet(data_dir).down()
    wait_until(lambda: not holders(data_dir), 3.0, 0.1)
    leftovers = holders(data_dir)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers
