"""The web app's in-browser library check (node/webapp/src/library.js, run here by Node.js on the same
source the bundle is built from) against the Python that every node runs: the same Merkle root for the
golden libraries and for libraries of 0 to 40 experiences (odd sizes, non-ASCII and escaped text
included), and the same refusals: a byte-order mark, a duplicate or unsorted id, a lone surrogate,
non-canonical layout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from zoo.contracts.jstools import node_binary
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.merkle import library_root

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "registry" / "golden"
CHECK = """
import { readFileSync } from "node:fs";
import { readLibrary } from "%s";
const out = JSON.parse(readFileSync(0, "utf8")).map((path) => {
  const read = readLibrary(new Uint8Array(readFileSync(path)));
  return { root: read.root ?? null, problems: read.problems };
});
console.log(JSON.stringify(out));
"""


def read_in_js(paths: list[Path]) -> list[dict]:
    script = CHECK % (ROOT / "node" / "webapp" / "src" / "library.js").as_uri()
    done = subprocess.run(
        [node_binary(), "--input-type=module", "-e", script],
        input=json.dumps([str(p) for p in paths]), capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(done.stdout)


def library(n: int) -> Library:
    texts = [
        "a plain rule",
        'a tab\there and a quote " and a backslash \\',
        "é, ß, 漢字 and 🦒",
        "a line\nbreak",
    ]
    experiences = [
        Experience.create(
            text=f"When case {i} holds, use {texts[i % len(texts)]}.", domain=f"web.case{i % 3}",
            confidence=(i % 10) / 10, author="job:test", base_model="m", created_at="2026-01-01T00:00:00Z",
        )
        for i in range(n)
    ]  # fmt: skip
    return Library.create(version=1, base_model="m", experiences=experiences)


def test_the_browser_rebuilds_the_roots_nodes_build(tmp_path: Path) -> None:
    paths, roots = [], []
    for golden in sorted(GOLDEN.glob("library-*.json")):
        paths.append(golden)
        roots.append((golden.with_suffix(".root")).read_text().strip())
    for n in [*range(0, 18), 31, 32, 33, 40]:
        lib = library(n)
        path = tmp_path / f"lib-{n}.json"
        path.write_bytes(encode_library(lib))
        paths.append(path)
        roots.append("0x" + library_root(lib).hex())
    read = read_in_js(paths)
    for path, expected, got in zip(paths, roots, read, strict=True):
        assert got == {"root": expected, "problems": []}, path.name


def test_the_browser_refuses_what_nodes_refuse(tmp_path: Path) -> None:
    good = encode_library(library(3))
    doc = json.loads(good)
    first = json.dumps(doc["experiences"][0], ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    cases = {
        "bom": b"\xef\xbb\xbf" + good,
        "spaces": json.dumps(doc, indent=1, sort_keys=True).encode(),
        "duplicate": good.replace(first.encode(), (first + "," + first).encode(), 1),
        "surrogate": good.replace(b"a plain rule", b"a plain \\ud800 rule"),
    }
    reversed_doc = {**doc, "experiences": doc["experiences"][::-1]}
    cases["unsorted"] = json.dumps(
        reversed_doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True
    ).encode()
    paths = []
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        paths.append(path)
        try:
            decode_library(data)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{name}: the node's decoder took it, so this case tests nothing")
    for path, got in zip(paths, read_in_js(paths), strict=True):
        assert got["problems"], f"{path.name}: the browser took what every node refuses"
