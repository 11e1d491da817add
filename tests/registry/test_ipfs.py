"""The Kubo RPC client against a real js-ipfs daemon, content verification, the devnet daemon's lifecycle."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from zoo.devnet.ipfs_daemon import IpfsDaemon, IpfsDaemonError
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.errors import (
    ContentTooLarge,
    IntegrityError,
    IpfsError,
    IpfsTimeout,
    IpfsUnavailable,
    ValidationError,
)
from zoo.registry.ipfs import RAW_CID_MAX, IpfsClient, local_cid, normalise_cid, parse_cid
from zoo.registry.library import Library
from zoo.registry.merkle import library_root


def _block_file(daemon: IpfsDaemon, raw_cid: str) -> Path:
    # js-ipfs keeps each block in REPO/blocks/<shard>/<base32 of the multihash>.data
    name = base64.b32encode(bytes(parse_cid(raw_cid).digest)).decode().rstrip("=")
    (path,) = (daemon.repo_dir / "blocks").rglob(name + ".data")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the client against the real daemon ----------------------------------------------------------


def test_version(ipfs: IpfsClient) -> None:
    assert isinstance(ipfs.version()["Version"], str)


def test_library_add_cat_round_trip(ipfs: IpfsClient, library: Library) -> None:
    data = encode_library(library)
    cid = ipfs.add(data)
    assert cid.startswith("bafk")  # CIDv1, raw leaf, base32
    assert ipfs.cat(cid) == data
    back = decode_library(ipfs.fetch_verified(cid))
    assert back == library and library_root(back) == library_root(library)


@pytest.mark.parametrize("size", [0, 1, 1000, RAW_CID_MAX - 1, RAW_CID_MAX])
def test_local_cid_matches_daemon(ipfs: IpfsClient, size: int) -> None:
    data = os.urandom(size)
    cid = ipfs.add(data, pin=False, only_hash=True)
    assert local_cid(data) == cid == ipfs.cid_of(data)


def test_large_content_round_trips_and_verifies(ipfs: IpfsClient) -> None:
    data = os.urandom(3 * RAW_CID_MAX + 12345)
    cid = ipfs.add(data)
    assert cid.startswith("bafy")  # a UnixFS DAG over raw leaves, computed locally all the same
    assert ipfs.cid_of(data) == local_cid(data) == cid
    assert ipfs.fetch_verified(cid) == data


def test_cat_of_missing_cid_times_out(ipfs: IpfsClient) -> None:
    missing = local_cid(b"no daemon anywhere has these bytes " + os.urandom(16))
    start = time.monotonic()
    with pytest.raises(IpfsTimeout):
        ipfs.cat(missing, timeout=0.5)
    assert time.monotonic() - start < 4


def test_pin_and_pins(ipfs: IpfsClient) -> None:
    cid = ipfs.add(b"pin me later " + os.urandom(8), pin=False)
    assert cid not in ipfs.pins()
    ipfs.pin(cid)
    assert cid in ipfs.pins()
    pinned = ipfs.add(b"pinned at once " + os.urandom(8))
    assert pinned in ipfs.pins()


def test_max_size_enforced(ipfs: IpfsClient) -> None:
    data = os.urandom(RAW_CID_MAX * 2)
    cid = ipfs.add(data)
    assert ipfs.cat(cid, max_size=len(data)) == data
    with pytest.raises(IpfsError, match="exceeds max_size=1000"):
        ipfs.cat(cid, max_size=1000)
    assert ipfs.declared_size(cid) == len(data)


def test_content_declaring_too_many_bytes_is_refused_before_download(
    ipfs: IpfsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(RAW_CID_MAX * 2 + 5)
    cid = ipfs.add(data)
    assert ipfs.fetch_verified(cid, max_size=len(data)) == data

    def no_download(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("cat must not be called for content over the limit")

    monkeypatch.setattr(ipfs, "cat", no_download)
    limit = len(data) - 1
    with pytest.raises(ContentTooLarge, match=f"declares {len(data)} bytes, over the limit of {limit}"):
        ipfs.fetch_verified(cid, max_size=limit)


def test_daemon_errors_carry_its_message(ipfs: IpfsClient) -> None:
    directory = "QmUNLLsPACCz1vLxQVkXqqLX5R1X345qqfHbsf67hvA3Nn"  # the empty UnixFS directory, in every repo
    with pytest.raises(IpfsError) as info:
        ipfs.cat(directory, timeout=5)
    assert not isinstance(info.value, IpfsTimeout)
    assert "directory" in str(info.value).lower()
    assert info.value.values["status"] == 500


def test_malformed_cid_rejected_before_any_request(ipfs: IpfsClient) -> None:
    with pytest.raises(ValidationError) as info:
        ipfs.cat("not-a-cid")
    assert info.value.field == "cid"


def test_closed_port_is_unavailable() -> None:
    with IpfsClient(f"http://127.0.0.1:{_free_port()}", timeout=2) as client, pytest.raises(IpfsUnavailable):
        client.version()


def test_normalise_cid_spellings() -> None:
    cid = local_cid(b"hello world")
    base58 = parse_cid(cid).set(base="base58btc")
    assert str(base58).startswith("z") and normalise_cid(str(base58)) == cid
    assert normalise_cid("QmUNLLsPACCz1vLxQVkXqqLX5R1X345qqfHbsf67hvA3Nn").startswith("bafybei")


# -- tampering: bytes that do not match their CID are refused --------------------------------------


def test_verify_given_cid_and_bytes(ipfs: IpfsClient) -> None:
    small, large = b"original lesson", os.urandom(RAW_CID_MAX + 1)
    ipfs.verify(local_cid(small), small)
    ipfs.verify(ipfs.cid_of(large), large)
    with pytest.raises(IntegrityError):
        ipfs.verify(local_cid(small), b"tampered lesson")
    with pytest.raises(IntegrityError):
        ipfs.verify(ipfs.cid_of(large), large[:-1] + bytes([large[-1] ^ 1]))


def test_verify_cidv0_content(ipfs: IpfsClient, ipfs_daemon: IpfsDaemon) -> None:
    # What `ipfs add` with Kubo's defaults produces: CIDv0, a dag-pb node without raw leaves.
    data = b"added by another tool " + os.urandom(8)
    answer = httpx.post(f"{ipfs_daemon.api_url}/api/v0/add", params={"cid-version": "0"}, files={"f": data})
    cid = answer.json()["Hash"]
    assert cid.startswith("Qm")
    assert ipfs.fetch_verified(cid) == data
    with pytest.raises(IntegrityError):
        ipfs.verify(cid, data + b"!")


def test_corrupted_blockstore_detected(ipfs: IpfsClient, ipfs_daemon: IpfsDaemon, library: Library) -> None:
    # The daemon serves whatever its blockstore holds; overwrite a block on disk as a faulty disk or a
    # dishonest operator would. cat() passes the bytes through, fetch_verified() refuses them.
    data = encode_library(library)
    cid = ipfs.add(data)
    tampered = data.replace(b"0.500000", b"0.999999")
    assert len(tampered) == len(data) and tampered != data
    _block_file(ipfs_daemon, cid).write_bytes(tampered)
    assert ipfs.cat(cid) == tampered
    with pytest.raises(IntegrityError):
        ipfs.fetch_verified(cid)


def test_corrupted_leaf_of_large_content_detected(ipfs: IpfsClient, ipfs_daemon: IpfsDaemon) -> None:
    data = os.urandom(2 * RAW_CID_MAX + 7)
    cid = ipfs.add(data)
    first_leaf = local_cid(data[:RAW_CID_MAX])  # default chunker: 262144-byte raw leaves
    _block_file(ipfs_daemon, first_leaf).write_bytes(b"\x00" * RAW_CID_MAX)
    assert ipfs.cat(cid)[:8] == b"\x00" * 8
    with pytest.raises(IntegrityError):
        ipfs.fetch_verified(cid)


def test_lying_gateway_detected() -> None:
    # A remote API that answers cat with other bytes than the CID names.
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        if request.url.path == "/api/v0/files/stat":
            return httpx.Response(200, json={"Size": len(b"forged content")})
        assert request.url.path == "/api/v0/cat"
        return httpx.Response(200, content=b"forged content")

    cid = local_cid(b"genuine content")
    with IpfsClient("http://gateway.invalid", transport=httpx.MockTransport(handler)) as client:
        assert client.cat(cid) == b"forged content"
        with pytest.raises(IntegrityError) as info:
            client.fetch_verified(cid)
    assert info.value.values["cid"] == cid


def test_kubo_error_format_mapped() -> None:
    answers = {
        "/api/v0/version": httpx.Response(
            500, json={"Message": "repo is locked", "Code": 0, "Type": "error"}
        ),
        "/api/v0/cat": httpx.Response(
            500, json={"Message": "context deadline exceeded", "Code": 0, "Type": "error"}
        ),
    }
    transport = httpx.MockTransport(lambda request: answers[request.url.path])
    with IpfsClient("http://kubo.invalid", transport=transport) as client:
        with pytest.raises(IpfsError, match="version: repo is locked") as info:
            client.version()
        assert info.value.values["daemon_message"] == "repo is locked"
        with pytest.raises(IpfsTimeout, match="context deadline exceeded"):
            client.cat(local_cid(b"x"))


# -- the devnet daemon itself ----------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited already


def _wait_dead(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_daemon_lifecycle(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    port = _free_port()
    # 1. A child process starts a daemon with die_with_parent on a fixed port, then dies by SIGKILL.
    script = textwrap.dedent(
        f"""
        import json, sys, time
        from zoo.devnet.ipfs_daemon import IpfsDaemon
        d = IpfsDaemon({str(repo)!r}, api_port={port}, die_with_parent=True).start()
        print(json.dumps({{"pid": d.pid, "url": d.api_url}}), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        assert info["url"] == f"http://127.0.0.1:{port}"
        with IpfsClient(info["url"], timeout=5) as client:
            cid = client.add(b"survives restarts")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert _wait_dead(info["pid"]), "the daemon outlived its parent"
    finally:
        child.kill()
        child.wait()

    # 2. The same repository is reused (no init) on a daemon-chosen port; content is still there.
    daemon = IpfsDaemon(repo).start()
    try:
        assert daemon.api_url != info["url"]
        with IpfsClient(daemon.api_url, timeout=5) as client:
            assert client.cat(cid) == b"survives restarts"
        # 3. A second daemon on a live repository is refused with a clear message.
        with pytest.raises(IpfsDaemonError, match="already running"):
            IpfsDaemon(repo).start()
        # 4. SIGKILL leaves js-ipfs's lock behind; the next start clears it instead of failing for 20 s.
        os.killpg(daemon.pid, signal.SIGKILL)
        assert _wait_dead(daemon.pid)
        assert (repo / "repo.lock").exists()
    finally:
        daemon.stop()
    with IpfsDaemon(repo) as again:
        pid = again.pid
        with IpfsClient(again.api_url, timeout=5) as client:
            assert client.cat(cid) == b"survives restarts"
    assert _wait_dead(pid, timeout=1) and not (repo / "repo.lock").exists()


def test_daemon_port_conflict_is_reported(tmp_path: Path, ipfs_daemon: IpfsDaemon) -> None:
    taken = int(ipfs_daemon.api_url.rsplit(":", 1)[1])
    with pytest.raises(IpfsDaemonError, match=f"port {taken}"):
        IpfsDaemon(tmp_path / "repo", api_port=taken).start()
