"""The gRPC stubs the package imports are exactly what grpcio-tools generates from proto/ now."""

from __future__ import annotations

import runpy
from pathlib import Path

import zoo.v1.node_pb2 as node_pb2

REPO = Path(__file__).resolve().parents[3]


def test_stubs_match_proto_sources(tmp_path: Path) -> None:
    gen = runpy.run_path(str(REPO / "scripts" / "gen_proto.py"))
    generated = gen["generate"](tmp_path)
    installed_dir = Path(node_pb2.__file__).parent
    assert generated, "protoc produced nothing"
    names = set()
    for path in generated:
        rel = path.relative_to(tmp_path / "zoo" / "v1")
        names.add(rel.name)
        installed = installed_dir / rel
        assert installed.exists(), f"{rel} is generated from proto/ but not installed; run ./zoo setup"
        assert installed.read_bytes() == path.read_bytes(), f"{rel} is stale: proto/ changed, run ./zoo setup"
    for proto in (REPO / "proto" / "zoo" / "v1").glob("*.proto"):
        assert f"{proto.stem}_pb2_grpc.py" in names
