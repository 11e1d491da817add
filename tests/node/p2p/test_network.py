"""Three real zoo-node daemons on one devnet, connected over libp2p on 127.0.0.1.

Node A has IPFS and no bootstrap peers; B has IPFS and bootstraps from A; C has no IPFS at all and
bootstraps from A, so every library version C holds came from a peer. Only B loads a model (the bundled
one); A and C are light nodes (model.backend = 'none'), so whatever they answer, B generated.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.conftest import NodeProcess, base_config, free_port, launch, write_config
from tests.node.test_node_sync import chain_of, metric, status, wait_until
from tests.registry.test_sync import Chain
from zoo.devnet.info import DevnetInfo
from zoo.devnet.manager import Devnet
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.weights import file_sha256
from zoo.node.api.serving import receipt_from_proto
from zoo.node.client import NodeClient
from zoo.node.config import ModelConfig, P2PConfig
from zoo.node.p2p.chain import RegistryChainView
from zoo.node.p2p.component import P2PComponent
from zoo.node.p2p.host import P2PError, P2PHost, load_identity
from zoo.node.p2p.messages import LIBRARY_TOPIC, Announcement, Capabilities, encode
from zoo.node.p2p.peers import PeerBook
from zoo.node.p2p.routing import Router
from zoo.node.provenance.receipts import check, parse
from zoo.registry.library_store import LibraryStore, root_hex
from zoo.registry.merkle import library_root
from zoo.v1 import inference_pb2, node_pb2

pytestmark = pytest.mark.slow
BUNDLED = "HuggingFaceTB/SmolLM2-135M-Instruct"


def node_extra(info: DevnetInfo, name: str, *, ipfs: bool, bootstrap: list[str]) -> dict:
    return {
        "chain": {
            "mode": "external",
            "rpc_url": info.rpc_url,
            "registry_address": info.registry_address,
            "from_block": info.deploy_block,
            "poll_interval_s": 0.5,
            "probe_interval_s": 1.0,
        },
        "ipfs": {"api_url": info.ipfs_api, "timeout_s": 5.0} if ipfs else {},
        "model": {"threads": 1} if name == "b" else {"backend": "none"},
        "inference": {"default_max_tokens": 8},
        "p2p": {
            "bootstrap": bootstrap,
            "capabilities_interval_s": 0.5,
            "capabilities_ttl_s": 3.0,
            "redial_interval_s": 0.5,
        },
    }


@dataclass
class Net:
    tmp: Path
    info: DevnetInfo
    chain: Chain
    nodes: dict[str, NodeProcess]
    a_addr: str

    def start(self, name: str, *, ipfs: bool, bootstrap: list[str]) -> NodeProcess:
        data_dir = self.tmp / f"{name}-data"
        extra = node_extra(self.info, name, ipfs=ipfs, bootstrap=bootstrap)
        node = launch(write_config(self.tmp / f"{name}.toml", base_config(data_dir, extra)), data_dir)
        node.wait_listening()
        self.nodes[name] = node
        return node


def peers(node: NodeProcess) -> node_pb2.ListPeersResponse:
    with NodeClient(node.address) as client:
        return client.peers()


def connected(node: NodeProcess) -> set[str]:
    return {p.peer_id for p in peers(node).peers if p.connected}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("p2p-net")
    devnet = Devnet(tmp / "devnet-data")
    info, _ = devnet.up(die_with_parent=True)
    n = Net(tmp, info, chain_of(info), {}, "")
    try:
        a = n.start("a", ipfs=True, bootstrap=[])
        n.a_addr = wait_until("A's listen address", lambda: list(peers(a).listen_addrs), 30, a)[0]
        n.start("b", ipfs=True, bootstrap=[n.a_addr])
        n.start("c", ipfs=False, bootstrap=[n.a_addr])
        for node in n.nodes.values():
            wait_until("version 1 active", lambda nd=node: status(nd).library.version >= 1, 90, node)
        n.nodes["b"].wait_component("model", "SERVING", timeout_s=180)
        n.nodes["b"].wait_component("retrieval", "SERVING", timeout_s=180)  # answers from its library
        yield n
    finally:
        for node in n.nodes.values():
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
        n.chain.ipfs.close()
        devnet.down()


def test_a_version_executed_on_chain_becomes_active_on_all_three_c_without_ipfs(net: Net) -> None:
    lib = net.chain.next_library(3)
    cid = net.chain.approve_library(lib)
    root = root_hex(library_root(lib))
    for name, node in net.nodes.items():
        wait_until(f"{name} on the new root", lambda nd=node: status(nd).library.root == root, 60, node)
    got = status(net.nodes["c"]).library
    assert (got.version, got.cid) == (lib.version, cid)
    # C has no IPFS: its verified copy came over the content protocol, from A or B.
    stored = LibraryStore(net.nodes["c"].data_dir).current()
    assert stored is not None and stored.library == lib
    assert "library content fetched from a peer" in net.nodes["c"].log()
    state = {c.name: node_pb2.ComponentState.Name(c.state) for c in status(net.nodes["c"]).components}
    assert state["ipfs"] == "COMPONENT_STATE_DISABLED" and state["p2p"] == "COMPONENT_STATE_SERVING"


def test_capabilities_are_listed_and_counted(net: Net) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    b_id = peers(b).peer_id

    version = status(b).library.version

    def b_capabilities() -> node_pb2.PeerCapabilities | None:
        for p in peers(a).peers:  # refreshed every 0.5 s: wait for one sent after B's latest activation
            if p.peer_id == b_id and p.HasField("capabilities") and p.capabilities.library_version == version:
                return p.capabilities
        return None

    caps = wait_until("B's current capabilities at A", b_capabilities, 20, a)
    assert list(caps.models) == [BUNDLED] and caps.backend == ModelConfig().backend and not caps.gpu
    assert caps.model_sha256 == status(b).model_sha256 == file_sha256(bundled_gguf())
    assert caps.grpc_address == b.address and caps.library_root == status(b).library.root
    assert set(caps.job_types) == {"tf-grpo", "gspo"}
    counts = status(a).peers
    assert counts.peer_id == peers(a).peer_id and counts.connected >= 2 and counts.capable >= 2
    out = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "peers", "--address", a.address, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    listed = {p["peer_id"]: p for p in json.loads(out.stdout)["peers"]}
    assert listed[b_id]["capabilities"]["models"] == [BUNDLED]
    table = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "peers", "--address", a.address],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert table.returncode == 0 and b_id in table.stdout and BUNDLED in table.stdout


def resident_mb(node: NodeProcess) -> float:
    status_lines = Path(f"/proc/{node.proc.pid}/status").read_text().splitlines()
    return int(next(line for line in status_lines if line.startswith("VmRSS:")).split()[1]) / 1024


def test_a_light_node_serves_no_model_loads_no_torch_and_stays_small(net: Net) -> None:
    a = net.nodes["a"]
    st = status(a)
    assert st.role == "light" and st.model_id == ""
    state = {c.name: node_pb2.ComponentState.Name(c.state) for c in st.components}
    assert {state[n] for n in ("model", "retrieval", "jobs")} == {"COMPONENT_STATE_DISABLED"}
    assert state["p2p"] == state["library"] == "COMPONENT_STATE_SERVING"
    with NodeClient(a.address) as client:
        assert client.health() == "SERVING"  # no model by configuration is not a failure
    # torch (which transformers and the embedder import) maps libtorch_cpu into the process; llama.cpp its
    # libllama. A light node that has gossiped, synced and routed (the other tests) loads neither.
    maps = Path(f"/proc/{a.proc.pid}/maps").read_text()
    assert "libtorch" not in maps and "libllama" not in maps
    # 671 MB for a model-less node before light nodes (issue 46); 159 MB with p2p alone, 181 MB with the
    # chain follower and IPFS (web3) on this machine. The bound is the issue's.
    assert resident_mb(a) < 200, f"{resident_mb(a):.0f} MB"
    shown = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "status", "--address", a.address],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert shown.returncode == 0 and "light node: serves no model" in shown.stdout, shown.stderr


def test_a_light_node_refuses_what_needs_a_model_clearly(net: Net) -> None:
    a = net.nodes["a"]
    with NodeClient(a.address) as client:
        with pytest.raises(grpc.RpcError) as e:  # no model named: it has none of its own to run it on
            client.inference.Infer(inference_pb2.InferRequest(prompt="hi"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "light node" in e.value.details()
        proof = answer_proof.make("ab" * 32, [1], [2], np.ones((1, 576), np.float32), temperature=0, top_p=1)
        with pytest.raises(grpc.RpcError) as e:  # nothing to check a proof with
            client.inference.VerifyAnswer(
                inference_pb2.VerifyAnswerRequest(proof=json.dumps(proof.to_json()))
            )
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "light node" in e.value.details()
    with NodeClient(a.address, admin_token=a.admin_token) as client:
        with pytest.raises(grpc.RpcError) as e:
            client.submit_job("tf-grpo", {"tasks": [{"question": "1+1?", "answer": "2"}]})
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "runs no jobs" in e.value.details()
    http = status(a).http_address
    with httpx.Client(base_url=http, timeout=30) as web:
        assert web.get("/models").json()["data"] == []
        hi = [{"role": "user", "content": "hi"}]
        chat = web.post("/chat/completions", json={"model": "", "messages": hi})
        assert chat.status_code == 404 and "serves no chat model" in chat.json()["error"]["message"]
        embed = web.post("/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
        assert embed.status_code == 404 and embed.json()["error"]["code"] == "model_not_found"


def capable_at(node: NodeProcess, peer_id: str) -> bool:
    return any(p.peer_id == peer_id and p.HasField("capabilities") for p in peers(node).peers)


def answered_through(via: NodeProcess, server: NodeProcess, server_id: str) -> inference_pb2.InferResponse:
    """Infer and InferStream sent to `via` are answered by `server` (served_by), with what `server` answers
    when asked directly (greedy, same model, same library); the routed answer, for more checks."""
    request = inference_pb2.InferRequest(
        prompt="What is 2 + 3?", model=BUNDLED, sampling=inference_pb2.SamplingParams(max_tokens=8)
    )
    with NodeClient(via.address) as client:
        routed = client.inference.Infer(request, timeout=120)
        chunks = list(client.inference.InferStream(request, timeout=120))
    with NodeClient(server.address) as client:
        direct = client.inference.Infer(request, timeout=120)
    assert routed.served_by == server_id == direct.served_by
    assert routed.text == direct.text and routed.text
    final = chunks[-1].final
    assert final.served_by == server_id and final.text == routed.text
    assert "".join(c.delta for c in chunks[:-1]) == final.text
    return routed


def routed_once(router: Router) -> inference_pb2.InferResponse:
    """One short request through `router`, which is closed after."""

    async def route() -> inference_pb2.InferResponse:
        try:
            return await router.infer(
                inference_pb2.InferRequest(
                    prompt="Say hi.", model=BUNDLED, sampling=inference_pb2.SamplingParams(max_tokens=4)
                )
            )
        finally:
            await router.close()

    return asyncio.run(route())


def test_a_request_for_a_model_only_b_serves_is_answered_by_b_through_a(net: Net) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    b_id = peers(b).peer_id
    wait_until("B capable at A", lambda: capable_at(a, b_id), 20, a)
    routed = answered_through(a, b, b_id)
    assert routed.model_id == BUNDLED and routed.library_root == status(b).library.root

    with NodeClient(a.address) as client:
        # Pinned to a root no peer serves: never forwarded to a node that would answer from another one.
        pinned = inference_pb2.InferRequest(prompt="hi", model=BUNDLED, library_root="0x" + "cd" * 32)
        with pytest.raises(grpc.RpcError) as e:
            client.inference.Infer(pinned, timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert BUNDLED in e.value.details() and "0x" + "cd" * 32 in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # no peer advertises it: not found (as over HTTP)
            client.inference.Infer(inference_pb2.InferRequest(prompt="hi", model="no-such/model"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "no-such/model" in e.value.details()
        assert "no peer advertises it" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # bad input is refused before anything is forwarded
            client.inference.Infer(inference_pb2.InferRequest(model=BUNDLED), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A model named by its weights' hash goes to the peer that advertises those weights, and B takes
        # the name as its own; weights nobody advertises are not found.
        by_hash = f"sha256:{status(b).model_sha256}"
        sampling = inference_pb2.SamplingParams(max_tokens=4)
        routed = inference_pb2.InferRequest(prompt="hi", model=by_hash, sampling=sampling, receipt=True)
        answer = client.inference.Infer(routed)
        assert answer.served_by == b_id and answer.text
        # The routed answer carries B's receipt as B signed it: B's account, B's weights.
        receipt = parse(receipt_from_proto(answer.receipt))
        check(receipt)
        assert (receipt.node, receipt.model) == (status(b).node_address, "0x" + status(b).model_sha256)
        with pytest.raises(grpc.RpcError) as e:
            client.inference.Infer(
                inference_pb2.InferRequest(prompt="hi", model="sha256:" + "ef" * 32), timeout=30
            )
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "no peer advertises it" in e.value.details()


def test_openai_clients_reach_b_s_model_through_a(net: Net) -> None:
    a, b = net.nodes["a"], net.nodes["b"]
    wait_until("B capable at A", lambda: capable_at(a, peers(b).peer_id), 20, a)
    body = {"model": BUNDLED, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
    with httpx.Client(base_url=a.info["http"] + "/v1", timeout=120) as http:
        routed = http.post("/chat/completions", json=body)
        assert routed.status_code == 200, routed.text
        with httpx.Client(base_url=b.info["http"] + "/v1", timeout=120) as direct_http:
            direct = direct_http.post("/chat/completions", json=body).json()
        answer = routed.json()
        assert answer["model"] == BUNDLED
        assert answer["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as events:
            assert events.status_code == 200
            text = "".join(
                json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                for line in events.iter_lines()
                if line.startswith("data: {")
            )
        assert text == answer["choices"][0]["message"]["content"]
        missing = http.post("/chat/completions", json={**body, "model": "no-such/model"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_same_request_is_placed_alike_through_grpc_and_http(net: Net) -> None:
    """One placement rule (node/api/serving.py) behind both front doors of A: a model only B serves is
    answered by B, a model nobody serves is not found, a bad request is refused, whichever door it takes."""
    a, b = net.nodes["a"], net.nodes["b"]
    b_id = peers(b).peer_id
    wait_until("B capable at A", lambda: capable_at(a, b_id), 20, a)

    def through_grpc(model: str, content: str) -> tuple[str, str]:
        request = inference_pb2.InferRequest(
            messages=[inference_pb2.ChatMessage(role="user", content=content)], model=model,
            sampling=inference_pb2.SamplingParams(max_tokens=8),
        )  # fmt: skip
        with NodeClient(a.address) as client:
            try:
                return "ok", client.inference.Infer(request, timeout=120).text
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""

    def through_http(model: str, content: str) -> tuple[str, str]:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        r = httpx.post(a.info["http"] + "/v1/chat/completions", json=body, timeout=120)
        if r.status_code == 200:
            return "ok", r.json()["choices"][0]["message"]["content"]
        return {404: "NOT_FOUND", 400: "INVALID_ARGUMENT"}.get(r.status_code, str(r.status_code)), r.text

    for model, content, expected in [
        (BUNDLED, "What is 2 + 3?", "ok"),
        ("no-such/model", "What is 2 + 3?", "NOT_FOUND"),
        (BUNDLED, "", "INVALID_ARGUMENT"),
        ("bad\nname", "hi", "INVALID_ARGUMENT"),
    ]:
        by_grpc, by_http = through_grpc(model, content), through_http(model, content)
        assert by_grpc[0] == by_http[0] == expected, (model, content, by_grpc, by_http)
        if expected == "ok":  # answered by B both times: greedy, same model, same library
            assert by_grpc[1] == by_http[1] and by_grpc[1]


def test_routing_tries_other_peers_after_transport_failures(net: Net, tmp_path: Path) -> None:
    b = net.nodes["b"]
    b_id = peers(b).peer_id
    book = PeerBook(tmp_path / "peers.json", ttl_s=60)
    dead = [
        "12D3KooWDeadDeadDeadDeadDeadDeadDeadDeadDeadDeadDead",
        "12D3KooWGoneGoneGoneGoneGoneGoneGoneGoneGoneGoneGone",
    ]
    serving = {"models": [BUNDLED], "backend": "transformers"}
    for j, peer in enumerate(dead):
        book.set_capabilities(peer, Capabilities(**serving, grpc=f"127.0.0.1:{free_port()}", load=j / 10))
    book.set_capabilities(b_id, Capabilities(**serving, grpc=b.address, load=3.0))

    router = Router(book, timeout_s=60)
    assert [p for p, _ in router.candidates(BUNDLED)] == [*dead, b_id]  # least loaded first
    assert routed_once(router).served_by == b_id  # two dead peers, then B
    # Peers that failed are asked last until they advertise again (a killed node's capabilities outlive it).
    assert [p for p, _ in router.candidates(BUNDLED)] == [b_id, *dead]
    time.sleep(0.01)
    book.set_capabilities(dead[1], Capabilities(**serving, grpc=f"127.0.0.1:{free_port()}", load=0.1))
    assert [p for p, _ in router.candidates(BUNDLED)] == [dead[1], b_id, dead[0]]


def test_routing_reaches_a_peer_without_a_grpc_address_through_its_tunnel(net: Net, tmp_path: Path) -> None:
    """The router's path to a peer behind NAT (the tunnel itself: test_relay.py, test_nat.py): a peer that
    advertises no gRPC address but grpc_over_p2p is asked through the address the tunnel gives; one whose
    tunnel cannot be opened is skipped like an unreachable address; with no tunnel, neither is a candidate."""
    b = net.nodes["b"]
    b_id = peers(b).peer_id
    book = PeerBook(tmp_path / "peers.json", ttl_s=60)
    gone = "12D3KooWGoneGoneGoneGoneGoneGoneGoneGoneGoneGoneGone"
    serving = {"models": [BUNDLED], "backend": "transformers", "grpc_over_p2p": True}
    book.set_capabilities(gone, Capabilities(**serving, load=0.0))
    book.set_capabilities(b_id, Capabilities(**serving, load=1.0))
    asked: list[tuple[str, list[str]]] = []

    def tunnel(peer: str, addrs: list[str]) -> str:
        asked.append((peer, addrs))
        if peer == gone:
            raise P2PError("the libp2p host stopped")
        return b.address  # B's gRPC stands in for the loopback end of a tunnel to B

    assert Router(book).candidates(BUNDLED) == []  # no tunnel, no way to a peer without an address
    assert routed_once(Router(book, timeout_s=60, tunnel=tunnel)).served_by == b_id
    assert [p for p, _ in asked] == [gone, b_id]


@pytest.fixture
def rogue(net: Net) -> Iterator[P2PHost]:
    """A libp2p host run by the test, connected to A, that says whatever the test makes it say."""
    host = P2PHost(
        load_identity(net.tmp / f"rogue-{time.monotonic_ns()}" / "identity.key"),
        "/ip4/127.0.0.1/tcp/0",
        [LIBRARY_TOPIC],
        validator=lambda *_: True,
        on_message=lambda *_: None,
        content=lambda _cid: b'{"tampered": true}',
        max_content_bytes=1 << 20,
    )
    host.start()
    try:
        host.connect(net.a_addr)
        wait_until("A to see the rogue on the library topic", lambda: host.mesh_peers(LIBRARY_TOPIC), 15)
        yield host
    finally:
        host.stop()


def test_a_fake_announcement_is_checked_ignored_and_scores_the_peer_down(net: Net, rogue: P2PHost) -> None:
    a = net.nodes["a"]
    before = status(a).library
    fake = Announcement(
        version=before.version,
        root="0x" + "ab" * 32,
        cid=before.cid,
        chain_id=int(net.chain.w3.eth.chain_id),
        registry=net.info.registry_address,
    )
    bad_before = metric(a, "zoo_p2p_messages_total", outcome="bad_hint")
    rogue.publish(LIBRARY_TOPIC, encode(fake))
    bad_hints = lambda: metric(a, "zoo_p2p_messages_total", outcome="bad_hint")  # noqa: E731
    wait_until("A to count the bad hint", lambda: bad_hints() > bad_before, 15, a)

    def score() -> float | None:
        for p in peers(a).peers:
            if p.peer_id == rogue.peer_id:
                return p.score
        return None

    assert score() == pytest.approx(-10.0, abs=0.1)  # recovering slowly
    assert status(a).library == before  # nothing fetched, nothing changed
    # A version the chain does not have (yet): a lie, or an RPC lagging behind the sender's. Not held
    # against the sender, and nothing is done.
    unknown = lambda: metric(a, "zoo_p2p_messages_total", outcome="unknown_version")  # noqa: E731
    unknown_before = unknown()
    rogue.publish(LIBRARY_TOPIC, encode(fake.model_copy(update={"version": before.version + 5})))
    wait_until("A to count the unknown version", lambda: unknown() > unknown_before, 15, a)
    assert score() == pytest.approx(-10.0, abs=0.1)  # recovering slowly
    # Repeats: three lies reach the ban threshold; A then drops the rogue's messages and disconnects it.
    for version, root in ((1, "0x" + "ac" * 32), (before.version, "0x" + "ad" * 32)):
        rogue.publish(LIBRARY_TOPIC, encode(fake.model_copy(update={"version": version, "root": root})))
    banned = lambda: any(p.banned for p in peers(a).peers if p.peer_id == rogue.peer_id)  # noqa: E731
    wait_until("the rogue banned", banned, 15, a)
    wait_until("the rogue disconnected", lambda: rogue.peer_id not in connected(a), 15, a)
    assert status(a).library == before


def test_claims_about_one_version_cost_one_chain_call(net: Net, tmp_path: Path) -> None:
    """The component's check of announcements against the real chain, counted: liars announcing several
    wrong roots for a version first, then the honest announcement, are all judged by one eth_call."""

    class Counted(RegistryChainView):
        calls = 0

        def root_of(self, version: int) -> str | None:
            Counted.calls += 1
            return super().root_of(version)

    current = status(net.nodes["a"]).library
    woken: list[int] = []
    component = P2PComponent(P2PConfig(), tmp_path, content=lambda _cid: None, on_newer_version=woken.append,
                             chain=lambda: chain)  # fmt: skip
    chain = Counted(net.info.rpc_url, net.info.registry_address)
    chain_id = int(net.chain.w3.eth.chain_id)
    claim = Announcement(version=current.version, root=current.root, cid=current.cid, chain_id=chain_id,
                         registry=net.info.registry_address)  # fmt: skip

    async def hear() -> None:
        for j in range(3):
            await component._hint(f"liar{j}", claim.model_copy(update={"root": "0x" + f"{j + 1:02x}" * 32}))
        await component._hint("honest", claim)

    asyncio.run(hear())
    assert Counted.calls == 1
    assert [component.book.score(f"liar{j}") for j in range(3)] == pytest.approx([-10.0] * 3, abs=0.01)
    assert component.book.holders(current.cid) == ["honest"] and woken == [current.version]


def test_oversized_malformed_and_flooding_messages_are_dropped_and_counted(net: Net, rogue: P2PHost) -> None:
    a = net.nodes["a"]
    count = lambda outcome: metric(a, "zoo_p2p_messages_total", outcome=outcome)  # noqa: E731
    before = {o: count(o) for o in ("oversized", "malformed", "rate_limited", "other_network")}
    rogue.publish(LIBRARY_TOPIC, b"{" + b" " * 5000 + b"}")
    rogue.publish(LIBRARY_TOPIC, b"not json")
    elsewhere = Announcement(version=1, root="0x" + "11" * 32, cid=status(a).library.cid, chain_id=999,
                             registry="0x" + "22" * 20)  # fmt: skip
    for _ in range(40):  # well past the burst of 20
        rogue.publish(LIBRARY_TOPIC, encode(elsewhere))
    for outcome in before:
        wait_until(f"{outcome} counted", lambda o=outcome: count(o) > before[o], 15, a)
    assert count("rate_limited") - before["rate_limited"] >= 10


def test_a_restarted_node_keeps_its_peer_id_and_reconnects_from_its_peer_book(net: Net) -> None:
    a = net.nodes["a"]
    before = peers(a).peer_id
    b_id, c_id = peers(net.nodes["b"]).peer_id, peers(net.nodes["c"]).peer_id
    assert a.stop() == 0
    # A has no bootstrap peers: after the restart it finds B and C through its persisted peer book
    # (and they through theirs), under the same identity.
    restarted = launch(a.config_file, a.data_dir)
    net.nodes["a"] = restarted
    restarted.wait_listening()
    assert wait_until("A's p2p host", lambda: peers(restarted).peer_id, 30, restarted) == before
    wait_until("A reconnected to B and C", lambda: {b_id, c_id} <= connected(restarted), 60, restarted)
    time.sleep(2)  # the gossip replayed to a reconnecting peer must not count against anyone
    scores = {p.peer_id: p.score for p in peers(restarted).peers}
    assert scores[b_id] >= 0 and scores[c_id] >= 0 and {b_id, c_id} <= connected(restarted)


def test_the_network_holds_without_its_bootstrap_node(net: Net) -> None:
    a, b, c = net.nodes["a"], net.nodes["b"], net.nodes["c"]
    b_id, c_id = peers(b).peer_id, peers(c).peer_id
    # B and C were given A alone; the DHT walk (from A's routing table) connected them to each other.
    wait_until("B and C connected", lambda: c_id in connected(b) and b_id in connected(c), 60, c)
    os.killpg(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    time.sleep(3)
    assert b_id in connected(c) and c_id in connected(b)
    request = inference_pb2.InferRequest(
        prompt="What is 2 + 3?", model=BUNDLED, sampling=inference_pb2.SamplingParams(max_tokens=8)
    )
    with NodeClient(c.address) as client:  # C, a light node, still routes to B's model
        assert client.inference.Infer(request, timeout=120).served_by == b_id
    # C restarts while its only bootstrap peer is dead: it rejoins through B, which its book remembers.
    assert c.stop() == 0
    c = net.nodes["c"] = launch(c.config_file, c.data_dir)
    c.wait_listening()
    wait_until("C rejoined through B", lambda: b_id in connected(c), 60, c)
    lib = net.chain.next_library(2)
    net.chain.approve_library(lib)
    root = root_hex(library_root(lib))
    wait_until("C (no IPFS) synced from B", lambda: status(c).library.root == root, 60, c)
    a = net.nodes["a"] = launch(a.config_file, a.data_dir)  # back for the tests after this one
    a.wait_listening()
    wait_until("A rejoined", lambda: {b_id, c_id} <= connected(a), 60, a)


def test_capabilities_expire_when_a_node_stops(net: Net) -> None:
    a, c = net.nodes["a"], net.nodes["c"]
    c_id = peers(c).peer_id
    capable = lambda: any(p.peer_id == c_id and p.HasField("capabilities") for p in peers(a).peers)  # noqa: E731
    wait_until("C capable at A", capable, 20, a)
    assert c.stop() == 0
    wait_until("C's capabilities expired at A", lambda: not capable(), 20, a)
