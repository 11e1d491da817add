"""Generate the Python gRPC stubs for proto/zoo/v1/*.proto with grpcio-tools.

Used by setup.py at build time and by the stub-drift test (which generates into a
temporary directory and compares byte for byte with the stubs the package imports).
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto under proto_root into out_dir."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_root}")
    well_known = str(Path(grpc_tools.__file__).parent / "_proto")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed: " + " ".join(args))
    return sorted(p for p in out_dir.rglob("*_pb2*.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT
    for path in generate(target):
        print(path)
