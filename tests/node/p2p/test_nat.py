"""A node behind NAT (network namespaces, iptables masquerade: tests/node/p2p/netlab.py NatLab) reached
through a relay: three real daemons on one devnet.

R (public, `p2p.relay_service`) relays; N (private 192.168.81.2, behind the gateway's masquerade) lists R
in `p2p.relays`, serves the bundled model and is the only node with IPFS; C (public, a light node) knows
only R. N walks no DHT (`p2p.discovery = false`), so it never dials C itself: every connection C has to
N is one C made through R, the only way in. C answers requests for N's model (gRPC over libp2p through
the relay), R and C sync library versions whose bytes only N had, and after R is killed and restarted N
reserves again and is reachable again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import tomli_w

from tests.conftest import NodeProcess
from tests.node.p2p.netlab import NAT_SERVICE_IP, Forwarder, NatLab, nat_unavailable
from tests.node.p2p.test_network import answered_through
from tests.node.test_node_sync import chain_of, status, wait_until
from tests.registry.test_sync import Chain
from zoo.devnet.info import DevnetInfo
from zoo.devnet.manager import Devnet
from zoo.node.client import NodeClient
from zoo.node.p2p.host import load_identity, peer_id_of
from zoo.registry.library_store import root_hex
from zoo.registry.merkle import library_root
from zoo.v1 import inference_pb2, node_pb2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nat_unavailable() is not None, reason=str(nat_unavailable())),
]
BUNDLED = "HuggingFaceTB/SmolLM2-135M-Instruct"
PORT = 4001


@dataclass
class Nat:
    lab: NatLab
    tmp: Path
    info: DevnetInfo
    chain: Chain
    forward: Forwarder
    ids: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    def ip(self, name: str) -> str:
        return NatLab.PRIVATE_IP if name == "n" else NatLab.public_ip({"r": "znr", "c": "znc"}[name])

    def addr(self, name: str) -> str:
        return f"/ip4/{self.ip(name)}/tcp/{PORT}/p2p/{self.ids[name]}"

    def config(self, name: str) -> dict:
        ip, relay = self.ip(name), self.addr("r")
        rpc, ipfs = (int(u.rsplit(":", 1)[1]) for u in (self.info.rpc_url, self.info.ipfs_api))
        p2p: dict = {"listen": f"/ip4/{ip}/tcp/{PORT}", "redial_interval_s": 0.5}
        p2p |= {"capabilities_interval_s": 0.5, "capabilities_ttl_s": 6.0}
        if name == "r":
            p2p |= {"relay_service": True}
        elif name == "n":
            p2p |= {"bootstrap": [relay], "relays": [relay], "discovery": False}
        else:
            p2p |= {"bootstrap": [relay]}
        return {
            "data_dir": str(self.tmp / name),
            "server": {"listen": f"{ip}:0", "grace_period_s": 2},
            "metrics": {"listen": f"{ip}:0"},
            "http": {"enabled": False},
            "chain": {
                "mode": "external",
                "rpc_url": self.forward.url(rpc),
                "registry_address": self.info.registry_address,
                "from_block": self.info.deploy_block,
                "poll_interval_s": 0.5,
            },
            "ipfs": {"api_url": self.forward.url(ipfs)} if name == "n" else {},
            "model": {"threads": 1} if name == "n" else {"backend": "none"},
            "inference": {"default_max_tokens": 8},
            "p2p": p2p,
        }

    def start(self, name: str) -> NodeProcess:
        config = self.tmp / f"{name}.toml"
        config.write_text(tomli_w.dumps(self.config(name)))
        ns = {"r": "znr", "n": "znn", "c": "znc"}[name]
        node = self.nodes[name] = self.lab.start(ns, config, self.tmp / name)
        node.wait_listening(120)
        return node


def listen_addrs(node: NodeProcess) -> list[str]:
    with NodeClient(node.address) as client:
        return list(client.peers().listen_addrs)


def connected(node: NodeProcess) -> set[str]:
    with NodeClient(node.address) as client:
        return {p.peer_id for p in client.peers().peers if p.connected}


@pytest.fixture(scope="module")
def nat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nat]:
    tmp = tmp_path_factory.mktemp("nat")
    devnet = Devnet(tmp / "devnet")
    info, _ = devnet.up(die_with_parent=True)
    lab = NatLab()
    forward = Forwarder([int(u.rsplit(":", 1)[1]) for u in (info.rpc_url, info.ipfs_api)], NAT_SERVICE_IP)
    n = Nat(lab, tmp, info, chain_of(info), forward)
    for name in "rnc":
        n.ids[name] = peer_id_of(load_identity(tmp / name / "p2p" / "identity.key"))
    try:
        for name in "rnc":
            n.start(name)
        n.nodes["n"].wait_component("model", "SERVING", timeout_s=180)
        for name, node in n.nodes.items():
            wait_until(
                f"version 1 active on {name}", lambda nd=node: status(nd).library.version >= 1, 120, node
            )
        yield n
    finally:
        for node in n.nodes.values():
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
        forward.close()
        lab.close()
        n.chain.ipfs.close()
        devnet.down()


def capable_at(node: NodeProcess, peer_id: str) -> bool:
    with NodeClient(node.address) as client:
        return any(p.peer_id == peer_id and p.HasField("capabilities") for p in client.peers().peers)


def circuit(nat: Nat) -> str:
    return f"{nat.addr('r')}/p2p-circuit/p2p/{nat.ids['n']}"


def test_the_node_behind_nat_is_reached_only_through_the_relay(nat: Nat) -> None:
    n, c = nat.nodes["n"], nat.nodes["c"]
    wait_until("N's relayed address", lambda: circuit(nat) in listen_addrs(n), 30, n)
    # Nothing on the public side can open a connection to the private address ...
    assert "unreachable" in nat.lab.can_connect("znc", NatLab.PRIVATE_IP, PORT)
    assert "unreachable" in nat.lab.can_connect("znr", NatLab.PRIVATE_IP, PORT)
    # ... while N's own connections go out, masqueraded as the gateway's public address.
    assert nat.lab.can_connect("znn", NatLab.public_ip("znc"), PORT) == "ok"

    # C learns N's relayed address from N's capabilities (gossiped through R), first of N's addresses.
    def n_addrs_at_c() -> list[str]:
        with NodeClient(c.address) as client:
            return next((list(p.addrs) for p in client.peers().peers if p.peer_id == nat.ids["n"]), [])

    wait_until("N's relayed address at C", lambda: n_addrs_at_c()[:1] == [circuit(nat)], 60, c)


def test_a_request_at_the_public_node_is_answered_by_the_node_behind_nat(nat: Nat) -> None:
    n, c = nat.nodes["n"], nat.nodes["c"]
    wait_until("N capable at C", lambda: capable_at(c, nat.ids["n"]), 60, c)
    answered_through(c, n, nat.ids["n"])
    assert nat.ids["n"] in connected(c)  # routing dialled N through R: N never dials C (no DHT walk)
    with NodeClient(c.address) as client, pytest.raises(grpc.RpcError) as e:
        # N's verdict on bad input comes back through the relay as N gave it.
        client.inference.Infer(
            inference_pb2.InferRequest(
                prompt="hi", model=BUNDLED, sampling=inference_pb2.SamplingParams(top_p=7)
            ),
            timeout=60,
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_library_bytes_only_the_node_behind_nat_holds_reach_the_public_nodes(nat: Nat) -> None:
    lib = nat.chain.next_library(2)
    nat.chain.approve_library(lib)
    root = root_hex(library_root(lib))
    for name, node in nat.nodes.items():
        wait_until(f"{name} on the new root", lambda nd=node: status(nd).library.root == root, 90, node)
    for name in "rc":  # no IPFS: their verified copies came from peers, and only N had the bytes
        assert "library content fetched from a peer" in nat.nodes[name].log()


def test_after_the_relay_restarts_the_node_behind_nat_reserves_again(nat: Nat) -> None:
    r, n, c = nat.nodes["r"], nat.nodes["n"], nat.nodes["c"]
    os.killpg(r.proc.pid, signal.SIGKILL)
    r.proc.wait()
    wait_until("N without its relay", lambda: nat.ids["r"] not in connected(n), 60, n)
    time.sleep(1)
    r = nat.start("r")  # same identity and port: the address N was given
    wait_until(
        "N's slot at the restarted relay", lambda: n.log().count("p2p relay slot reserved") >= 2, 60, n
    )
    assert circuit(nat) in listen_addrs(n)
    # A fresh reservation: the restarted relay knows nothing of the old one, and C's circuit is new too.
    request = inference_pb2.InferRequest(
        prompt="Hi", model=BUNDLED, sampling=inference_pb2.SamplingParams(max_tokens=4)
    )

    def answered_by_n() -> bool:
        with NodeClient(c.address) as client:
            try:
                return client.inference.Infer(request, timeout=60).served_by == nat.ids["n"]
            except grpc.RpcError:
                return False  # N's old relayed connection is still being given up on: ask again

    wait_until("C answered by N again", answered_by_n, 120, c)
    state = {x.name: node_pb2.ComponentState.Name(x.state) for x in status(c).components}
    assert state["p2p"] == "COMPONENT_STATE_SERVING"
