"""The node's data directory and the exclusive lock that keeps two daemons from sharing it.

Layout: node.lock (flock held for the daemon's lifetime), node.json (where the running node listens),
admin.token (0600), node.key (0600, the node's account), usage.sqlite (metering), library/ (store),
jobs.sqlite, devnet/ (devnet state).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from pathlib import Path
from typing import Any

from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic


class DataDirLocked(ZooError):
    """Another process holds the data directory."""


class DataDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    @property
    def lock_file(self) -> Path:
        return self.path / "node.lock"

    @property
    def node_file(self) -> Path:
        return self.path / "node.json"

    @property
    def token_file(self) -> Path:
        return self.path / "admin.token"

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)

    def lock(self) -> None:
        """Take the exclusive lock or raise DataDirLocked naming the holder's pid."""
        self.create()
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data directory {self.path} is in use by another zoo-node (pid {holder}); "
                "stop it or start this one with a different --data-dir"
            ) from None
        # flock is released by the kernel when the process dies, so a crashed node never leaves a stale lock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def admin_token(self) -> str:
        """The generated admin token, created (0600) on first use."""
        self.create()
        if self.token_file.exists():
            return self.token_file.read_text().strip()
        token = secrets.token_urlsafe(32)
        write_atomic(self.token_file, token.encode(), mode=0o600)
        return token

    @property
    def key_file(self) -> Path:
        return self.path / "node.key"

    def node_address(self) -> str:
        """The address of the node's own Ethereum account, whose key is created (0600) on first use: signed
        requests name it, and it signs this node's usage reports and answer receipts. Keep the file: a new
        key is a new node to clients and to the chain. (coincurve, not eth_account: that import costs the
        daemon half a second before its port opens.)"""
        import coincurve
        from eth_hash.auto import keccak
        from eth_utils import to_checksum_address

        key = coincurve.PrivateKey(self.node_key())
        return to_checksum_address(keccak(key.public_key.format(compressed=False)[1:])[12:])

    def node_key(self) -> bytes:
        """The node account's private key (32 bytes), created on first use; ValueError for a damaged file."""
        import coincurve

        self.create()
        if not self.key_file.exists():
            write_atomic(self.key_file, coincurve.PrivateKey().secret.hex().encode(), mode=0o600)
        try:
            secret = bytes.fromhex(self.key_file.read_text().strip().removeprefix("0x"))
            return coincurve.PrivateKey(secret).secret
        except ValueError as e:
            raise ValueError(f"{self.key_file} does not hold a secp256k1 private key in hex: {e}") from None

    def write_node_info(self, info: dict[str, Any]) -> None:
        write_atomic(self.node_file, json.dumps(info, indent=2).encode())

    def read_node_info(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.node_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def clear_node_info(self) -> None:
        self.node_file.unlink(missing_ok=True)
