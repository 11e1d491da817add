"""End to end: a real zoo-node subprocess in devnet mode follows DAO-approved library versions.

One node (which brings up and owns its devnet) serves the approval, refusal and IPFS-outage scenarios;
the kill -9 scenario runs its own node on a devnet the test starts, so the chain outlives the node.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from web3 import Web3

from tests.conftest import NodeProcess, base_config, launch, write_config
from tests.registry.test_sync import Chain
from zoo.devnet.info import DevnetInfo
from zoo.devnet.ipfs_daemon import IpfsDaemon
from zoo.devnet.manager import Devnet
from zoo.node.client import NodeClient
from zoo.registry.canonical import encode_library
from zoo.registry.ipfs import IpfsClient
from zoo.registry.library_store import LibraryStore, root_hex
from zoo.registry.merkle import library_root
from zoo.v1 import node_pb2

NODE_EXTRA = {
    "chain": {"mode": "devnet", "poll_interval_s": 0.5, "probe_interval_s": 1.0},
    "ipfs": {"timeout_s": 10.0, "probe_interval_s": 1.0},
}


def chain_of(info: DevnetInfo) -> Chain:
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
    return Chain(info, w3, IpfsClient(info.ipfs_api, timeout=10))


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 30.0, node: NodeProcess | None = None):
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    log = node.log()[-6000:] if node else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})\n{log}")


def status(node: NodeProcess) -> node_pb2.NodeStatus:
    with NodeClient(node.address) as client:
        return client.status()


def component(node: NodeProcess, name: str) -> tuple[str, str]:
    for c in status(node).components:
        if c.name == name:
            return node_pb2.ComponentState.Name(c.state).removeprefix("COMPONENT_STATE_"), c.detail
    raise AssertionError(f"no component {name}")


def metric(node: NodeProcess, name: str, **labels: str) -> float:
    """Sum of the samples of a metric whose labels include `labels` (all label sets by default)."""
    total = 0.0
    for line in httpx.get(node.metrics_url, timeout=5).text.splitlines():
        if line.startswith((name + " ", name + "{")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def own_node_info(node: NodeProcess) -> dict[str, Any] | None:
    """node.json once `node` has written it (a node killed with -9 leaves its own behind)."""
    if node.proc.poll() is not None:
        raise AssertionError(f"node exited with {node.proc.returncode}:\n{node.log()[-6000:]}")
    try:
        info = json.loads((node.data_dir / "node.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if info.get("pid") == node.proc.pid else None


@dataclass
class Shared:
    node: NodeProcess
    chain: Chain
    data_dir: Path
    cleanup: list[Callable[[], None]] = field(default_factory=list)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    tmp = tmp_path_factory.mktemp("node-sync")
    data_dir = tmp / "data"
    node = launch(write_config(tmp / "node.toml", base_config(data_dir, NODE_EXTRA)), data_dir)
    s: Shared | None = None
    try:
        node.wait_listening()
        node.wait_component("library", "SERVING", timeout_s=60)
        info = Devnet(data_dir).info()
        assert info is not None and info.ready
        s = Shared(node, chain_of(info), data_dir)
        yield s
        assert node.stop() == 0
    finally:
        if node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()
        for undo in s.cleanup if s else []:
            undo()
        # The node stops the devnet it owns; nothing it recorded may still run.
        info = Devnet(data_dir).info()
        assert info is None or not any(p.alive() for p in info.processes)


def test_approved_version_reaches_the_running_node(shared: Shared) -> None:
    node, chain = shared.node, shared.chain
    before = status(node).library
    assert before.version == chain.registry.current().version
    lib = chain.next_library(3)
    cid = chain.approve_library(lib)
    root = root_hex(library_root(lib))

    wait_until("the new root in GetStatus", lambda: status(node).library.root == root, node=node)
    got = status(node).library
    assert (got.version, got.cid, got.experience_count) == (lib.version, cid, 3)
    assert metric(node, "zoo_library_version") == lib.version
    assert metric(node, "zoo_library_experiences") == 3
    assert component(node, "library")[0] == "SERVING"
    cur = LibraryStore(shared.data_dir).current()
    assert cur is not None and cur.library == lib


def test_content_not_matching_the_onchain_root_is_refused(shared: Shared) -> None:
    node, chain = shared.node, shared.chain
    before = status(node).library
    refused_before = metric(node, "zoo_library_refused_total")
    integrity_before = metric(node, "zoo_library_refused_total", reason="IntegrityError")
    approved, other = chain.next_library(2), chain.next_library(2)
    chain.approve(library_root(approved), chain.ipfs.add(encode_library(other)), len(approved.experiences))

    wait_until(
        "zoo_library_refused_total to increase",
        lambda: metric(node, "zoo_library_refused_total") > refused_before,
        node=node,
    )
    state, detail = wait_until(
        "the library component to report the refusal",
        lambda: (c := component(node, "library"))[1].find("refused") >= 0 and c,
        node=node,
    )
    # Still serving the last verified version, but the chain's current one is not it: status says so.
    assert state == "DEGRADED"
    assert f"older than the chain's version {approved.version}" in detail
    assert f"library version {approved.version} (root {root_hex(library_root(approved))}" in detail
    assert metric(node, "zoo_component_state", component="library", state="degraded") == 1
    time.sleep(1.5)  # a few more polls: the refusal sticks
    after = status(node).library
    assert (after.root, after.version, after.cid) == (before.root, before.version, before.cid)
    assert metric(node, "zoo_library_version") == before.version
    assert metric(node, "zoo_library_refused_total") == refused_before + 1, "refused more than once"
    integrity_after = metric(node, "zoo_library_refused_total", reason="IntegrityError")

    # The next valid version (whose parent is the refused root) is taken.
    good = chain.next_library(1)
    chain.approve_library(good)
    wait_until(
        "the version after the refused one",
        lambda: status(node).library.root == root_hex(library_root(good)),
        node=node,
    )
    assert status(node).library.version == good.version
    wait_until(
        "the library component to serve again", lambda: component(node, "library")[0] == "SERVING", node=node
    )
    # The reason label names what failed (a root mismatch is an IntegrityError), not just "Refused".
    samples = [
        x for x in httpx.get(node.metrics_url).text.splitlines() if x.startswith("zoo_library_refused")
    ]
    assert integrity_after == integrity_before + 1, samples


def test_ipfs_outage_degrades_then_recovers(shared: Shared) -> None:
    node, chain, data_dir = shared.node, shared.chain, shared.data_dir
    before = status(node).library
    lib = chain.next_library(2)
    cid = chain.ipfs.add(encode_library(lib))  # published while IPFS is up; it stays in the repository
    info = Devnet(data_dir).info()
    assert info is not None
    (ipfs_record,) = [p for p in info.processes if p.name == "ipfs"]
    assert ipfs_record.stop()
    assert not ipfs_record.alive()

    chain.approve(library_root(lib), cid, len(lib.experiences))
    _, detail = wait_until(
        "the library component to degrade",
        lambda: (c := component(node, "library"))[0] == "DEGRADED" and c,
        node=node,
    )
    assert "sync failing" in detail
    still = status(node).library
    assert (still.root, still.version) == (before.root, before.version)
    assert metric(node, "zoo_library_version") == before.version

    port = urlparse(info.ipfs_api).port
    assert port
    daemon = IpfsDaemon(data_dir / "devnet" / "ipfs", port, die_with_parent=True).start()
    shared.cleanup.append(daemon.stop)
    assert daemon.api_url == info.ipfs_api

    root = root_hex(library_root(lib))
    wait_until("the new root after IPFS is back", lambda: status(node).library.root == root, 60, node)
    wait_until("library SERVING", lambda: component(node, "library")[0] == "SERVING", 10, node)
    assert status(node).library.version == lib.version
    assert metric(node, "zoo_library_version") == lib.version


def test_kill_9_during_sync_then_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # The devnet belongs to the test, not the node, so the chain outlives the node's kill -9.
    devnet = Devnet(data_dir)
    info, _ = devnet.up(die_with_parent=True)
    chain = chain_of(info)
    cfg = write_config(tmp_path / "node.toml", base_config(data_dir, NODE_EXTRA))
    node = launch(cfg, data_dir)
    restarted: NodeProcess | None = None
    try:
        node.wait_listening()
        node.wait_component("library", "SERVING", timeout_s=60)
        assert status(node).library.version == 1

        big = chain.next_library(3000)  # ~1 MB: the sync takes long enough to be interrupted
        chain.approve_library(big)
        big_root = root_hex(library_root(big))
        version_file = data_dir / "library" / "versions" / f"v{big.version}-{big_root}.json"
        deadline = time.monotonic() + 30
        while not version_file.exists():  # the node has stored it; it may not have activated it yet
            assert time.monotonic() < deadline, f"the node never stored version {big.version}:\n{node.log()}"
            time.sleep(0.002)
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
        assert node.proc.returncode == -signal.SIGKILL

        store = LibraryStore(data_dir)
        assert list((data_dir / "library").rglob(".*.tmp")) == []
        cur = store.current()  # verified against its root, or IntegrityError
        assert cur is not None and cur.version in (1, big.version)
        print(f"kill -9 landed {'before' if cur.version == 1 else 'after'} the new version was activated")
        assert cur.root == "0x" + chain.registry.version_at(cur.version).root.hex()

        # The chain moves on while the node is down.
        later = chain.next_library(2)
        later_cid = chain.approve_library(later)
        assert chain.registry.current().version == big.version + 1

        restarted = launch(cfg, data_dir)
        restarted.info = wait_until("the restarted node to listen", lambda: own_node_info(restarted), 60)
        later_root = root_hex(library_root(later))
        wait_until("the chain's current version", lambda: status(restarted).library.root == later_root, 60)
        got = status(restarted).library
        assert (got.version, got.cid) == (later.version, later_cid)
        assert component(restarted, "library")[0] == "SERVING"
        cur = LibraryStore(data_dir).current()
        assert cur is not None and cur.library == later
        assert restarted.stop() == 0
    finally:
        for n in (node, restarted):
            if n is not None and n.proc.poll() is None:
                os.killpg(n.proc.pid, signal.SIGKILL)
                n.proc.wait()
        chain.ipfs.close()
        assert sorted(devnet.down()) == ["anvil", "chain-state", "ipfs"]
