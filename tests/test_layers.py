"""The import direction the layout promises, read from every module's imports (lazy ones included):
contracts <- registry <- inference <- trainer <- node (devnet between registry and node), and inside node
the front doors (api, cli) and the daemon that wires them on top of everything else, never imported by it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A package may import its own modules and those of packages of a lower rank.
RANK = {"contracts": 0, "registry": 1, "inference": 2, "devnet": 2, "trainer": 3, "node": 4}
# Inside zoo.node: who may import the top (the front doors and the daemon's wiring).
NODE_TOP = {"api": {"api", "cli", "daemon"}, "cli": {"cli"}, "daemon": {"cli", "daemon"}}


def imports_in(source: str) -> Iterator[tuple[str, int]]:
    """Every absolute `zoo.…` module `source` imports, with its line (names imported from a package count
    as modules: `from zoo.node import daemon`)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        yield from ((n, node.lineno) for n in names if n.startswith("zoo."))


def imports_of(path: Path) -> Iterator[tuple[str, int]]:
    return imports_in(path.read_text())


def modules(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def test_packages_import_only_their_own_rank_and_below() -> None:
    wrong = []
    for package, rank in RANK.items():
        for path in modules(package):
            for name, line in imports_of(path):
                target = name.split(".")[1]
                if target in RANK and RANK[target] > rank and target != package:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_nothing_in_node_imports_its_front_doors_or_the_daemon() -> None:
    wrong = []
    for path in modules("node"):
        parts = path.relative_to(ROOT / "node").with_suffix("").parts
        mine = parts[0]
        for name, line in imports_of(path):
            bits = name.split(".")
            if bits[:2] != ["zoo", "node"] or len(bits) < 3:
                continue
            allowed = NODE_TOP.get(bits[2])
            if allowed is not None and mine not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "imports of zoo.node's top from below it:\n" + "\n".join(wrong)


def test_lazy_imports_and_imported_names_are_seen() -> None:
    source = "import zoo.trainer\ndef f():\n    from zoo.node import daemon\n"
    assert list(imports_in(source)) == [("zoo.trainer", 1), ("zoo.node", 3), ("zoo.node.daemon", 3)]
