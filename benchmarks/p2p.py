"""The peer network's figures (issue 16), every ratio against a baseline measured in the same run.

1. Propagation: from the execution of a library version on chain (the LibraryUpdated block) to that
   version active on all three nodes, with gossip (p2p on: the first node to poll it announces it and
   the others sync at once; node C has no IPFS and gets the bytes from a peer) against chain polling only
   (p2p off, all three with IPFS). Same devnet, same poll interval (the node default, 2 s).
2. Bytes on the wire per gossip message: one announcement, one capabilities message (as node B sends).
3. Routing: Infer latency through node A, which forwards to node B (the only one with a model), against
   the same request sent to B directly, alternating.

Usage: ./zoo bench p2p [--versions 6] [--poll 2.0] [--runs 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import NodeProcess, base_config, launch, write_config  # noqa: E402
from tests.node.test_node_sync import chain_of, status, wait_until  # noqa: E402
from tests.registry.test_sync import Chain  # noqa: E402
from zoo.devnet.info import DevnetInfo  # noqa: E402
from zoo.devnet.manager import Devnet  # noqa: E402
from zoo.node.client import NodeClient  # noqa: E402
from zoo.node.p2p.messages import Announcement, Capabilities, encode  # noqa: E402
from zoo.registry.library_store import root_hex  # noqa: E402
from zoo.registry.merkle import library_root  # noqa: E402
from zoo.v1 import inference_pb2 as pb  # noqa: E402

BUNDLED = "HuggingFaceTB/SmolLM2-135M-Instruct"


def config(info: DevnetInfo, name: str, *, p2p: bool, ipfs: bool, model: bool, poll: float,
           bootstrap: list[str]) -> dict:  # fmt: skip
    remote = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "name": f"model-{name}"}
    return {
        "chain": {
            "mode": "external",
            "rpc_url": info.rpc_url,
            "registry_address": info.registry_address,
            "from_block": info.deploy_block,
            "poll_interval_s": poll,
        },
        "ipfs": {"api_url": info.ipfs_api} if ipfs else {},
        "model": {"threads": 1} if model else remote,
        "p2p": {"enabled": p2p, "bootstrap": bootstrap},
        "log": {"level": os.environ.get("BENCH_LOG_LEVEL", "info")},
    }


@contextlib.contextmanager
def three_nodes(tmp: Path, info: DevnetInfo, *, p2p: bool, poll: float) -> Iterator[list[NodeProcess]]:
    nodes: list[NodeProcess] = []
    stagger = random.Random(1)
    try:
        bootstrap: list[str] = []
        for name in "abc":
            data = tmp / f"{name}-{'gossip' if p2p else 'polling'}"
            extra = config(info, name, p2p=p2p, ipfs=not (p2p and name == "c"), model=p2p and name == "b",
                           poll=poll, bootstrap=bootstrap)  # fmt: skip
            node = launch(write_config(data.with_suffix(".toml"), base_config(data, extra)), data)
            node.wait_listening()
            nodes.append(node)
            # Nodes of a real network start at unrelated moments: spread their poll phases likewise.
            time.sleep(stagger.uniform(0, poll))
            if p2p and name == "a":
                with NodeClient(node.address) as client:
                    addrs = wait_until("A's address", lambda c=client: list(c.peers().listen_addrs), 30)
                bootstrap = addrs[:1]
        for node in nodes:
            wait_until("version active", lambda n=node: status(n).library.version >= 1, 120, node)
        if p2p:
            wait_until("A to know B and C", lambda: status(nodes[0]).peers.capable >= 2, 60, nodes[0])
        yield nodes
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
                try:
                    node.proc.wait(30)
                except Exception:
                    os.killpg(node.proc.pid, signal.SIGKILL)


def propagation(chain: Chain, nodes: list[NodeProcess], versions: int, poll: float) -> list[float]:
    clients = [NodeClient(n.address) for n in nodes]
    out = []
    pause = random.Random(0)
    try:
        for _ in range(versions):
            # Land each execution at a random moment of the nodes' poll cycles, not in step with them.
            time.sleep(pause.uniform(0, poll))
            lib = chain.next_library(2)
            root = root_hex(library_root(lib))
            chain.approve_library(lib)  # returns once the execution (LibraryUpdated) is mined
            t0 = time.perf_counter()
            pending = set(range(len(nodes)))
            while pending:
                pending = {i for i in pending if clients[i].status().library.root != root}
                if time.perf_counter() - t0 > 120:
                    raise SystemExit(f"version {lib.version} not active on every node after 120 s")
                time.sleep(0.01)
            out.append(time.perf_counter() - t0)
    finally:
        for c in clients:
            c.close()
    return out


def routing(a: NodeProcess, b: NodeProcess, runs: int) -> tuple[list[float], list[float]]:
    tokens = pb.SamplingParams(max_tokens=8)
    request = pb.InferRequest(prompt="Name a colour.", model=BUNDLED, sampling=tokens)
    direct, routed = [], []
    with NodeClient(a.address) as via_a, NodeClient(b.address) as to_b:
        wait_until("B capable at A", lambda: status(a).peers.capable >= 1, 60, a)
        to_b.inference.Infer(request, timeout=120)  # warm-up
        via_a.inference.Infer(request, timeout=120)
        for _ in range(runs):
            for client, times in ((to_b, direct), (via_a, routed)):
                t0 = time.perf_counter()
                response = client.inference.Infer(request, timeout=120)
                times.append(time.perf_counter() - t0)
                assert response.served_by
    return direct, routed


def message_sizes(chain: Chain, a: NodeProcess) -> tuple[int, int]:
    lib = status(a).library
    chain_id = int(chain.w3.eth.chain_id)
    registry = chain.info.registry_address
    announcement = Announcement(
        version=lib.version, root=lib.root, cid=lib.cid, chain_id=chain_id, registry=registry
    )
    with NodeClient(a.address) as client:
        listing = client.peers()
    caps = next(p.capabilities for p in listing.peers if p.HasField("capabilities"))
    # What a node sends: its capabilities as a peer lists them, with its listen address.
    sent = Capabilities(models=list(caps.models), backend=caps.backend, gpu=caps.gpu,
                        library_version=caps.library_version, library_root=caps.library_root,
                        job_types=list(caps.job_types), grpc=caps.grpc_address, http=caps.http_address,
                        addrs=list(listing.listen_addrs)[:1], load=caps.load,
                        chain_id=chain_id)  # fmt: skip
    return len(encode(announcement)), len(encode(sent))


def summary(label: str, xs: list[float]) -> str:
    return f"{label}: median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=6, help="library versions approved per mode")
    ap.add_argument("--poll", type=float, default=2.0, help="chain.poll_interval_s of every node")
    ap.add_argument("--runs", type=int, default=10, help="alternating direct/routed Infer calls")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zoo-bench-p2p-"))
    devnet = Devnet(tmp / "devnet")
    info, _ = devnet.up(die_with_parent=True)
    chain = chain_of(info)
    try:
        with three_nodes(tmp, info, p2p=False, poll=args.poll) as nodes:
            polling = propagation(chain, nodes, args.versions, args.poll)
        print(summary("1. chain polling only", polling), flush=True)
        with three_nodes(tmp, info, p2p=True, poll=args.poll) as nodes:
            gossip = propagation(chain, nodes, args.versions, args.poll)
            print(summary("1. with gossip       ", gossip), flush=True)
            ratio = statistics.median(polling) / statistics.median(gossip)
            print(f"   block to active on all three: polling / gossip = {ratio:.2f}x (median)")
            announcement, caps = message_sizes(chain, nodes[0])
            print(f"2. bytes per announcement {announcement}, per capabilities message {caps}")
            nodes[1].wait_component("model", "SERVING", timeout_s=180)
            direct, routed = routing(nodes[0], nodes[1], args.runs)
            d, r = statistics.median(direct), statistics.median(routed)
            print(f"3. Infer latency (8 tokens): direct to B {d * 1000:.0f} ms, routed through A "
                  f"{r * 1000:.0f} ms (median of {args.runs}); routed / direct = {r / d:.3f}x, "
                  f"the hop costs {(r - d) * 1000:.1f} ms")  # fmt: skip
    finally:
        chain.ipfs.close()
        devnet.down()


if __name__ == "__main__":
    main()
