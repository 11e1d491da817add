"""`zoo-node devnet up|down|status` and a node in devnet mode, against real anvil and js-ipfs processes.

Every devnet started here lives in a temporary data dir and is torn down by a finalizer, also when the
test fails; a teardown also SIGKILLs (by pid) any process still holding files in that dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from web3 import Web3

from tests.devnet import cli_env, describe, holders, running, tear_down, wait_until, zoo, zoo_popen
from zoo.devnet.genesis import genesis_library
from zoo.devnet.info import DevnetInfo, warp
from zoo.devnet.manager import Devnet, DevnetError
from zoo.devnet.process import ProcessRecord
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.provenance.weights import file_sha256
from zoo.node.client import NodeClient
from zoo.registry.canonical import decode_library
from zoo.registry.chain import LedgerClient, RegistryClient
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.merkle import library_root
from zoo.v1 import node_pb2

GENESIS_ROOT = library_root(genesis_library())
DEVNET_MODE = {"chain": {"mode": "devnet"}}
# No model to load (the node's chain side is what these tests look at): the model component degrades.
NO_MODEL = {"model": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "name": "none"}}
Shared = tuple[Path, subprocess.CompletedProcess[str]]


def read_state(data_dir: Path) -> dict:
    return json.loads((data_dir / "devnet" / "devnet.json").read_text())


def records(data_dir: Path) -> list[ProcessRecord]:
    return [ProcessRecord(**p) for p in read_state(data_dir)["processes"]]


def chain_id(rpc_url: str) -> int:
    reply = httpx.post(
        rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=5
    )
    return int(reply.json()["result"], 16)


def all_gone(recs: list[ProcessRecord]) -> bool:
    return not any(running(r.pid, r.start_ticks) for r in recs)


@pytest.fixture
def data_dirs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Factory of data dirs whose devnets are torn down after the test, whatever happened."""
    made: list[Path] = []

    def make(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        made.append(path)
        return path

    yield make
    for path in made:
        tear_down(path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One devnet brought up with the CLI, shared by the read-only tests of this module."""
    data_dir = tmp_path_factory.mktemp("shared-devnet")
    try:
        result = zoo("devnet", "up", "--data-dir", str(data_dir))
        yield data_dir, result
    finally:
        tear_down(data_dir)


# ------------------------------------------------------------------------------------------ up / status


def test_up_deploys_and_publishes_the_genesis_library(shared: Shared) -> None:
    data_dir, result = shared
    assert result.returncode == 0, result.stderr
    assert "devnet up in" in result.stderr
    state = read_state(data_dir)
    assert state["ready"] is True
    for key in ("rpc_url", "ipfs_api", "token_address", "registry_address"):
        assert state[key], f"{key} missing from devnet.json"
    assert Web3.is_checksum_address(state["registry_address"])
    assert Web3.is_checksum_address(state["token_address"])
    assert {p["name"] for p in state["processes"]} == {"anvil", "ipfs", "chain-state"}
    assert state["rpc_url"] in result.stdout and state["registry_address"] in result.stdout

    assert chain_id(state["rpc_url"]) == 31337
    w3 = Web3(Web3.HTTPProvider(state["rpc_url"]))
    assert w3.eth.get_code(state["registry_address"]) not in (b"", None)
    current = RegistryClient(w3, state["registry_address"]).current()
    assert current.version == 1
    assert current.root == GENESIS_ROOT
    assert current.cid == state["genesis"]["cid"]
    assert state["genesis"]["root"] == "0x" + GENESIS_ROOT.hex()

    with IpfsClient(state["ipfs_api"]) as ipfs:
        data = ipfs.fetch_verified(current.cid)
    assert decode_library(data) == genesis_library()
    # The bundled model is an approved base model from the start (by a passed call proposal, as any is), so
    # a library a job drafts on the default node can be proposed at once.
    bundled = file_sha256(bundled_gguf())
    assert RegistryClient(w3, state["registry_address"]).base_models() == [bundled]
    assert state["genesis"]["base_models"] == [bundled]


def test_second_up_reuses_the_running_devnet(shared: Shared) -> None:
    data_dir, _ = shared
    before = read_state(data_dir)
    result = zoo("devnet", "up", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stderr
    after = read_state(data_dir)
    assert after["processes"] == before["processes"]
    assert after["rpc_url"] == before["rpc_url"] and after["registry_address"] == before["registry_address"]
    assert all(running(r.pid, r.start_ticks) for r in records(data_dir))


def test_status_exit_code_says_whether_the_devnet_is_up(shared: Shared, tmp_path: Path) -> None:
    data_dir, _ = shared
    up = zoo("devnet", "status", "--data-dir", str(data_dir))
    assert up.returncode == 0, up.stderr
    assert read_state(data_dir)["rpc_url"] in up.stdout
    down = zoo("devnet", "status", "--data-dir", str(tmp_path / "never-started"))
    assert down.returncode == 1
    assert "not running" in down.stderr


# ---------------------------------------------------------------------------------------------- down


def test_down_stops_exactly_its_own_processes(shared: Shared, data_dirs: Callable[[str], Path]) -> None:
    other, _ = shared
    other_recs = records(other)
    mine = data_dirs("mine")
    assert zoo("devnet", "up", "--data-dir", str(mine)).returncode == 0
    my_recs = records(mine)
    assert {r.pid for r in my_recs}.isdisjoint(r.pid for r in other_recs)

    result = zoo("devnet", "down", "--data-dir", str(mine))
    assert result.returncode == 0, result.stderr
    assert "stopped chain-state, anvil, ipfs" in result.stderr
    assert all_gone(my_recs), f"still running after down: {describe([r.pid for r in my_recs])}"
    assert read_state(mine)["processes"] == [], "down must record that nothing runs any more"
    assert zoo("devnet", "status", "--data-dir", str(mine)).returncode == 1

    # The devnet of the other data dir is untouched and still answers.
    assert all(running(r.pid, r.start_ticks) for r in other_recs)
    assert Devnet(other).running() is not None
    assert chain_id(read_state(other)["rpc_url"]) == 31337
    assert zoo("devnet", "down", "--data-dir", str(mine)).stderr.strip() == "no devnet process was running"


def test_corrupt_state_is_reset_by_down_as_up_advises(data_dirs: Callable[[str], Path]) -> None:
    data_dir = data_dirs("corrupt")
    state = data_dir / "devnet" / "devnet.json"
    state.parent.mkdir()
    state.write_text('{"rpc_url": ')  # e.g. a disk that filled up mid-write by another tool

    refused = zoo("devnet", "up", "--data-dir", str(data_dir))
    assert refused.returncode == 1
    assert "is corrupt" in refused.stderr and "zoo-node devnet down" in refused.stderr

    problems = []
    status = zoo("devnet", "status", "--data-dir", str(data_dir))
    if status.returncode != 1 or "Traceback" in status.stderr:
        tail = ("Traceback… " if "Traceback" in status.stderr else "") + status.stderr.strip()[-300:]
        problems.append(f"`devnet status` should exit 1 with a message, got {status.returncode} and: {tail}")
    reset = zoo("devnet", "down", "--data-dir", str(data_dir))
    if reset.returncode != 0 or "Traceback" in reset.stderr:
        tail = ("Traceback… " if "Traceback" in reset.stderr else "") + reset.stderr.strip()[-300:]
        problems.append(
            f"`devnet down` (as `up` advises) should reset it, got {reset.returncode} and: {tail}"
        )
    assert not problems, "on a corrupt devnet.json: " + "; ".join(problems)
    assert not state.exists()
    again = zoo("devnet", "up", "--data-dir", str(data_dir))
    assert again.returncode == 0, again.stderr


def _kill_up_when(data_dir: Path, ready: Callable[[], bool]) -> tuple[subprocess.Popen[bytes], dict]:
    """Start `devnet up`, SIGKILL it (only it) as soon as `ready()`; returns it and the state it left."""
    proc = zoo_popen("devnet", "up", "--data-dir", str(data_dir))
    try:
        assert wait_until(lambda: ready() or proc.poll() is not None, 60, 0.01)
        assert proc.poll() is None, "`devnet up` finished before the moment to kill it"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    return proc, read_state(data_dir)


def _recorded(data_dir: Path, name: str) -> bool:
    try:
        return any(p["name"] == name for p in read_state(data_dir)["processes"])
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def _assert_down_leaves_nothing_and_up_works(data_dir: Path, state: dict) -> None:
    recs = [ProcessRecord(**p) for p in state["processes"]]
    result = zoo("devnet", "down", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert all_gone(recs), f"recorded processes survived `devnet down`: {describe([r.pid for r in recs])}"
    # Short-lived helpers (e.g. `jsipfs init`) may still be finishing; a daemon would never go away.
    wait_until(lambda: not holders(data_dir), 6.0, 0.1)
    left = holders(data_dir)
    assert not left, (
        "orphaned devnet processes survive `devnet up` being killed and `devnet down` "
        f"(devnet.json recorded only {[r.name for r in recs]}): {describe(left)}"
    )
    again = zoo("devnet", "up", "--data-dir", str(data_dir))
    assert again.returncode == 0, f"`devnet up` after the kill failed:\n{again.stderr}"
    assert Devnet(data_dir).running() is not None
    assert zoo("devnet", "down", "--data-dir", str(data_dir)).returncode == 0


def test_no_orphans_when_up_is_killed_after_anvil_started(data_dirs: Callable[[str], Path]) -> None:
    data_dir = data_dirs("killed-after-anvil")
    _, state = _kill_up_when(data_dir, lambda: _recorded(data_dir, "anvil"))
    assert state["ready"] is False
    anvil = next(ProcessRecord(**p) for p in state["processes"] if p["name"] == "anvil")
    assert running(anvil.pid, anvil.start_ticks), "anvil should outlive the killed `up` (no pdeathsig there)"
    _assert_down_leaves_nothing_and_up_works(data_dir, state)


def test_no_orphans_when_up_is_killed_while_ipfs_starts(data_dirs: Callable[[str], Path]) -> None:
    """Killed after the IPFS daemon was spawned but before it answered (so before manager.py records it)."""
    data_dir = data_dirs("killed-during-ipfs")
    log = data_dir / "devnet" / "ipfs" / "zoo-daemon.log"

    def stdout_of(pid: int) -> str:
        try:
            return os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            return ""

    def daemon_spawned() -> bool:
        # A process writes its output to the daemon's log: the daemon exists (`up` itself does not).
        return log.exists() and any(stdout_of(pid) == str(log.resolve()) for pid in holders(data_dir))

    _, state = _kill_up_when(data_dir, daemon_spawned)
    assert state["ready"] is False
    _assert_down_leaves_nothing_and_up_works(data_dir, state)


# ------------------------------------------------------------------------------------ ProcessRecord


def test_process_record_ignores_a_process_with_other_start_ticks() -> None:
    me = ProcessRecord.of("me", os.getpid())
    assert me.alive()
    impostor = ProcessRecord("me", os.getpid(), me.start_ticks + 1)
    assert not impostor.alive()
    assert impostor.stop(timeout_s=0.5) is False

    # A process in its own group (as devnet processes are), so a wrong stop() would really reach it.
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real = ProcessRecord.of("sleep", child.pid)
        for ticks in (real.start_ticks - 1, real.start_ticks + 1):
            stale = ProcessRecord("sleep", child.pid, ticks)
            assert not stale.alive()
            assert stale.stop(timeout_s=0.5) is False
        time.sleep(0.2)
        assert child.poll() is None, "stop() signalled a process whose start time does not match the record"
        # The matching record does stop it: the checks above could have failed.
        assert real.alive()
        assert real.stop(timeout_s=5) is True
        assert not real.alive()
        assert not running(child.pid, real.start_ticks)
    finally:
        if child.poll() is None:
            child.kill()
        with contextlib.suppress(ChildProcessError):
            child.wait(5)


# ------------------------------------------------------------------------------------ node integration


@pytest.fixture
def node_data(start_node: Callable[..., object], tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Tears down the devnets in the data dirs of nodes started by start_node (data dir: NAME-data)."""
    dirs: list[Path] = []

    def data_dir(name: str = "node") -> Path:
        path = tmp_path / f"{name}-data"
        dirs.append(path)
        return path

    yield data_dir
    for path in dirs:
        tear_down(path)


def wait_status(
    address: str, ok: Callable[[node_pb2.NodeStatus], bool], timeout_s: float = 90
) -> node_pb2.NodeStatus:
    deadline = time.monotonic() + timeout_s
    with NodeClient(address) as client:
        while True:
            st = client.status()
            if ok(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"node status never matched:\n{st}")
            time.sleep(0.2)


def states(st: node_pb2.NodeStatus) -> dict[str, str]:
    return {
        c.name: node_pb2.ComponentState.Name(c.state).removeprefix("COMPONENT_STATE_") for c in st.components
    }


def synced(st: node_pb2.NodeStatus) -> bool:
    s = states(st)
    return st.library.version == 1 and all(s.get(c) == "SERVING" for c in ("chain", "ipfs", "library"))


def settling(st: node_pb2.NodeStatus) -> bool:
    return states(st).get("settlement") == "SERVING"


def detail(st: node_pb2.NodeStatus, name: str) -> str:
    return next(c.detail for c in st.components if c.name == name)


def node_registrations(state: dict, node: str) -> list[tuple[int, bool]]:
    """(id, executed) of each DAO call proposal of the UsageLedger's registerNode(node), oldest first; and
    the ledger must say registered exactly when one was executed."""
    w3 = Web3(Web3.HTTPProvider(state["rpc_url"]))
    ledger = LedgerClient(w3, state["ledger_address"])
    registry = RegistryClient(w3, state["registry_address"])
    call = ledger.governor_call("registerNode", node)
    found = []
    for e in registry.call_proposed_events():
        if e.target == state["ledger_address"] and e.data == call:
            proposal = registry.proposal(e.proposal_id)
            found.append((e.proposal_id, proposal is not None and proposal.executed))
    assert ledger.is_registered(node) == any(executed for _, executed in found), found
    return found


def test_node_starts_its_own_devnet_and_stops_it_on_sigterm(start_node, node_data) -> None:
    data_dir = node_data("node")
    node = start_node(extra=DEVNET_MODE)
    st = wait_status(node.address, synced)
    assert st.chain_id == 31337
    assert st.library.root == "0x" + GENESIS_ROOT.hex()
    assert st.library.cid == read_state(data_dir)["genesis"]["cid"]
    assert st.library.experience_count == len(genesis_library().experiences)
    # The devnet registered the node's own account on its UsageLedger (one passed DAO call proposal), so
    # settlement serves from the first start instead of asking for `dao propose-node`.
    st = wait_status(node.address, settling, timeout_s=60)
    assert [executed for _, executed in node_registrations(read_state(data_dir), st.node_address)] == [True]
    recs = records(data_dir)
    assert {r.name for r in recs} == {"anvil", "ipfs", "chain-state"}

    assert node.stop(signal.SIGTERM) == 0, node.log()
    assert wait_until(lambda: all_gone(recs), 10), (
        f"devnet outlived its node: {describe([r.pid for r in recs])}"
    )
    # The chain is kept for the next start: the deployment record and the saved state stay.
    saved = read_state(data_dir)
    assert saved["processes"] == [] and saved["ready"] is False and saved["registry_address"]
    assert (data_dir / "devnet" / "chain-state.json").stat().st_size > 0


def test_node_killed_with_sigkill_takes_its_devnet_along_and_keeps_its_chain(start_node, node_data) -> None:
    data_dir = node_data("node")
    node = start_node(extra=DEVNET_MODE)
    recs = records(data_dir)
    before = read_state(data_dir)
    assert before["ready"] is True
    assert all(running(r.pid, r.start_ticks) for r in recs)
    registered = node_registrations(before, wait_status(node.address, settling, timeout_s=60).node_address)
    assert len(registered) == 1
    # A proposal with a vote, made while the node runs; the keeper saves it within a second.
    w3 = Web3(Web3.HTTPProvider(before["rpc_url"]))
    proposed = RegistryClient(w3, before["registry_address"], dev_account(0)).propose(
        b"\x42" * 32, before["genesis"]["cid"], tree_size=3
    )
    warp(w3, 1)
    RegistryClient(w3, before["registry_address"], dev_account(1)).vote(proposed.proposal_id, True)
    saved_at = time.time()
    time.sleep(1.5)

    os.kill(node.proc.pid, signal.SIGKILL)  # the node alone, not its process group
    node.proc.wait(10)
    assert wait_until(lambda: all_gone(recs), 15), (
        f"devnet processes orphaned by kill -9 of the node: {describe([r.pid for r in recs])}"
    )
    assert (data_dir / "devnet" / "chain-state.json").stat().st_mtime >= saved_at - 1

    again = start_node(extra=DEVNET_MODE)
    wait_status(again.address, synced)
    after = read_state(data_dir)
    # The resumed chain kept the node's registration: settlement serves, and nothing was proposed again.
    st = wait_status(again.address, settling, timeout_s=60)
    assert node_registrations(after, st.node_address) == registered
    assert (after["registry_address"], after["genesis"]) == (before["registry_address"], before["genesis"])
    w3 = Web3(Web3.HTTPProvider(after["rpc_url"]))
    registry = RegistryClient(w3, after["registry_address"])
    kept = registry.proposal(proposed.proposal_id)
    assert kept is not None and kept.for_weight == 10**12, "the proposal and its vote were lost"
    assert registry.has_voted(proposed.proposal_id, dev_account(1).address)
    assert "resuming the saved chain" in again.log()


def test_devnet_resumes_after_down_and_reset_starts_over(data_dirs: Callable[[str], Path]) -> None:
    data_dir = data_dirs("resume")
    devnet = Devnet(data_dir)
    info, _ = devnet.up(die_with_parent=True)
    w3 = Web3(Web3.HTTPProvider(info.rpc_url))
    proposed = RegistryClient(w3, info.registry_address, dev_account(0)).propose(
        b"\x43" * 32, info.genesis["cid"], tree_size=3
    )
    last = warp(w3, 3600)  # the devnet clock runs ahead of the wall clock, as after `devnet warp`
    assert sorted(devnet.down()) == ["anvil", "chain-state", "ipfs"]

    t0 = time.perf_counter()
    resumed, reused = devnet.up(die_with_parent=True)
    took = time.perf_counter() - t0
    assert not reused and resumed.registry_address == info.registry_address
    w3 = Web3(Web3.HTTPProvider(resumed.rpc_url))
    registry = RegistryClient(w3, resumed.registry_address)
    assert registry.proposal(proposed.proposal_id) is not None
    assert [e.proposal_id for e in registry.proposal_created_events()][-1] == proposed.proposal_id
    assert warp(w3, 1) > last, "the resumed chain's clock went back"
    assert took < 30, f"resuming took {took:.1f} s"

    # A saved devnet that this version cannot use is refused with the way out, never half-resumed.
    devnet.down()
    saved = devnet.state_file.read_bytes()
    devnet.state_file.write_text(saved.decode().replace(info.contracts_key, "0" * 64))
    with pytest.raises(DevnetError, match=r"other contract sources.*devnet reset"):
        devnet.up(die_with_parent=True)
    devnet.state_file.write_bytes(saved)
    state = devnet.chain_state_file.read_bytes()
    devnet.chain_state_file.write_bytes(state[: len(state) // 2])  # e.g. written by another tool, cut short
    with pytest.raises(DevnetError, match=r"(?s)cannot be loaded.*devnet reset"):
        devnet.up(die_with_parent=True)
    assert not holders(data_dir), describe(holders(data_dir))

    result = zoo("devnet", "reset", "--yes", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert "deleted the devnet chain" in result.stderr
    assert not (data_dir / "devnet" / "chain-state.json").exists()
    assert not (data_dir / "devnet" / "ipfs").exists()
    fresh, _ = devnet.up(die_with_parent=True)
    w3 = Web3(Web3.HTTPProvider(fresh.rpc_url))
    registry = RegistryClient(w3, fresh.registry_address)
    assert registry.proposal(proposed.proposal_id) is None and registry.current().version == 1


def test_reset_asks_before_deleting(data_dirs: Callable[[str], Path]) -> None:
    data_dir = data_dirs("ask")
    (data_dir / "devnet").mkdir()
    (data_dir / "devnet" / "chain-state.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "devnet", "reset", "--data-dir", str(data_dir)], input="n\n",
        capture_output=True,
        text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert result.returncode == 1 and "nothing deleted" in result.stderr
    assert (data_dir / "devnet" / "chain-state.json").exists()


def test_node_leaves_a_devnet_it_did_not_start_running(start_node, node_data) -> None:
    data_dir = node_data("node")
    result = zoo("devnet", "up", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    info: DevnetInfo | None = Devnet(data_dir).running()
    assert info is not None
    recs = records(data_dir)

    node = start_node(extra=DEVNET_MODE)
    st = wait_status(node.address, synced)
    chain = next(c for c in st.components if c.name == "chain")
    assert info.rpc_url in chain.detail, "the node should use the devnet that was already up"
    assert node.stop(signal.SIGTERM) == 0, node.log()

    assert all(running(r.pid, r.start_ticks) for r in recs), "the node stopped a devnet it did not start"
    still = Devnet(data_dir).running()
    assert still is not None and still.rpc_url == info.rpc_url
    assert chain_id(still.rpc_url) == 31337


def test_node_is_registered_on_a_devnet_made_without_it_once_per_key(start_node, node_data) -> None:
    data_dir = node_data("node")
    # A devnet brought up on its own, as every devnet was before nodes were registered: no node on its
    # ledger. The node that starts on it (its own data dir's devnet) gets registered by its DAO.
    assert zoo("devnet", "up", "--data-dir", str(data_dir)).returncode == 0
    state = read_state(data_dir)
    node = start_node(extra={**DEVNET_MODE, **NO_MODEL})
    first = wait_status(node.address, settling, timeout_s=90).node_address
    assert [executed for _, executed in node_registrations(state, first)] == [True]
    assert node.stop() == 0, node.log()

    # Started again on the same data dir: registered already, so nothing is proposed.
    again = start_node(extra={**DEVNET_MODE, **NO_MODEL})
    assert wait_status(again.address, settling, timeout_s=90).node_address == first
    assert len(node_registrations(state, first)) == 1
    assert again.stop() == 0, again.log()

    # A new key is a new node to the chain: it gets its own registration; the old one's stays.
    (data_dir / "node.key").unlink()
    renewed = start_node(extra={**DEVNET_MODE, **NO_MODEL})
    second = wait_status(renewed.address, settling, timeout_s=90).node_address
    assert second != first
    assert [executed for _, executed in node_registrations(state, second)] == [True]
    assert len(node_registrations(state, first)) == 1


def test_a_node_on_a_chain_it_does_not_own_is_not_registered(shared: Shared, start_node) -> None:
    data_dir, _ = shared
    state = read_state(data_dir)
    chain = {
        "mode": "external",
        "rpc_url": state["rpc_url"],
        "registry_address": state["registry_address"],
        "ledger_address": state["ledger_address"],
        "from_block": state["deploy_block"],
    }
    node = start_node(extra={"chain": chain, "ipfs": {"api_url": state["ipfs_api"]}, **NO_MODEL})
    st = wait_status(node.address, lambda st: "propose-node" in detail(st, "settlement"))
    assert states(st)["settlement"] == "DEGRADED"
    assert f"node {st.node_address} is not registered on the UsageLedger" in detail(st, "settlement")
    assert f"`zoo-node dao propose-node {st.node_address}`" in detail(st, "settlement")
    assert node_registrations(state, st.node_address) == []


def test_a_failed_registration_does_not_stop_the_node(tmp_path: Path) -> None:
    from zoo.node.datadir import DataDir
    from zoo.node.endpoints import register_on_devnet

    devnet = Devnet(tmp_path / "data")  # its chain is down (never started)
    with pytest.raises(DevnetError, match="not running"):
        devnet.register_node(dev_account(9).address)
    # The node starts unregistered (settlement says so) rather than not at all.
    assert register_on_devnet(devnet, DataDir(tmp_path / "data")) is False
    assert (tmp_path / "data" / "node.key").exists()


@pytest.mark.parametrize("setting", ["anvil_port", "ipfs_api_port"])
def test_start_fails_clearly_when_the_devnet_cannot_start(start_node, node_data, setting: str) -> None:
    data_dir = node_data("node")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        node = start_node(extra={**DEVNET_MODE, "devnet": {setting: port}}, wait=False)
        try:
            code = node.proc.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node kept running without a devnet:\n{node.log()}") from None
    log = node.log()
    assert code == 1, log
    assert "zoo-node: the devnet failed to start" in log
    assert "already in use" in log
    assert str(port) in log or setting == "anvil_port"  # anvil's own message does not repeat the port
    assert not (data_dir / "node.json").exists()
    # Whatever had started (anvil, when IPFS is the part that failed) was stopped again.
    assert read_state(data_dir)["processes"] == []
    assert not holders(data_dir), describe(holders(data_dir))
