"""LibraryService over gRPC and the `zoo-node library` commands, against a node on its real devnet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import grpc
import pytest

from tests.conftest import NodeProcess, base_config, launch, write_config
from zoo.devnet.genesis import genesis_library
from zoo.node.client import NodeClient
from zoo.registry.merkle import InclusionProof, library_root, verify_inclusion
from zoo.v1 import library_pb2 as pb


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("library-node")
    data_dir = tmp / "data"
    cfg = write_config(
        tmp / "node.toml", base_config(data_dir, {"chain": {"mode": "devnet", "poll_interval_s": 0.3}})
    )
    n = launch(cfg, data_dir)
    n.wait_listening(timeout_s=120)
    n.wait_component("library", "SERVING", timeout_s=120)
    yield n
    n.stop()


def cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOO_NODE_")} | {"COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", *args, "--config", str(node.config_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_get_library_pages_and_proofs(node: NodeProcess) -> None:
    genesis = genesis_library()
    with NodeClient(node.address) as c:
        first = c.library.GetLibrary(pb.GetLibraryRequest(page_size=4))
        second = c.library.GetLibrary(pb.GetLibraryRequest(page_size=4, page_token=first.next_page_token))
        assert first.library.root == "0x" + library_root(genesis).hex()
        assert first.library.experience_count == len(genesis.experiences)
        ids = [e.id for e in first.experiences] + [e.id for e in second.experiences]
        assert ids == [e.id for e in genesis.experiences] and second.next_page_token == ""
        target = ids[3]
        got = c.library.GetExperience(pb.GetExperienceRequest(id=target))
        assert got.onchain_root == got.library.root
        proof = InclusionProof(got.proof.leaf_index, got.proof.tree_size, list(got.proof.path))
        assert verify_inclusion(got.experience.canonical, proof, bytes.fromhex(got.library.root[2:]))
        flipped = bytearray(got.experience.canonical)
        flipped[10] ^= 1
        assert not verify_inclusion(bytes(flipped), proof, bytes.fromhex(got.library.root[2:]))
        v = c.library.VerifyExperience(pb.VerifyExperienceRequest(id=target))
        assert v.valid and "registry holds" in v.reason


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (pb.GetExperienceRequest(id="nope"), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GetExperienceRequest(id="exp-0000000000000000"), grpc.StatusCode.NOT_FOUND),
        (pb.GetExperienceRequest(id="exp-0000000000000000", version=99), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_get_experience_errors(
    node: NodeProcess, request_: pb.GetExperienceRequest, code: grpc.StatusCode
) -> None:
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        c.library.GetExperience(request_)
    assert e.value.code() == code


def test_bad_paging_is_invalid_argument(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        for req in (pb.GetLibraryRequest(page_token="x"), pb.GetLibraryRequest(page_size=5000)):
            with pytest.raises(grpc.RpcError) as e:
                c.library.GetLibrary(req)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_draft_build_propose_vote_execute_sync_verify(node: NodeProcess, tmp_path) -> None:
    text = "When dividing fractions, multiply by the reciprocal of the divisor."
    bad = cli(node, "library", "add", "--text", "Divide fractions", "--domain", "Math", "--confidence", "1.5")
    assert (
        bad.returncode == 2
        and "text:" in bad.stderr
        and "domain:" in bad.stderr
        and "confidence" in bad.stderr
    )
    added = cli(node, "library", "add", "--text", text, "--domain", "math.arithmetic", "--confidence", "0.8")
    assert added.returncode == 0, added.stderr
    assert added.stdout.split()[:2] == ["added", "lesson"]
    new_id = added.stdout.split()[2]
    # A worked example goes through the same draft, build, governance and sync (a format-2 library).
    worked = cli(node, "library", "add", "--question", "What is 1/2 divided by 1/4?", "--answer", "2",
                 "--reasoning", "Multiply 1/2 by 4/1.", "--domain", "math.arithmetic")  # fmt: skip
    assert worked.returncode == 0, worked.stderr
    assert worked.stdout.split()[:2] == ["added", "example"]
    example_id = worked.stdout.split()[2]
    both = cli(node, "library", "add", "--text", text, "--question", "q?", "--domain", "math.arithmetic")
    assert both.returncode == 2 and "not both" in both.stderr
    imported = tmp_path / "more.json"
    imported.write_text(
        json.dumps(
            [
                {
                    "text": "When rounding, look only at the next digit.",
                    "domain": "math.arithmetic",
                    "confidence": 0.6,
                }
            ]
        )
    )
    assert cli(node, "library", "import", str(imported)).returncode == 0
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    assert cli(node, "library", "import", str(broken)).returncode == 2
    diff = cli(node, "library", "diff", "1", "draft")
    assert "3 added, 0 removed" in diff.stdout and new_id in diff.stdout and example_id in diff.stdout
    built = cli(node, "library", "build")
    assert built.returncode == 0 and "built version 2" in built.stdout
    proposed = cli(node, "library", "propose")
    assert proposed.returncode == 0, proposed.stderr
    proposal = re.search(r"proposed version 2 as (0x[0-9a-f]{64}): root (0x[0-9a-f]{64})", proposed.stdout)
    assert proposal, proposed.stdout
    pid, root = proposal.groups()
    assert cli(node, "devnet", "warp", "1").returncode == 0
    for key in ("dev0", "dev1", "dev2"):
        voted = cli(node, "dao", "vote", pid, "--for", "--key", key)
        assert voted.returncode == 0, voted.stderr
    assert cli(node, "devnet", "warp", "400").returncode == 0
    assert cli(node, "dao", "execute", pid).returncode == 0
    deadline = time.monotonic() + 60
    with NodeClient(node.address) as c:
        while c.status().library.root != root and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.status().library.version == 2
    synced = cli(node, "library", "sync")
    assert synced.returncode == 0 and "version 2" in synced.stdout
    for experience in (new_id, example_id):
        verified = cli(node, "library", "verify", experience)
        assert verified.returncode == 0 and "on-chain check against version 2: valid" in verified.stdout
    exported = tmp_path / "v2.json"
    assert cli(node, "library", "export", str(exported), "--version", "2").returncode == 0
    document = json.loads(exported.read_text())
    assert document["schema"] == "zoo.experience-library/2"
    assert len(document["experiences"]) == len(genesis_library().experiences) + 3
    [doc] = [e for e in document["experiences"] if e["id"] == example_id]
    assert (doc["kind"], doc["text"], doc["answer"]) == ("example", "What is 1/2 divided by 1/4?", "2")
    shown = cli(node, "library", "show")
    assert "library version 2" in shown.stdout and new_id in shown.stdout
    assert any(example_id in line and " example " in line for line in shown.stdout.splitlines()), shown.stdout
