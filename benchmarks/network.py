"""The peer network at N nodes (issue 46), every figure beside its baseline from the same run.

N light nodes (model.backend = 'none') on one devnet, each in a network namespace of its own
(tests/node/p2p/netlab.py), node 0 the only bootstrap address any of them is given. Half of them (i % 4
in 2, 3: half of the even and half of the odd nodes, the two sides of the partition) have no IPFS: their
library bytes come from peers. Three configurations, one after the other:
- polling: p2p off; every node follows the chain alone (all with IPFS). Baseline of propagation.
- star: p2p on, DHT discovery off: each node knows node 0 and whom it meets through it (the network
  before issue 46). Baseline of the mesh and of the bootstrap's death.
- mesh: the node as shipped (DHT discovery). Everything else: mesh, propagation, bytes, churn,
  partition, liars, routing under churn.

Usage (as root): ./zoo bench network --nodes 8 [--versions 5] [--poll 2.0] [--skip-routing]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tomli_w  # noqa: E402

from tests.conftest import NodeProcess, base_config, launch, write_config  # noqa: E402
from tests.node.p2p.netlab import SERVICE_IP, Forwarder, Lab, LabNode, available  # noqa: E402
from tests.node.test_node_sync import chain_of  # noqa: E402
from tests.registry.test_sync import Chain  # noqa: E402
from zoo.devnet.info import DevnetInfo  # noqa: E402
from zoo.devnet.manager import Devnet  # noqa: E402
from zoo.node.client import NodeClient  # noqa: E402
from zoo.node.p2p.host import P2PHost, load_identity  # noqa: E402
from zoo.node.p2p.messages import LIBRARY_TOPIC, Announcement, encode  # noqa: E402
from zoo.registry.library_store import root_hex  # noqa: E402
from zoo.registry.merkle import library_root  # noqa: E402
from zoo.v1 import inference_pb2 as pb  # noqa: E402

BUNDLED = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Nodes that serve the model (through an upstream node) for the routing figure. Each loads torch and the
# embedder: at N = 24 a third of the nodes doing so on two cores kept the mesh from forming in 240 s.
SERVERS = 3


def say(text: str) -> None:
    print(text, flush=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def try_status(node: LabNode) -> Any:
    if not node.alive or node.process is None or not node.process.info:
        return None
    try:
        with NodeClient(node.process.address) as client:
            return client.status()
    except Exception:
        return None


def connected_peers(node: LabNode) -> int:
    st = try_status(node)
    return -1 if st is None else st.peers.connected


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every: float = 0.25) -> float:
    """Seconds until `check()` holds; SystemExit naming `what` after `timeout_s`."""
    if (seconds := wait_until(check, timeout_s, every)) is None:
        raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
    return seconds


def wait_until(check: Callable[[], Any], timeout_s: float, every: float = 0.25) -> float | None:
    """Seconds until `check()` holds, or None after `timeout_s` (a figure the run reports and goes on)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(every)
    return time.monotonic() - t0


class Network:
    """One configuration of the lab's nodes: their configs, starts, restarts and what they report."""

    def __init__(self, lab: Lab, info: DevnetInfo, forward: Forwarder, *, p2p: bool, discovery: bool,
                 poll: float, serving: dict[int, dict] | None = None) -> None:  # fmt: skip
        self.lab, self.info, self.forward = lab, info, forward
        self.p2p, self.discovery, self.poll = p2p, discovery, poll
        self.serving = serving or {}  # node index -> its [model] section (the routing test's servers)

    def config(self, node: LabNode) -> str:
        i, ip = node.i, node.ip
        ipfs = self.has_ipfs(i)
        cfg = {
            "data_dir": str(node.data_dir),
            "server": {"listen": f"{ip}:0", "grace_period_s": 2},
            "metrics": {"listen": f"{ip}:0"},
            "http": {"enabled": False},
            "chain": {
                "mode": "external",
                "rpc_url": self.forward.url(int(self.info.rpc_url.rsplit(":", 1)[1])),
                "registry_address": self.info.registry_address,
                "from_block": self.info.deploy_block,
                "poll_interval_s": self.poll,
            },
            "ipfs": {"api_url": self.forward.url(int(self.info.ipfs_api.rsplit(":", 1)[1]))} if ipfs else {},
            "model": self.serving.get(i, {"backend": "none"}),
            "p2p": {
                "enabled": self.p2p,
                "listen": f"/ip4/{ip}/tcp/4001",
                "bootstrap": [self.lab.nodes[0].p2p_addr] if i else [],
                "discovery": self.discovery,
            },
            "log": {"level": os.environ.get("BENCH_LOG_LEVEL", "info")},
        }
        return tomli_w.dumps(cfg)

    def has_ipfs(self, i: int) -> bool:
        """Node i reads library bytes from the devnet's IPFS; the others fetch them from peers. With p2p:
        half of each half of the partition (i % 4 in 0, 1); without, every node."""
        return not self.p2p or i % 4 < 2

    def start(self, nodes: list[LabNode] | None = None) -> float:
        """Start `nodes` (all by default) and wait until they listen; seconds it took."""
        t0 = time.monotonic()
        for node in nodes or self.lab.nodes:
            self.lab.start(node, self.config(node))
        for node in nodes or self.lab.nodes:
            assert node.process is not None
            node.process.wait_listening(240)
        return time.monotonic() - t0

    def peer_counts(self, nodes: list[LabNode] | None = None) -> list[int]:
        return [connected_peers(n) for n in nodes or self.lab.nodes]

    def roots(self, nodes: list[LabNode] | None = None) -> list[str]:
        return [
            (st.library.root if (st := try_status(n)) is not None else "") for n in nodes or self.lab.nodes
        ]


def propagate(chain: Chain, net: Network, versions: int, on_execute: Callable[[], None] | None = None,
              nodes: list[LabNode] | None = None, strict: bool = True,
              per_node: list[dict[int, float]] | None = None) -> list[list[float]]:  # fmt: skip
    """For each of `versions` new versions: seconds from its execution on chain to active, per node. When
    a node activated it is read from its own log ("library active", stamped by the node), so measuring does
    not load the nodes with status calls; one machine, one clock. A node that has not activated a version
    180 s after its execution ends the run, or with strict=False counts as never (inf) and is reported.
    `per_node`, when given, also gets each version's times by node index."""
    rng = random.Random(0)
    out = []
    for _ in range(versions):
        time.sleep(rng.uniform(0, net.poll))  # a random moment of the nodes' poll cycles
        lib = chain.next_library(2)
        root = root_hex(library_root(lib))
        chain.approve_library(lib)  # returns once the execution (LibraryUpdated) is mined
        executed = time.time()
        if on_execute is not None:
            on_execute()
        watched = nodes or net.lab.nodes
        times: dict[int, float] = {}
        while len(times) < len(watched):
            for node in watched:
                if node.i not in times and (at := activated_at(node, root)) is not None:
                    times[node.i] = at - executed
            if time.time() - executed > 180:
                late = sorted(n.i for n in watched if n.i not in times)
                if strict:
                    raise SystemExit(f"version {lib.version} not active on every node after 180 s: {times}")
                say(f"    version {lib.version} not active on nodes {late} 180 s after its execution")
                times.update({i: float("inf") for i in late})
            time.sleep(0.25)
        out.append(sorted(times.values()))
        if per_node is not None:
            per_node.append(times)
    return out


def activated_at(node: LabNode, root: str) -> float | None:
    """When `node` logged the activation of `root` (Unix time), or None."""
    if node.process is None:
        return None
    for line in node.process.log().splitlines():
        if 'msg="library active"' in line and f"root={root}" in line:
            stamp = line.split(" ", 1)[0].removeprefix("ts=").removesuffix("Z")
            return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
    return None


def spread(label: str, runs: list[list[float]], busy: float | None = None) -> str:
    """The time to all nodes, and its two parts: until the first node had the version (its chain poll,
    whatever the network) and from there to the last (what gossip changes)."""
    alls, firsts = [max(r) for r in runs], [min(r) for r in runs]
    rest = [max(r) - min(r) for r in runs]
    load = "" if busy is None else f"; the machine's {os.cpu_count()} cores {busy:.0%} busy meanwhile"
    return (
        f"{label}: execution -> active on all, median {med(alls):.2f} s, max {max(alls):.2f} s; the first "
        f"node median {med(firsts):.2f} s, the rest {med(rest):.2f} s "
        f"later ({len(runs)} versions{load})"
    )


def by_content_source(net: Network, by_node: list[dict[int, float]]) -> str:
    """The time to all, apart for the nodes that read the bytes from IPFS and those that fetch them from
    peers: which of the two is the tail."""
    parts = []
    for label, want in (("nodes with IPFS", True), ("nodes fetching from peers", False)):
        alls = [max(t for i, t in times.items() if net.has_ipfs(i) == want) for times in by_node]
        parts.append(f"{label} median {med(alls):.2f} s, max {max(alls):.2f} s")
    return "with gossip, execution -> active on all " + "; on all ".join(parts)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, all cores (/proc/stat): nodes, devnet and this script."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextmanager
def machine_busy() -> Iterator[list[float]]:
    """Yields a list that holds, after the block, the share of the machine's CPU that was busy during it:
    when it is near 100 %, the figures measured in the block are this machine's limit, not the network's."""
    out: list[float] = []
    busy0, total0 = cpu_jiffies()
    yield out
    busy1, total1 = cpu_jiffies()
    out.append((busy1 - busy0) / max(1, total1 - total0))


def bytes_sent(net: Network) -> list[int]:
    return [net.lab.p2p_bytes_sent(n) for n in net.lab.nodes]


# -- the scenarios ----------------------------------------------------------------------------------------


def run_polling(lab: Lab, info: DevnetInfo, forward: Forwarder, chain: Chain, args: Any) -> list[list[float]]:
    net = Network(lab, info, forward, p2p=False, discovery=False, poll=args.poll)
    net.start()
    try:
        wait_for("version >= 1 everywhere", lambda: all(net.roots()), 180)
        with machine_busy() as busy:
            runs = propagate(chain, net, args.versions)
        say("  " + spread("polling only (p2p off)", runs, busy[0]))
        return runs
    finally:
        lab.stop_all()


def run_star(lab: Lab, info: DevnetInfo, forward: Forwarder, args: Any) -> dict[str, Any]:
    net = Network(lab, info, forward, p2p=True, discovery=False, poll=args.poll)
    net.start()
    try:
        time.sleep(30)
        counts = net.peer_counts()
        lab.kill(lab.nodes[0])
        time.sleep(45)
        after = net.peer_counts(lab.nodes[1:])
        say(f"  star (discovery off): connected peers after 30 s min {min(counts)} median {med(counts):.0f}; "
            f"45 s after node 0 is killed: min {min(after)} median {med(after):.0f}")  # fmt: skip
        return {"counts": counts, "after": after}
    finally:
        lab.stop_all()


def run_mesh(lab: Lab, info: DevnetInfo, forward: Forwarder, chain: Chain, args: Any,
             polling: list[list[float]]) -> None:  # fmt: skip
    n = lab.n
    target = min(4, n - 2)
    serving = {}
    upstream = None
    if not args.skip_routing:
        upstream = start_upstream(lab.root, info)
        url = forward.add(int(upstream.info["http"].rsplit(":", 1)[1]))
        serving = {i: {"backend": "openai", "base_url": url, "name": BUNDLED}
                   for i in list(range(2, n, 3))[:SERVERS]}  # fmt: skip
    net = Network(lab, info, forward, p2p=True, discovery=True, poll=args.poll, serving=serving)
    started = net.start()
    try:
        t_mesh = wait_for(f"every node connected to >= {target}",
                          lambda: min(net.peer_counts()) >= target, 120 + 10 * n)  # fmt: skip
        time.sleep(20)
        counts = net.peer_counts()
        say(f"  mesh (shipped): {n} nodes listening in {started:.0f} s; every node >= {target} peers "
            f"{t_mesh:.1f} s later; after 20 s more: connected min {min(counts)} median {med(counts):.0f} "
            f"max {max(counts)} of {n - 1}")  # fmt: skip
        wait_for("version >= 1 everywhere", lambda: all(net.roots()), 180)
        idle_s = 60.0
        before = bytes_sent(net)
        time.sleep(idle_s)
        idle = [(b - a) * 60 / idle_s for a, b in zip(before, bytes_sent(net), strict=True)]
        before, t0 = bytes_sent(net), time.monotonic()
        by_node: list[dict[int, float]] = []
        with machine_busy() as busy:
            gossip = propagate(chain, net, args.versions, per_node=by_node)
        window = time.monotonic() - t0
        per_version = [((b - a) - rate * window / 60) / args.versions
                       for a, b, rate in zip(before, bytes_sent(net), idle, strict=True)]  # fmt: skip
        say("  " + spread("with gossip (shipped)", gossip, busy[0]))
        ratio = med([max(r) for r in polling]) / med([max(r) for r in gossip])
        say(f"  polling / gossip, median time to all: {ratio:.2f}x")
        say("  " + by_content_source(net, by_node))
        ideal = len(encode(Announcement(version=9, root="0x" + "ab" * 32, cid=status_cid(net),
                                        chain_id=31337, registry=info.registry_address)))  # fmt: skip
        kib = lambda xs: f"median {med(xs) / 1024:.1f} KiB, max {max(xs) / 1024:.1f} KiB"  # noqa: E731
        say(f"  bytes sent per node per idle minute: {kib(idle)}")
        say(f"  bytes sent per node per version (idle rate removed): {kib(per_version)}; the ideal, one "
            f"announcement to each node, is {ideal} B (x{med(per_version) / ideal:.1f}; half the nodes also "
            "fetch the library bytes from peers)")  # fmt: skip
        bootstrap_death(net)
        churn(chain, net)
        partition(chain, net)
        liars(chain, net)
        if upstream is not None:
            routing_under_churn(net, sorted(serving))
    finally:
        lab.stop_all()
        if upstream is not None:
            upstream.stop()


def status_cid(net: Network) -> str:
    st = try_status(net.lab.nodes[0])
    return st.library.cid if st is not None else "bafkqaaa"


def bootstrap_death(net: Network) -> None:
    lab = net.lab
    lab.kill(lab.nodes[0])
    time.sleep(45)
    after = net.peer_counts(lab.nodes[1:])
    capable = [st.peers.capable if (st := try_status(node)) else -1 for node in lab.nodes[1:]]
    say(f"  node 0 (the bootstrap) killed, 45 s later: connected peers min {min(after)} median "
        f"{med(after):.0f}; capable peers min {min(capable)} median {med(capable):.0f}")  # fmt: skip
    net.start([lab.nodes[0]])


def churn(chain: Chain, net: Network) -> None:
    """A third of the nodes, node 0 among them, killed with -9 as a version propagates, restarted 10 s
    later: every node converges; none ever serves a root the chain does not hold; survivors keep a mesh."""
    lab, n = net.lab, net.lab.n
    victims = [lab.nodes[0], *random.Random(1).sample(lab.nodes[1:], n // 3 - 1)]
    survivors = [x for x in lab.nodes if x not in victims]
    lows: list[int] = []

    def kill() -> None:
        for node in victims:
            lab.kill(node)

        def watch() -> None:
            for _ in range(20):
                lows.append(min(net.peer_counts(survivors)))
                time.sleep(0.5)

        threading.Thread(target=watch, daemon=True).start()

    runs = propagate(chain, net, 1, on_execute=kill, nodes=survivors)
    time.sleep(10)
    t0 = time.monotonic()
    net.start(victims)
    lib = chain.registry.current()
    root = "0x" + lib.root.hex()
    # Not caught up after 300 s is a figure, not the end of the run: the phases after it still measure.
    current = lambda: all(r == root for r in net.roots())  # noqa: E731
    caught_up = wait_until(current, 300) is not None
    behind = [node.i for node, r in zip(lab.nodes, net.roots(), strict=True) if r != root]
    back = (f"caught up {time.monotonic() - t0:.1f} s after their restart" if caught_up
            else f"nodes {behind} not on it 300 s after their restart")  # fmt: skip
    onchain = {("0x" + chain.registry.version_at(v).root.hex()) for v in range(1, lib.version + 1)}
    served = set(net.roots())
    say(f"  churn: {len(victims)} of {n} killed (-9, node 0 among them) as version {lib.version} propagated: "
        f"survivors had it {max(runs[0]):.2f} s after execution, their connected peers never below "
        f"{min(lows) if lows else '?'}; the killed, restarted 10 s later: {back}; roots served that the "
        f"chain does not hold: {len(served - onchain)}")  # fmt: skip


def partition(chain: Chain, net: Network) -> None:
    """The even and odd nodes cut apart (no FIN, no RST: packets are refused by the routes between them):
    how long until the nodes notice (a ping unanswered), whether each half keeps following the chain,
    and how long after the cut heals until every node has a peer in the other half again."""
    lab = net.lab
    halves = [lab.nodes[0::2], lab.nodes[1::2]]
    across = lambda: [cross_peers(x, halves[1 - x.i % 2]) for x in lab.nodes]  # noqa: E731
    lab.partition()
    try:
        t_noticed = wait_for("no connection across the cut", lambda: max(across()) == 0, 180, 1.0)
        runs = propagate(chain, net, 1)
        say(f"  partition (even | odd nodes cut apart): connections across the cut dropped "
            f"{t_noticed:.0f} s later (kernel keepalive and user timeout); both halves then activated a new "
            f"version within {max(runs[0]):.2f} s of its execution (chain polling and gossip within each "
            "half)")  # fmt: skip
    finally:
        lab.heal()
    t_join = wait_for("the healed network connected as one", lambda: one_network(lab.nodes), 300, 1.0)
    bridged = sum(1 for c in across() if c > 0)
    runs = propagate(chain, net, 1)
    say(f"  healed: the network is one again (a path of connections between any two nodes) {t_join:.1f} s "
        f"later, {bridged} of {lab.n} nodes then with a peer across; a new version then active on all within "
        f"{max(runs[0]):.2f} s of its execution")  # fmt: skip


def connected_ids(node: LabNode) -> set[str]:
    if node.process is None:
        return set()
    try:
        with NodeClient(node.process.address) as client:
            listing = client.peers()
    except Exception:
        return set()
    return {p.peer_id for p in listing.peers if p.connected}


def cross_peers(node: LabNode, others: list[LabNode]) -> int:
    return len(connected_ids(node) & {o.peer_id for o in others})


def one_network(nodes: list[LabNode]) -> bool:
    """Whether the nodes' connections join them all (each node's listing read once)."""
    edges = {node.peer_id: connected_ids(node) for node in nodes}
    seen, todo = set(), [nodes[0].peer_id]
    while todo:
        peer = todo.pop()
        if peer not in seen:
            seen.add(peer)
            todo += [p for p in edges.get(peer, ()) if p in edges]
            todo += [p for p, theirs in edges.items() if peer in theirs]
    return seen == set(edges)


def liars(chain: Chain, net: Network) -> None:
    """k rogue hosts connect to the network, announce wrong roots, flood, and serve tampered bytes as DHT
    providers of every version's CID. Honest propagation is measured just before they come, in the same
    state of the network (after churn and partition), and again beside them."""
    lab = net.lab
    honest_runs = propagate(chain, net, 3, strict=False)
    k = max(1, lab.n // 8)
    rogues = [rogue_host(lab.root / f"rogue{j}") for j in range(k)]
    try:
        for rogue in rogues:
            for node in random.Random(2).sample(lab.nodes, min(4, lab.n)):
                _quiet(rogue.connect, node.p2p_addr)

        chain_id = int(chain.w3.eth.chain_id)

        def lie() -> None:
            version = chain.registry.current().version
            cid = chain.registry.current().cid
            for rogue in rogues:
                for j in range(3):  # three different wrong roots: each a separate verdict, each -10
                    wrong = Announcement(version=version, root="0x" + f"{j + 1:02x}" * 32, cid=cid,
                                         chain_id=chain_id, registry=net.info.registry_address)  # fmt: skip
                    _quiet(rogue.publish, LIBRARY_TOPIC, encode(wrong))
                for _ in range(100):
                    _quiet(rogue.publish, LIBRARY_TOPIC, b"x" * 100)
                _quiet(rogue.provide, cid, 5.0)

        runs = propagate(chain, net, 3, on_execute=lie, strict=False)
        time.sleep(5)
        banned = []
        for rogue in rogues:
            count = 0
            for node in lab.nodes:
                if node.process is None:
                    continue
                with NodeClient(node.process.address) as client:
                    listing = client.peers()
                count += any(p.peer_id == rogue.peer_id and p.banned for p in listing.peers)
            banned.append(count)
        base, liar = med([max(r) for r in honest_runs]), med([max(r) for r in runs])
        node_base, node_liar = med([med(r) for r in honest_runs]), med([med(r) for r in runs])
        say(f"  liars: {k} rogue host(s) announcing wrong roots, flooding and providing tampered bytes: "
            f"banned by {banned} of {lab.n} honest nodes; execution -> active on all, median {liar:.2f} s "
            f"beside {base:.2f} s just before they came ({liar / base:.2f}x); on the median node "
            f"{node_liar:.2f} s beside {node_base:.2f} s ({node_liar / node_base:.2f}x)")  # fmt: skip
    finally:
        for rogue in rogues:
            rogue.stop()


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    with suppress(Exception):  # a rogue's calls: whatever the honest nodes do to it is the point
        fn(*args)


def rogue_host(directory: Path) -> P2PHost:
    host = P2PHost(load_identity(directory / "identity.key"), f"/ip4/{SERVICE_IP}/tcp/0", [LIBRARY_TOPIC],
                   validator=lambda *_: True, on_message=lambda *_: None,
                   content=lambda cid: b"tampered " + cid.encode(), max_content_bytes=1 << 20)  # fmt: skip
    host.start()
    # The honest nodes reset and drop the rogue's connections; py-libp2p's log of each (thousands of lines
    # of tracebacks in the bench's own process) is the point of the figure, not something to print.
    logging.getLogger("libp2p").setLevel(logging.CRITICAL + 1)
    return host


def start_upstream(root: Path, info: DevnetInfo) -> NodeProcess:
    """The one model the serving nodes front for (the bundled llama.cpp model, on this host)."""
    data = root / "upstream"
    extra = {"model": {"threads": 1}, "inference": {"default_max_tokens": 4}, "p2p": {"enabled": False}}
    node = launch(write_config(root / "upstream.toml", base_config(data, extra)), data)
    node.wait_listening()
    node.wait_component("model", "SERVING", timeout_s=240)
    return node


def routing_under_churn(net: Network, servers: list[int]) -> None:
    """Routed Infer requests through a light node while a third of the serving nodes are killed and
    restarted in turn; the router tries up to two other peers after transport failures (p2p.routing)."""
    lab = net.lab
    router = next(node for node in lab.nodes[1:] if node.i not in servers and node.alive)
    assert router.process is not None
    capable = lambda: (st := try_status(router)) is not None and st.peers.capable >= len(servers)  # noqa: E731
    wait_for("the serving nodes capable at the router", capable, 120)
    stop = threading.Event()
    churned = servers[: max(1, len(servers) // 3)]

    def churn_loop() -> None:
        while not stop.is_set():
            for i in churned:
                lab.kill(lab.nodes[i])
                time.sleep(5)
                net.start([lab.nodes[i]])
                time.sleep(5)

    worker = threading.Thread(target=churn_loop, daemon=True)
    request = pb.InferRequest(
        prompt="Name a colour.", model=BUNDLED, sampling=pb.SamplingParams(max_tokens=4)
    )
    ok = failed = 0
    errors: dict[str, int] = {}
    worker.start()
    deadline = time.monotonic() + 90
    with NodeClient(router.process.address) as client:
        while time.monotonic() < deadline:
            try:
                client.inference.Infer(request, timeout=60)
                ok += 1
            except Exception as e:  # grpc.RpcError
                failed += 1
                code = getattr(e, "code", lambda: "?")()
                errors[str(code)] = errors.get(str(code), 0) + 1
    stop.set()
    worker.join(60)
    share = ok / max(1, ok + failed)
    say(f"  routing under churn: {ok + failed} routed Infer requests through node {router.i} while "
        f"{len(churned)} of {len(servers)} serving nodes were killed and restarted in turn: {share:.1%} "
        f"answered (failures by code: {errors or 'none'}); rule: the least-loaded peer, then up to two "
        "others after transport failures, one that failed asked last until it advertises again")  # fmt: skip


@contextmanager
def devnet(root: Path) -> Iterator[tuple[DevnetInfo, Chain]]:
    dn = Devnet(root / "devnet")
    info, _ = dn.up(die_with_parent=True)
    chain = chain_of(info)
    try:
        yield info, chain
    finally:
        chain.ipfs.close()
        dn.down()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--versions", type=int, default=5, help="library versions per propagation figure")
    ap.add_argument(
        "--poll", type=float, default=2.0, help="chain.poll_interval_s of every node (the default)"
    )
    ap.add_argument("--skip-routing", action="store_true", help="no model-serving nodes, no routing figure")
    args = ap.parse_args()
    if args.nodes < 4:
        raise SystemExit("--nodes must be at least 4")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the lab's namespaces and nodes are removed
    reason = available()
    if reason is not None:
        raise SystemExit(f"./zoo bench network needs network namespaces: {reason}")
    root = Path(tempfile.mkdtemp(prefix="zoo-bench-network-"))
    say(f"# ./zoo bench network --nodes {args.nodes} (light nodes, one devnet; node 0 the only bootstrap)")
    with devnet(root) as (info, chain):
        lab = Lab(args.nodes, root)
        forward = Forwarder([int(info.rpc_url.rsplit(":", 1)[1]), int(info.ipfs_api.rsplit(":", 1)[1])])
        try:
            polling = run_polling(lab, info, forward, chain, args)
            run_star(lab, info, forward, args)
            run_mesh(lab, info, forward, chain, args, polling)
        finally:
            lab.close()
            forward.close()


if __name__ == "__main__":
    main()
