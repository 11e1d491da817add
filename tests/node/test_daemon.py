"""The daemon as an operator runs it: a real subprocess, real sockets, real bundled model."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.conftest import REPO, NodeProcess, base_config, launch, write_config
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.provenance.weights import file_sha256
from zoo.node.client import NodeClient
from zoo.v1 import jobs_pb2, node_pb2


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    """One node shared by the read-only tests of this module (loading the model once)."""
    tmp = tmp_path_factory.mktemp("shared-node")
    data_dir = tmp / "data"
    cfg = write_config(tmp / "node.toml", base_config(data_dir))
    n = launch(cfg, data_dir)
    n.wait_listening()
    n.wait_component("model", "SERVING")
    n.wait_component("retrieval", "DEGRADED")  # embedder loaded; no library to index with the chain off
    yield n
    n.stop()


def metric_value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_health_per_component(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        assert c.health("") == "SERVING"
        assert c.health("model") == "SERVING"
        assert c.health("zoo.v1.NodeService") == "SERVING"
        # Disabled chain and IPFS are not serving; the node as a whole still is.
        assert c.health("chain") == "NOT_SERVING"
        assert c.health("ipfs") == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as e:
            c.health("no-such-component")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_get_status_fields(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        st = c.status()
    assert st.node_version == "0.1.0"
    assert st.data_dir == str(node.data_dir)
    assert st.listen_address == node.address
    assert st.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert st.chain_id == 0
    assert st.uptime_seconds > 0
    states = {c.name: node_pb2.ComponentState.Name(c.state) for c in st.components}
    assert states == {
        "chain": "COMPONENT_STATE_DISABLED",
        "ipfs": "COMPONENT_STATE_DISABLED",
        "p2p": "COMPONENT_STATE_SERVING",  # a host on loopback with no peers: up, nobody to talk to
        "model": "COMPONENT_STATE_SERVING",
        "library": "COMPONENT_STATE_DEGRADED",
        "retrieval": "COMPONENT_STATE_DEGRADED",
        "jobs": "COMPONENT_STATE_SERVING",
        "settlement": "COMPONENT_STATE_DISABLED",  # no chain, no UsageLedger
    }


def test_reflection_lists_and_describes_services(node: NodeProcess) -> None:
    channel = grpc.insecure_channel(node.address)
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {
        "zoo.v1.NodeService",
        "zoo.v1.InferenceService",
        "zoo.v1.LibraryService",
        "zoo.v1.JobService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    # What `grpcurl describe` does: resolve a service's full descriptor through reflection.
    pool = DescriptorPool(db)
    svc = pool.FindServiceByName("zoo.v1.InferenceService")
    assert {m.name for m in svc.methods} == {"Infer", "InferStream", "Retrieve", "VerifyAnswer"}
    assert pool.FindMessageTypeByName("zoo.v1.NodeStatus").fields_by_name["components"].is_repeated
    channel.close()


def test_metrics_count_requests(node: NodeProcess) -> None:
    before = httpx.get(node.metrics_url).text
    method = "/zoo.v1.NodeService/GetStatus"
    n0 = metric_value(before, "zoo_rpc_requests_total", method=method, code="OK")
    with NodeClient(node.address) as c:
        for _ in range(3):
            c.status()
    after = httpx.get(node.metrics_url).text
    assert metric_value(after, "zoo_rpc_requests_total", method=method, code="OK") == n0 + 3
    assert metric_value(after, "zoo_rpc_latency_seconds_count", method=method) >= n0 + 3
    assert metric_value(after, "zoo_component_up", component="model") == 1.0
    assert metric_value(after, "zoo_component_up", component="chain") == 0.0
    assert 'zoo_node_info{version="0.1.0"}' in after


def test_admin_rpc_needs_token(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.jobs.ListJobs(jobs_pb2.ListJobsRequest())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "Bearer" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            c.jobs.ListJobs(jobs_pb2.ListJobsRequest(), metadata=[("authorization", "Bearer wrong")])
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with NodeClient(node.address, admin_token=node.admin_token) as c:
        assert list(c.list_jobs().jobs) == []  # past authentication: the job service answers
    text = httpx.get(node.metrics_url).text
    assert (
        metric_value(
            text, "zoo_rpc_rejected_total", method="/zoo.v1.JobService/ListJobs", reason="unauthenticated"
        )
        >= 2
    )


def test_token_file_is_private(node: NodeProcess) -> None:
    mode = (node.data_dir / "admin.token").stat().st_mode & 0o777
    assert mode == 0o600
    assert len(node.admin_token) >= 32


def test_a_bad_gspo_spec_is_refused_naming_the_field(node: NodeProcess) -> None:
    from google.protobuf.struct_pb2 import Struct

    spec = Struct()
    spec.update({"lora_rank": 0})
    with NodeClient(node.address, admin_token=node.admin_token) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(kind="gspo", spec=spec), metadata=c.admin_metadata())
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.lora_rank" in e.value.details()
        # The node is still fine afterwards.
        assert c.health("") == "SERVING"


def test_status_cli(node: NodeProcess) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "status", "--data-dir", str(node.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert node.address in out.stdout
    assert re.search(r"model\s+│\s+serving", out.stdout)
    assert f"sha256    {file_sha256(bundled_gguf())}" in out.stdout
    assert re.search(r"chain\s+│\s+disabled", out.stdout)
    assert f"openai    {node.info['http']}/v1" in out.stdout
    assert re.search(r"serving   0/\d+ running, 0/\d+ waiting", out.stdout)


def test_second_daemon_on_same_data_dir_is_refused(node: NodeProcess, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "second.toml", base_config(node.data_dir))
    second = launch(cfg, node.data_dir)
    rc = second.proc.wait(60)
    assert rc == 3
    assert "in use by another zoo-node" in second.log()
    assert str(node.proc.pid) in second.log()
    # `start --check` (which ./zoo start runs before its setup) says so at once, and passes a free one.
    check = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "start", "--check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 3 and "in use by another zoo-node" in check.stderr, check.stderr
    script = subprocess.run(
        [str(REPO / "zoo"), "start", "--config", str(cfg)], capture_output=True, text=True, timeout=120
    )
    assert script.returncode == 3 and f"pid {node.proc.pid}" in script.stderr, script.stderr
    free = write_config(tmp_path / "free.toml", base_config(tmp_path / "free"))
    check = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "start", "--check", "--config", str(free)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and not (tmp_path / "free" / "node.json").exists(), check.stderr
    # The first node is untouched and still owns its node.json.
    with NodeClient.from_data_dir(node.data_dir) as c:
        assert c.status().listen_address == node.address


def test_a_node_stops_with_the_process_that_launched_it_however_that_one_dies(tmp_path: Path) -> None:
    # The node leads its own session, so a signal to its launcher's group (a time limit's) misses it: the
    # kernel's parent-death signal must still stop it when the launcher is SIGKILLed.
    script = f"""
import time
from pathlib import Path
from tests.conftest import base_config, launch, write_config
data = Path({str(tmp_path / "data")!r})
node = launch(write_config(data.with_suffix(".toml"), base_config(data)), data)
node.wait_listening()
print(node.proc.pid, flush=True)
time.sleep(120)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=REPO, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        node_pid = int(parent.stdout.readline())
        assert Path(f"/proc/{node_pid}").exists()
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _running(node_pid):
        time.sleep(0.1)
    assert not _running(node_pid), "the node outlived its SIGKILLed launcher"
    assert not (tmp_path / "data" / "node.json").exists()  # it stopped cleanly (SIGTERM), not killed


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_exits_zero_within_grace(start_node) -> None:
    n = start_node({"p2p": {"enabled": False}}, name="term")
    with NodeClient(n.address) as c:
        st = c.status()
        assert st.node_version
        # p2p switched off: a disabled component, no peer id, an empty peer list.
        p2p = next(comp for comp in st.components if comp.name == "p2p")
        assert node_pb2.ComponentState.Name(p2p.state) == "COMPONENT_STATE_DISABLED"
        assert "p2p.enabled = false" in p2p.detail
        assert st.peers.peer_id == "" and c.peers() == node_pb2.ListPeersResponse()
        assert not (n.data_dir / "p2p").exists()
    t0 = time.monotonic()
    rc = n.stop(signal.SIGTERM, timeout_s=15)
    assert rc == 0, n.log()
    assert time.monotonic() - t0 < 5 + 5  # grace_period_s = 5 in base_config, plus process teardown
    assert "msg=stopped" in n.log()
    assert not (n.data_dir / "node.json").exists()
    # The lock is free again: a new node can take the same data dir.
    again = launch(n.config_file, n.data_dir)
    again.wait_listening()
    assert again.stop(signal.SIGINT) == 0


# Runs the real CLI in a child process whose node sends itself a signal the instant it writes
# node.json: the moment a client (or the test helpers) first sees it, before it announces itself.
_SIGNAL_AT_NODE_INFO = """
import os, signal, sys
from zoo.node.datadir import DataDir
from zoo.node.cli.main import app

write, sig, config = DataDir.write_node_info, getattr(signal, sys.argv[1]), sys.argv[2]

def write_then_signal(self, info):
    write(self, info)
    os.kill(os.getpid(), sig)

DataDir.write_node_info = write_then_signal
sys.argv = ["zoo-node", "start", "--config", config]
app()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_the_instant_the_node_is_visible_still_drains_and_exits_zero(
    tmp_path: Path, sig: str
) -> None:
    # A client that reads node.json and sends a signal at once used to meet asyncio's own SIGINT
    # handler, which cancelled the start half-way: no drain, servers left for the garbage collector,
    # and once (in a full suite run) a process that ignored the signal for 30 s.
    data_dir = tmp_path / "d"
    cfg = write_config(tmp_path / "c.toml", base_config(data_dir, {"p2p": {"enabled": False}}))
    log_file = tmp_path / "node.log"
    with log_file.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-c", _SIGNAL_AT_NODE_INFO, sig, str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    log = log_file.read_text()
    assert proc.returncode == 0, log
    assert log.index('msg="zoo-node listening"') < log.index('msg="shutting down"') < log.index("msg=stopped")
    assert "never awaited" not in log and "Traceback" not in log, log
    assert not (data_dir / "node.json").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("[server]\nlisen = 1\n", "server.lisen: unknown key"),
        ("[log]\nlevel = 3\n", "log.level"),
        ('[metrics]\nenabled = "maybe"\n', "metrics.enabled"),
    ],
)
def test_bad_config_exits_nonzero_naming_problem(tmp_path: Path, extra: str, needle: str) -> None:
    data_dir = tmp_path / "d"
    text = f'data_dir = "{data_dir}"\n' + extra
    # A path longer than a console line: written to a log, the error must not wrap it across lines.
    (tmp_path / ("configs-" * 12)).mkdir()
    cfg = write_config(tmp_path / ("configs-" * 12) / "bad.toml", text)
    n = launch(cfg, data_dir)
    assert n.proc.wait(60) == 2
    log = n.log()
    assert needle in log
    assert str(cfg) in log
    assert not data_dir.exists()  # nothing was created for a node that never started


def test_bad_listen_address_flag_and_port_in_use(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    cfg = write_config(tmp_path / "c.toml", base_config(data_dir))
    n = launch(cfg, data_dir, "--listen", "localhost:99999")
    assert n.proc.wait(60) == 2
    assert "out of range" in n.log()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        n = launch(cfg, data_dir, "--listen", f"127.0.0.1:{port}")
        assert n.proc.wait(120) == 1
        assert f"cannot listen on 127.0.0.1:{port}" in n.log()


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "c.toml", base_config(tmp_path / "d", {"server": {"admin_token": "hunter2-secret"}})
    )
    out = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "config", "show", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "hunter2-secret" not in out.stdout
    assert 'admin_token = "********"' in out.stdout
    assert f'data_dir = "{tmp_path / "d"}"' in out.stdout


def test_version_flag() -> None:
    out = subprocess.run([sys.executable, "-m", "zoo.node.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.strip() == "zoo-node 0.1.0"


def test_the_daemon_opens_its_port_before_importing_the_heavy_stacks() -> None:
    # Start-up with a large library is paced by imports on two cores: the ML stack loads in the model's
    # thread and web3 in the chain follower's, never before the port opens (a second or more each).
    code = "import sys, zoo.node.daemon; print(sorted({'torch', 'web3', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tls_switch(start_node, tmp_path: Path) -> None:
    """With tls_cert/tls_key set the node serves TLS only; a plaintext client cannot talk to it."""
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path)
    n = start_node({"server": {"tls_cert": str(cert), "tls_key": str(key)}}, name="tls")
    assert n.info["tls"] is True
    with NodeClient(n.address, tls_root_cert=cert.read_bytes()) as c:
        assert c.status().node_version == "0.1.0"
    with NodeClient(n.address, timeout_s=3) as plain, pytest.raises(grpc.RpcError) as e:
        plain.status()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path
