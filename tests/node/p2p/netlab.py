"""A network lab on one machine: zoo-node daemons, each in a Linux network namespace of its own, routed by
this host, so that partitions, per-node byte counts and kills are real (benchmarks/network.py uses it).

Node i lives in namespace `zl{i}` behind a veth pair: the host side is 10.{78+h}.{i}.1/24, the node
10.{78+h}.{i}.2/24, where h = i % 2 is its half, so a partition between the halves is two policy-routing
rules (`ip rule ... prohibit`) and no firewall. The devnet (anvil, IPFS) listens on the host's loopback,
which no namespace can reach: `Forwarder` relays TCP from a service address (10.80.0.1, added to the
host's loopback device) to it. Everything the lab creates is removed by `close` (and named `zl*`, so that
a lab left behind by a killed run is removed by the next one before it starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import NodeProcess, launch
from zoo.node.p2p.host import load_identity, peer_id_of

SERVICE_IP = "10.80.0.1"
P2P_PORT = 4001
HALVES = ("10.78.0.0/16", "10.79.0.0/16")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespace_on_host(ns: str, host_if: str, host_ip: str, ns_ip: str) -> None:
    """Namespace `ns` with eth0 (ns_ip/24) a veth to this host (host_if, host_ip/24); no routes yet."""
    ip("netns", "add", ns)
    ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("addr", "add", f"{host_ip}/24", "dev", host_if)
    ip("link", "set", host_if, "up")
    ip("-n", ns, "addr", "add", f"{ns_ip}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    ip("-n", ns, "link", "set", "lo", "up")


def node_ip(i: int) -> str:
    return f"10.{78 + i % 2}.{i}.2"


def available() -> str | None:
    """None when this machine can build the lab, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"zlprobe{os.getpid()}"  # per process: test workers probe at the same moment when they collect
    probe = ip("netns", "add", name, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    ip("netns", "del", name, check=False)
    return None


def clean_up_leftovers() -> None:
    """Remove the lab's namespaces (killing what still runs in them: a namespace lives on, with its veth,
    while a process holds it), the host ends of their veths, the service address and the partition rules."""
    for name in ip("netns", "list").stdout.split():
        if re.fullmatch(r"zl\w*", name):
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if re.fullmatch(r"zlh\d+", name):
            ip("link", "del", name, check=False)
    ip("addr", "del", f"{SERVICE_IP}/32", "dev", "lo", check=False)
    for prefix_from, prefix_to in (HALVES, HALVES[::-1]):
        while ip("rule", "del", "from", prefix_from, "to", prefix_to, check=False).returncode == 0:
            pass


def launch_in(ns: str, config_file: Path, data_dir: Path) -> NodeProcess:
    """`zoo-node start` inside namespace `ns`."""
    return launch(config_file, data_dir, env={"ZOO_NODE_BANNER": "0"}, prefix=("ip", "netns", "exec", ns))


class Forwarder:
    """TCP from SERVICE_IP:port to 127.0.0.1:target for each (port, target), in a thread of its own.
    Hand-written: a dozen lines of asyncio, where socat is not installed here."""

    def __init__(self, targets: Iterable[int], ip: str = SERVICE_IP) -> None:
        self.ip = ip
        self.ports: dict[int, int] = {}  # target -> port on self.ip
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="forwarder", daemon=True)
        self._thread.start()
        for target in targets:
            self.add(target)

    def add(self, target: int) -> str:
        """Forward one more local port; returns its URL as the namespaces see it."""
        server = asyncio.run_coroutine_threadsafe(self._serve(target), self._loop).result(10)
        self.ports[target] = server.sockets[0].getsockname()[1]
        return self.url(target)

    async def _serve(self, target: int) -> asyncio.Server:
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        server = await asyncio.start_server(relay, self.ip, 0)
        self._servers.append(server)
        return server

    def url(self, target: int) -> str:
        return f"http://{self.ip}:{self.ports[target]}"

    def close(self) -> None:
        async def shut() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@dataclass
class LabNode:
    i: int
    data_dir: Path
    config_file: Path
    peer_id: str
    process: NodeProcess | None = None

    @property
    def ns(self) -> str:
        return f"zl{self.i}"

    @property
    def ip(self) -> str:
        return node_ip(self.i)

    @property
    def p2p_addr(self) -> str:
        return f"/ip4/{self.ip}/tcp/{P2P_PORT}/p2p/{self.peer_id}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None


@dataclass
class Lab:
    """The namespaces of `n` nodes and the host's routes between them; nodes are started by the caller."""

    n: int
    root: Path
    nodes: list[LabNode] = field(default_factory=list)
    _forwarding: str = "0"

    def __post_init__(self) -> None:
        clean_up_leftovers()
        self._forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        ip("addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
        for i in range(self.n):
            ns, gateway = f"zl{i}", f"10.{78 + i % 2}.{i}.1"
            namespace_on_host(ns, f"zlh{i}", gateway, node_ip(i))
            ip("-n", ns, "route", "add", "default", "via", gateway)
            data_dir = self.root / f"node{i}"
            seed = load_identity(data_dir / "p2p" / "identity.key")  # made now: its peer id is known
            self.nodes.append(LabNode(i, data_dir, self.root / f"node{i}.toml", peer_id_of(seed)))

    def start(self, node: LabNode, config_toml: str) -> NodeProcess:
        node.config_file.write_text(config_toml)
        node.process = launch_in(node.ns, node.config_file, node.data_dir)
        return node.process

    def kill(self, node: LabNode) -> None:
        """-9, as a crash or a pulled plug would stop it."""
        if node.process is not None and node.alive:
            os.killpg(node.process.proc.pid, 9)
            node.process.proc.wait()

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.alive:
                assert node.process is not None
                node.process.proc.terminate()
        deadline = time.monotonic() + 30
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.kill(node)

    def partition(self) -> None:
        """Cut the two halves (even and odd nodes) apart; the service address stays reachable from both."""
        for prefix_from, prefix_to in (HALVES, HALVES[::-1]):
            ip("rule", "add", "from", prefix_from, "to", prefix_to, "prohibit", "pref", "100")

    def heal(self) -> None:
        for prefix_from, prefix_to in (HALVES, HALVES[::-1]):
            ip("rule", "del", "from", prefix_from, "to", prefix_to, check=False)

    def p2p_bytes_sent(self, node: LabNode) -> int:
        """Bytes this node has sent on its open libp2p connections to other nodes (the kernel's tcp_info
        counters, `ss -ti`; connections closed since are not counted)."""
        out = subprocess.run(
            ["ip", "netns", "exec", node.ns, "ss", "-tinH", "state", "established"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        total, peer_ok = 0, False
        for line in out.splitlines():
            if not line.startswith((" ", "\t")):
                fields = line.split()
                local, remote = fields[2], fields[3]
                peer_ok = remote.rsplit(":", 1)[0].endswith(".2") and f":{P2P_PORT}" in (
                    local[-5:], remote[-5:],
                )  # fmt: skip
                continue
            match = re.search(r"bytes_sent:(\d+)", line)
            if peer_ok and match:
                total += int(match.group(1))
        return total

    def close(self) -> None:
        self.stop_all()
        clean_up_leftovers()
        Path("/proc/sys/net/ipv4/ip_forward").write_text(self._forwarding)


def nat_unavailable() -> str | None:
    """None when this machine can build the NAT lab (root, namespaces, iptables), else why not."""
    reason = available()
    if reason is None and subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        reason = "iptables is not installed (./zoo setup installs Debian's package when run as root)"
    return reason


def netns_run(ns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)


NAT_PUBLIC = {"znr": 1, "znc": 2, "zngw": 3}  # the NAT lab's public namespaces and their subnets
NAT_SERVICE_IP = "10.82.0.1"  # the NAT lab's devnet address (not SERVICE_IP: the two labs may coexist)


class NatLab:
    """A public network routed by this host, and one node behind NAT (iptables masquerade).

    Public: `znr` (the relay, 10.81.1.2), `znc` (a client node, 10.81.2.2) and the NAT gateway `zngw`
    (10.81.3.2), each on a veth to this host, which routes between them. Private: `znn` (192.168.81.2),
    whose only way out is the gateway, which masquerades it as 10.81.3.2. The public namespaces have no
    route to 192.168.81.0/24, as the internet has none to a home network; this host has one (through the
    gateway) so the test can ask the private node for its status, as its operator could. No namespace has
    a default route: nothing leaves the lab. The devnet is reached at NAT_SERVICE_IP (a Forwarder).
    """

    PRIVATE_NET, PRIVATE_IP = "192.168.81.0/24", "192.168.81.2"

    def __init__(self) -> None:
        self.close()
        self._forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        ip("addr", "add", f"{NAT_SERVICE_IP}/32", "dev", "lo")
        for ns, i in NAT_PUBLIC.items():
            namespace_on_host(ns, f"znh{i}", f"10.81.{i}.1", f"10.81.{i}.2")
            for dest in ("10.81.0.0/16", f"{NAT_SERVICE_IP}/32"):
                ip("-n", ns, "route", "add", dest, "via", f"10.81.{i}.1")
        ip("netns", "add", "znn")
        ip("link", "add", "priv0", "netns", "zngw", "type", "veth", "peer", "name", "eth0", "netns", "znn")
        ip("-n", "zngw", "addr", "add", "192.168.81.1/24", "dev", "priv0")
        ip("-n", "zngw", "link", "set", "priv0", "up")
        ip("-n", "znn", "addr", "add", f"{self.PRIVATE_IP}/24", "dev", "eth0")
        ip("-n", "znn", "link", "set", "eth0", "up")
        ip("-n", "znn", "link", "set", "lo", "up")
        ip("-n", "znn", "route", "add", "default", "via", "192.168.81.1")
        netns_run("zngw", "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        netns_run("zngw", "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", self.PRIVATE_NET, "-o", "eth0",
                  "-j", "MASQUERADE")  # fmt: skip
        ip("route", "add", self.PRIVATE_NET, "via", "10.81.3.2")

    @staticmethod
    def public_ip(ns: str) -> str:
        return f"10.81.{NAT_PUBLIC[ns]}.2"

    def start(self, ns: str, config_file: Path, data_dir: Path) -> NodeProcess:
        return launch_in(ns, config_file, data_dir)

    def can_connect(self, ns: str, host: str, port: int) -> str:
        """From inside `ns`, a TCP connect to host:port: "ok", or the error it failed with."""
        probe = (
            "import socket,sys\n"
            "s=socket.socket(); s.settimeout(5)\n"
            f"try: s.connect(({host!r}, {port})); print('ok')\n"
            "except OSError as e: print(type(e).__name__, e.strerror or e)\n"
        )
        return netns_run(ns, sys.executable, "-c", probe).stdout.strip()

    def close(self) -> None:
        for ns in ("znn", *NAT_PUBLIC):
            for pid in ip("netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            ip("netns", "del", ns, check=False)  # its veths, addresses, routes and iptables rules go too
        for i in NAT_PUBLIC.values():
            ip("link", "del", f"znh{i}", check=False)
        ip("route", "del", self.PRIVATE_NET, check=False)
        ip("addr", "del", f"{NAT_SERVICE_IP}/32", "dev", "lo", check=False)
        if hasattr(self, "_forwarding"):
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self._forwarding)
