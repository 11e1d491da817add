"""Shared fixtures: real zoo-node daemons started as subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from zoo.devnet.process import dies_with_this_process

REPO = Path(__file__).resolve().parent.parent
# The subprocesses tests start (daemons, CLI runs, accelerate workers) share the cores with the test
# workers: their OpenMP threads sleep while they wait instead of spinning (./zoo test sets it for the
# workers themselves, before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NodeProcess:
    """A zoo-node daemon running in a subprocess."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    config_file: Path
    log_file: Path
    info: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.info["listen"])

    @property
    def metrics_url(self) -> str:
        return str(self.info["metrics"])

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_listening(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        node_file = self.data_dir / "node.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            if node_file.exists():
                try:
                    info = json.loads(node_file.read_text())
                except json.JSONDecodeError:
                    info = {}
                # A node killed with -9 leaves its node.json behind: wait for this process's own.
                if info.get("pid") == self.proc.pid:
                    self.info = info
                    return
            time.sleep(0.05)
        raise AssertionError(f"node did not start listening in {timeout_s} s:\n{self.log()}")

    def wait_component(self, name: str, state: str, timeout_s: float = 120.0) -> None:
        from zoo.node.client import NodeClient
        from zoo.v1 import node_pb2

        deadline = time.monotonic() + timeout_s
        with NodeClient(self.address) as client:
            while time.monotonic() < deadline:
                for c in client.status().components:
                    if c.name == name and node_pb2.ComponentState.Name(c.state) == f"COMPONENT_STATE_{state}":
                        return
                time.sleep(0.1)
        raise AssertionError(f"component {name} never became {state}:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"node ignored signal {sig} for {timeout_s} s:\n{self.log()}") from None
        return self.proc.returncode


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def base_config(data_dir: Path, extra: dict | None = None) -> str:
    """TOML for a test node: OS-picked loopback ports, no chain, one torch thread; `extra` merges in."""
    import tomli_w

    cfg: dict = {
        "data_dir": str(data_dir),
        "server": {"listen": "127.0.0.1:0", "grace_period_s": 5},
        "metrics": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
        "chain": {"mode": "off"},
        "model": {"threads": 1},
    }
    for section, values in (extra or {}).items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    return tomli_w.dumps(cfg)


def launch(
    config_file: Path,
    data_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> NodeProcess:
    """`zoo-node start` with this config, its output in the config's .log; `prefix` runs it under another
    command (the network lab's `ip netns exec NS`)."""
    log_file = config_file.with_suffix(".log")
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("ZOO_NODE_") or k == "ZOO_NODE_CACHE_DIR"
    }
    full_env.update(env or {})
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "zoo.node.cli", "start", "--config", str(config_file), *args],
        stdout=log_file.open("wb"),
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,
        preexec_fn=dies_with_this_process(),
    )
    return NodeProcess(proc, data_dir, config_file, log_file)


@contextlib.contextmanager
def devnet_serving_node(tmp: Path) -> Iterator[NodeProcess]:
    """A node on its own devnet (genesis library approved) with model, library and retrieval serving;
    a batch of 4, a queue of 24 and 12-token answers by default. Stopped on exit."""
    data_dir = tmp / "data"
    extra = {
        "chain": {"mode": "devnet", "poll_interval_s": 0.3},
        "inference": {"max_batch_size": 4, "max_queued": 24, "default_max_tokens": 12},
    }
    n = launch(write_config(tmp / "node.toml", base_config(data_dir, extra)), data_dir)
    try:
        n.wait_listening(timeout_s=120)
        for component in ("model", "library", "retrieval"):
            n.wait_component(component, "SERVING", timeout_s=180)
        yield n
    finally:
        n.stop()


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator:
    """Factory: start_node(extra={section: {key: value}}) -> NodeProcess; all are stopped afterwards."""
    nodes: list[NodeProcess] = []

    def _start(
        extra: dict | None = None, wait: bool = True, name: str = "node", env: dict[str, str] | None = None
    ):
        data_dir = tmp_path / f"{name}-data"
        cfg = write_config(tmp_path / f"{name}.toml", base_config(data_dir, extra))
        node = launch(cfg, data_dir, env=env)
        nodes.append(node)
        if wait:
            node.wait_listening()
        return node

    yield _start
    for node in nodes:
        if node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()
