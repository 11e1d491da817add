"""Run a local anvil devnet chain as a child process that is always cleaned up.

anvil runs in its own process group so stop() can take down everything it spawned; with die_with_parent the
kernel also kills it when the Python process dies (PR_SET_PDEATHSIG), so a crashed test run or daemon never
leaves a chain behind.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from zoo.contracts.jstools import anvil_binary
from zoo.registry.errors import ZooError

__all__ = ["AnvilError", "AnvilProcess"]

DEV_MNEMONIC = "test test test test test test test test test test test junk"

_LISTENING_RE = re.compile(r"Listening on ([^\s:]+|\[[^\]]+\]):(\d+)")
_PR_SET_PDEATHSIG = 1


class AnvilError(ZooError, RuntimeError):
    """anvil could not be started or did not become ready."""


def _die_with_parent(parent_pid: int) -> None:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(70)
    # The parent may have died between fork and prctl; then nobody would ever deliver the signal.
    if os.getppid() != parent_pid:
        os._exit(70)


class AnvilProcess:
    """One anvil chain. Use start()/stop() or `with AnvilProcess().start() as anvil:`.

    With die_with_parent (Linux only), the kernel kills anvil when the *thread* that started it exits, so
    start it from a thread that lives as long as the chain should (normally the main thread).

    anvil's output goes to `log_path` (appended) when given, else through a pipe this object drains. A chain
    meant to outlive this Python process (die_with_parent=False) needs log_path: once the draining thread
    is gone, nothing would read the pipe.
    """

    def __init__(
        self,
        *,
        binary: Path | None = None,
        die_with_parent: bool = True,
        extra_args: tuple[str, ...] = (),
        log_path: Path | None = None,
        log_lines: int = 200,
    ) -> None:
        self._binary = binary
        self._log_path = Path(log_path) if log_path is not None else None
        self._log_offset = 0
        self._die_with_parent = die_with_parent
        self._extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._reader: threading.Thread | None = None
        self._host = ""
        self._port = 0
        self.chain_id = 0

    @property
    def rpc_url(self) -> str:
        """HTTP JSON-RPC endpoint."""
        self._require_running()
        host = self._host if ":" not in self._host or self._host.startswith("[") else f"[{self._host}]"
        return f"http://{host}:{self._port}"

    @property
    def port(self) -> int:
        """TCP port anvil listens on."""
        self._require_running()
        return self._port

    @property
    def pid(self) -> int:
        """Process id of anvil (also its process group id)."""
        self._require_running()
        assert self._proc is not None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether anvil was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self) -> str:
        """The last lines anvil printed (for error messages)."""
        if self._log_path is not None:
            with contextlib.suppress(OSError), open(self._log_path, "rb") as f:
                f.seek(self._log_offset)
                lines = f.read().decode(errors="replace").splitlines()
                return "\n".join(lines[-(self._log.maxlen or 200) :])
        return "\n".join(self._log)

    def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        chain_id: int = 31337,
        block_time: float | None = None,
        *,
        accounts: int = 10,
        balance_ether: int = 10_000,
        mnemonic: str = DEV_MNEMONIC,
        timeout: float = 30.0,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AnvilProcess:
        """Launch anvil and wait until it answers eth_chainId; port 0 lets the OS pick a free port.

        on_spawn(pid) runs right after the process exists, before readiness (so a caller can record it).

        block_time None mines one block per transaction (automine); otherwise a block every block_time s.
        """
        if self._proc is not None:
            raise AnvilError("this AnvilProcess was already started")
        args = [
            str(self._binary or anvil_binary()),
            "--host",
            host,
            "--port",
            str(port),
            "--chain-id",
            str(chain_id),
            "--accounts",
            str(accounts),
            "--balance",
            str(balance_ether),
            "--mnemonic",
            mnemonic,
            *(["--block-time", f"{block_time:g}"] if block_time is not None else []),
            *self._extra_args,
        ]
        preexec = None
        if self._die_with_parent and sys.platform.startswith("linux"):
            parent = os.getpid()

            def preexec() -> None:
                _die_with_parent(parent)

        log_file = None
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(self._log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
            self._log_offset = log_file.tell()
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log_file if log_file is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Runs in the child between fork and exec; prctl must be called by the child itself.
                preexec_fn=preexec,
            )
        finally:
            if log_file is not None:
                log_file.close()  # the child holds its own descriptor
        if on_spawn is not None:
            on_spawn(self._proc.pid)
        self.chain_id = chain_id
        listening = threading.Event()
        # anvil logs every request; a pipe must be drained for anvil's whole life or anvil blocks on write.
        target = self._follow_log_file if self._log_path is not None else self._read_output
        self._reader = threading.Thread(
            target=target, args=(self._proc, listening), name="anvil-log", daemon=True
        )
        self._reader.start()
        try:
            self._wait_ready(listening, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _read_output(self, proc: subprocess.Popen[bytes], listening: threading.Event) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._log.append(line)
            if not listening.is_set():
                match = _LISTENING_RE.search(line)
                if match:
                    self._host, self._port = match.group(1).strip("[]"), int(match.group(2))
                    listening.set()
        listening.set()

    def _follow_log_file(self, proc: subprocess.Popen[bytes], listening: threading.Event) -> None:
        """Read the log file until anvil reports its port (or exits); anvil keeps writing it alone after."""
        assert self._log_path is not None
        pending = b""
        with open(self._log_path, "rb") as f:
            f.seek(self._log_offset)
            while not listening.is_set():
                chunk = f.read()
                if not chunk:
                    if proc.poll() is not None:
                        break
                    time.sleep(0.01)
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip()
                    self._log.append(line)
                    match = _LISTENING_RE.search(line)
                    if match:
                        self._host, self._port = match.group(1).strip("[]"), int(match.group(2))
                        listening.set()
                        break
        listening.set()

    def _wait_ready(self, listening: threading.Event, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        if not listening.wait(timeout) or not self._port:
            raise AnvilError(f"anvil did not report its port (exit {self._proc.poll()}):\n{self.log_tail()}")
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self._proc.poll() is not None:
                    raise AnvilError(f"anvil exited with {self._proc.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    reply = client.post(
                        self.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
                    )
                    got = int(reply.json()["result"], 16)
                    if got != self.chain_id:
                        raise AnvilError(f"anvil reports chain id {got}, expected {self.chain_id}")
                    return
                if time.monotonic() > deadline:
                    raise AnvilError(
                        f"anvil did not answer eth_chainId within {timeout} s:\n{self.log_tail()}"
                    )
                time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate anvil's process group: SIGTERM, then SIGKILL after `timeout` seconds. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)
        if proc.stdout is not None:
            proc.stdout.close()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # Only called while anvil is unreaped, so its pid (= its group id, start_new_session) is not recycled.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _require_running(self) -> None:
        if self._proc is None or not self._port:
            raise AnvilError("anvil is not running")

    def __enter__(self) -> AnvilProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        if self._proc is None:
            return "AnvilProcess(not started)"
        state = "running" if self.running else f"exited {self._proc.returncode}"
        return f"AnvilProcess(pid={self._proc.pid}, url=http://{self._host}:{self._port}, {state})"
