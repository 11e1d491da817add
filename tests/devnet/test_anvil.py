"""AnvilProcess: start on a free port, answer JSON-RPC, stop its process group, die with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from zoo.devnet.anvil import AnvilError, AnvilProcess


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_start_reports_port_and_answers_then_stops() -> None:
    anvil = AnvilProcess().start(chain_id=4242)
    try:
        assert anvil.port > 0 and anvil.rpc_url == f"http://127.0.0.1:{anvil.port}"
        reply = httpx.post(
            anvil.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
        )
        assert int(reply.json()["result"], 16) == 4242
        assert os.getpgid(anvil.pid) == anvil.pid  # its own process group
        pid = anvil.pid
    finally:
        anvil.stop()
    assert _wait_dead(pid) and not anvil.running
    anvil.stop()  # idempotent


def test_two_chains_get_different_ports() -> None:
    with AnvilProcess() as a, AnvilProcess() as b:
        assert a.port != b.port


def test_failed_start_raises_with_log() -> None:
    anvil = AnvilProcess(extra_args=("--no-such-flag",))
    with pytest.raises(AnvilError, match="no-such-flag"):
        anvil.start(timeout=10)
    assert not anvil.running


def test_anvil_dies_with_its_parent() -> None:
    # A parent that is SIGKILLed gets no chance to clean up; PR_SET_PDEATHSIG must still take anvil down.
    script = textwrap.dedent(
        """
        import sys, time
        from zoo.devnet.anvil import AnvilProcess
        anvil = AnvilProcess(die_with_parent=True).start()
        print(anvil.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        anvil_pid = int(line)
        assert _alive(anvil_pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _wait_dead(anvil_pid), "anvil outlived its SIGKILLed parent"


def test_not_started_has_no_url() -> None:
    anvil = AnvilProcess()
    with pytest.raises(AnvilError):
        _ = anvil.rpc_url
    assert "not started" in repr(anvil)


def test_log_file_mode_outlives_a_parent_that_exits(tmp_path: Path) -> None:
    # `devnet up` style: the starting process exits, anvil keeps serving and logging to its file.
    log = tmp_path / "anvil.log"
    # The file is appended to, and a "Listening on" left by an earlier run must not be picked up.
    log.write_text("previous run\nListening on 127.0.0.1:1\n")
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from zoo.devnet.anvil import AnvilProcess
        anvil = AnvilProcess(die_with_parent=False, log_path=Path({str(log)!r})).start()
        print(anvil.pid, anvil.rpc_url, flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, timeout=60)
    pid_text, url = out.stdout.decode().split()
    pid = int(pid_text)
    try:
        assert not url.endswith(":1")
        for _ in range(50):  # enough requests to fill a pipe nobody reads any more
            request = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
            assert "result" in httpx.post(url, json=request, timeout=5).json()
        text = log.read_text()
        assert text.startswith("previous run\n") and "eth_blockNumber" in text
    finally:
        os.killpg(pid, signal.SIGTERM)
    assert _wait_dead(pid)
