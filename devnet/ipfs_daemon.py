"""A local js-ipfs daemon (Kubo-compatible RPC API) on loopback, offline, for the devnet and the tests.

Production nodes talk to a real Kubo; js-ipfs from npm is the stand-in that can be installed offline
(docs/operating.md, "Setup"). The daemon runs in its own process group so stop() takes down everything it
started, and with `die_with_parent` the kernel stops it when the Python process dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from zoo.contracts.jstools import jsipfs_cli, node_binary
from zoo.devnet.process import pdeathsig
from zoo.registry.errors import ZooError

_LOG_NAME = "zoo-daemon.log"
# js-ipfs prints these when it cannot bind its API but keeps running without one instead of exiting.
_FATAL_MARKERS = ("EADDRINUSE", "EACCES", "EADDRNOTAVAIL")


class IpfsDaemonError(ZooError, RuntimeError):
    """The IPFS daemon could not be initialised or did not come up."""


class IpfsDaemon:
    """One js-ipfs daemon on a repository folder; `api_port=0` lets the daemon pick a free port."""

    def __init__(
        self,
        repo_dir: str | os.PathLike[str],
        api_port: int = 0,
        *,
        die_with_parent: bool = False,
        start_timeout: float = 30.0,
    ) -> None:
        self.repo_dir = Path(repo_dir).resolve()
        self.api_port = api_port
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._api_url: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, on_spawn: Callable[[int], None] | None = None) -> IpfsDaemon:
        """Init the repo if needed and run the daemon until its API answers; on_spawn(pid) runs right
        after the process exists, before readiness (so a caller can record it)."""
        if self._proc is not None:
            raise IpfsDaemonError("daemon already started")
        if self.api_port and not _port_free(self.api_port):
            raise IpfsDaemonError(f"API port {self.api_port} on 127.0.0.1 is already in use")
        env = {**os.environ, "IPFS_PATH": str(self.repo_dir)}
        env.pop("DEBUG", None)  # js-ipfs logs everything to stderr when DEBUG is set
        if not (self.repo_dir / "config").is_file():
            self._init(env)
        self._clear_stale_lock()
        self._write_config()

        log_path = self.repo_dir / _LOG_NAME
        with open(log_path, "wb") as log:
            # A log file rather than pipes: nobody has to drain them, and the tail explains a failed start.
            self._proc = subprocess.Popen(
                [node_binary(), str(jsipfs_cli()), "daemon", "--offline", "--enable-preload=false"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=pdeathsig(signal.SIGTERM) if self.die_with_parent else None,
            )
        if on_spawn is not None:
            on_spawn(self._proc.pid)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the daemon's process group (js-ipfs then releases its repo lock), SIGKILL after timeout."""
        proc, self._proc = self._proc, None
        self._api_url = None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                continue
        proc.wait()

    def __enter__(self) -> IpfsDaemon:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- state ---------------------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        """Base URL of the RPC API, e.g. `http://127.0.0.1:45123` (append `/api/v0/...`)."""
        if self._api_url is None:
            raise IpfsDaemonError("daemon is not running")
        return self._api_url

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise IpfsDaemonError("daemon is not running")
        return self._proc.pid

    def log_tail(self, max_bytes: int = 4000) -> str:
        path = self.repo_dir / _LOG_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")

    # -- internals -----------------------------------------------------------------------------------

    def _init(self, env: dict[str, str]) -> None:
        self.repo_dir.parent.mkdir(parents=True, exist_ok=True)
        cmd = [node_binary(), str(jsipfs_cli()), "init", "--profile", "test"]
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            # A half-written repository would be mistaken for an initialised one on the next start.
            shutil.rmtree(self.repo_dir, ignore_errors=True)
            tail = (done.stdout + done.stderr)[-4000:].decode("utf-8", "replace")
            raise IpfsDaemonError(f"`jsipfs init` failed with exit code {done.returncode}:\n{tail}")

    def _write_config(self) -> None:
        # Rewritten on every start (not only after init) so a changed api_port takes effect on reuse.
        path = self.repo_dir / "config"
        config = json.loads(path.read_text())
        addresses = config.setdefault("Addresses", {})
        addresses["API"] = f"/ip4/127.0.0.1/tcp/{self.api_port}"
        addresses["Gateway"] = "/ip4/127.0.0.1/tcp/0"
        addresses["RPC"] = "/ip4/127.0.0.1/tcp/0"
        addresses["Swarm"] = ["/ip4/127.0.0.1/tcp/0"]
        addresses["Delegates"] = []
        config["Bootstrap"] = []
        config.setdefault("Discovery", {}).setdefault("MDNS", {})["Enabled"] = False
        path.write_text(json.dumps(config, indent=2))

    def _clear_stale_lock(self) -> None:
        """Remove the repo lock and API file a killed daemon left behind, unless a daemon still answers.

        js-ipfs treats its lock as stale only after 20 s without a refresh, so without this a daemon
        that was SIGKILLed (or lost its parent) blocks restarts on the same repository for 20 s.
        """
        lock = self.repo_dir / "repo.lock"
        api_file = self.repo_dir / "api"
        if not lock.exists() and not api_file.exists():
            return
        url = _multiaddr_to_url(api_file.read_text()) if api_file.exists() else None
        if url is not None and api_answers(url):
            raise IpfsDaemonError(f"another IPFS daemon is already running on {self.repo_dir} at {url}")
        if lock.is_dir():
            shutil.rmtree(lock, ignore_errors=True)
        else:
            lock.unlink(missing_ok=True)
        api_file.unlink(missing_ok=True)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        api_file = self.repo_dir / "api"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise IpfsDaemonError(
                    f"IPFS daemon exited with code {code} during start; its output ends with:\n"
                    + self.log_tail()
                )
            tail = self.log_tail()
            if any(marker in tail for marker in _FATAL_MARKERS):
                raise IpfsDaemonError(f"IPFS daemon failed to start; its output ends with:\n{tail}")
            # The daemon writes the address it actually bound (port 0 resolved) to REPO/api, as Kubo does.
            url = _multiaddr_to_url(api_file.read_text()) if api_file.exists() else None
            if url is None and self.api_port:
                url = f"http://127.0.0.1:{self.api_port}"
            if url is not None and api_answers(url):
                self._api_url = url
                return
            time.sleep(0.1)
        raise IpfsDaemonError(
            f"IPFS daemon did not answer within {self.start_timeout:.0f} s; its output ends with:\n"
            + self.log_tail()
        )


def _multiaddr_to_url(multiaddr: str) -> str | None:
    # Only the shape the daemon writes for our config: /ip4/<host>/tcp/<port>[/http]
    parts = multiaddr.strip().split("/")
    if len(parts) < 5 or parts[1] != "ip4" or parts[3] != "tcp" or not parts[4].isdigit():
        return None
    return f"http://{parts[2]}:{parts[4]}"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # SO_REUSEADDR as Node sets it, so connections in TIME_WAIT do not count as a conflict.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def api_answers(url: str) -> bool:
    """Whether an IPFS RPC API answers at `url` (its /api/v0/version, within 2 s)."""
    try:
        return httpx.post(f"{url}/api/v0/version", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
