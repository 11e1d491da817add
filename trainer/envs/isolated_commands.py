"""Running one command for an episode: without network, in a process group killed at a timeout, its
output capped.

No network. `run_command` callers put `network_isolation_prefix()` before the command, which runs it in a
network namespace of its own that has only a loopback interface, which is down, so every connection
fails ("Network is unreachable"), DNS included. The first launcher that works here is used, probed once
per process: `unshare --net` (root, or CAP_SYS_ADMIN), else `unshare --user --map-root-user --net` (an
unprivileged user namespace; the command then sees itself as root of that namespace but keeps the real
user's rights on files). When neither works the prefix is None, and a caller that needs isolation raises
`NetworkIsolationUnavailable`.

`run_command` starts the command in a session of its own and, at its timeout, kills the whole process
group with SIGKILL (anything the command left running in the background is killed after every call
too); stdout and stderr together are cut to the first and last halves of `output_chars` characters,
with a marker that counts what falls between.

This is network isolation, not a sandbox: commands run with the caller's user rights and can read and
write anywhere those allow, and a process that starts its own session escapes the group kill. Untrusted
policies belong in a container or VM as well.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zoo.registry.errors import ZooError

_NETWORK_LAUNCHERS: tuple[tuple[str, ...], ...] = (
    ("unshare", "--net"),
    ("unshare", "--user", "--map-root-user", "--net"),
)


class NetworkIsolationUnavailable(ZooError, RuntimeError):
    """No way to run commands without network was found on this machine."""


@functools.cache
def network_isolation_prefix() -> tuple[str, ...] | None:
    """The first launcher prefix that runs a command in a new network namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in _NETWORK_LAUNCHERS:
        try:
            probe = subprocess.run(
                [*prefix, "true"], capture_output=True, timeout=10, check=False, env={"PATH": minimal_path()}
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def minimal_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed at its timeout
    output: str  # stdout and stderr interleaved, possibly truncated
    timed_out: bool
    omitted_chars: int = 0


class _OutputCapture:
    """Keeps the first and last halves of `limit` characters of a stream and counts what falls between."""

    def __init__(self, limit: int | None) -> None:
        self._head_limit = limit // 2 if limit is not None else None
        self._tail_limit = limit - limit // 2 if limit is not None else 0
        self._head: list[str] = []
        self._head_chars = 0
        self._tail = ""
        self._total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        self._total += len(text)
        if self._head_limit is None or self._head_chars < self._head_limit:
            take = text if self._head_limit is None else text[: self._head_limit - self._head_chars]
            self._head.append(take)
            self._head_chars += len(take)
            text = text[len(take) :]
        if text:
            self._tail = (self._tail + text)[-self._tail_limit :]

    def result(self) -> tuple[str, int]:
        omitted = self._total - self._head_chars - len(self._tail)
        head = "".join(self._head)
        if omitted <= 0:
            return head + self._tail, 0
        return f"{head}\n[... output truncated: {omitted} characters omitted ...]\n{self._tail}", omitted


def run_command(
    argv: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float, output_chars: int | None
) -> CommandResult:
    """Run argv in its own session; SIGKILL its whole process group at the timeout and afterwards."""
    capture = _OutputCapture(output_chars)
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    stream = proc.stdout

    def pump() -> None:
        while chunk := stream.read1(65536):
            capture.feed(chunk)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(timeout_s, 0.01))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill()
        proc.wait()
    # A process that left the group (setsid) may hold the pipe open: give up on it rather than hang.
    reader.join(timeout=2)
    if not reader.is_alive():
        capture.feed(b"", final=True)
        stream.close()
    output, omitted = capture.result()
    return CommandResult(None if timed_out else proc.returncode, output, timed_out, omitted)
