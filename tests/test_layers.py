"""The import direction the layout promises, read from every module's imports (lazy ones included):
contracts <- registry <- inference <- trainer <- node, with devnet (the local chain and IPFS, a tool the
node's CLI and daemon and the tests drive) on registry and contracts only, beside inference and trainer
(neither imports it, it imports neither); inside node the front doors (api, cli) and the daemon that wires
them on top of everything else, never imported by it.

And no import cycle among zoo modules, lazy (function-level) and TYPE_CHECKING imports counted: every module
is an edge to each zoo module it imports (`import zoo.a.b` and `from zoo.a.b import c` go to zoo.a.b, or to
zoo.a.b.c where that is a module); a name taken from a package whose `__init__` only re-exports it goes to
the module that defines it, and a name the `__init__` defines itself goes to the package. The enclosing
packages that every import also runs are no edge, so a package's `__init__` re-exporting its modules is no
cycle with them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The other packages each package may import (besides its own modules).
MAY_IMPORT = {
    "contracts": set(),
    "registry": {"contracts"},
    "inference": {"registry", "contracts"},
    "devnet": {"registry", "contracts"},
    "trainer": {"inference", "registry", "contracts"},
    "node": {"trainer", "devnet", "inference", "registry", "contracts"},
}
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


def test_packages_import_only_their_own_modules_and_the_layers_below() -> None:
    wrong = []
    for package, below in MAY_IMPORT.items():
        for path in modules(package):
            for name, line in imports_of(path):
                target = name.split(".")[1]
                if target in MAY_IMPORT and target != package and target not in below:
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


def module_name(path: Path) -> str:
    """`node/cli/main.py` -> `zoo.node.cli.main`; a package's `__init__.py` is the package itself."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("zoo", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def zoo_graph() -> dict[str, set[str]]:
    """The import graph of every module of the zoo packages."""
    paths = [path for package in MAY_IMPORT for path in modules(package)]
    sources = {module_name(path): path.read_text() for path in paths}
    return import_graph(sources, {module_name(path) for path in paths if path.name == "__init__.py"})


def import_graph(sources: dict[str, str], packages: set[str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports anywhere in it (lazy and TYPE_CHECKING imports
    included); `packages` are the modules that are a package's `__init__`. What is an edge: see the
    module's docstring."""
    trees = {name: ast.parse(source) for name, source in sources.items()}

    def owner(name: str) -> str | None:
        """The module `name` is or is in (`zoo.a.b.C` -> zoo.a.b), if it is one of ours."""
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    def imported(me: str, node: ast.ImportFrom) -> str:
        """The module a `from … import` names, relative ones resolved against `me`'s package."""
        if not node.level:
            return node.module or ""
        package = me if me in packages else me.rpartition(".")[0]
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join([*up, *([node.module] if node.module else [])])

    def defined(module: str, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Where `name`, as `module` has it, is defined: followed through `from x import name` re-exports."""
        found: set[str] = set()
        for node in trees[module].body:
            if not isinstance(node, ast.ImportFrom):
                continue
            base = imported(module, node)
            for a in node.names:
                origin = owner(base)
                if (a.asname or a.name) != name or origin is None or origin in seen | {module}:
                    continue
                if f"{base}.{a.name}" in sources:
                    found.add(f"{base}.{a.name}")
                else:
                    found |= defined(origin, a.name, seen | {module})
        return found or {module}

    graph: dict[str, set[str]] = {}
    for me, tree in trees.items():
        edges = graph.setdefault(me, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(m for a in node.names if (m := owner(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = imported(me, node)
                source = owner(base)
                if source is None:
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in sources:
                        edges.add(f"{base}.{a.name}")
                    elif source == base and source in packages and a.name != "*":
                        edges.update(defined(source, a.name))
                    else:
                        edges.add(source)
        edges.discard(me)
    return graph


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module: the sets of modules each of which
    imports, directly or through the others, every other (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set(stack[stack.index(node) :])
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def cycle_through(graph: dict[str, set[str]], tangle: set[str], start: str) -> list[str]:
    """A shortest cycle from `start` back to it inside `tangle`, its modules in import order."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & tangle):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is on no cycle in {sorted(tangle)}")


def shown_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each tangle as cycles in import order, one through each of its modules not yet on a shown one."""
    lines = []
    for tangle in tangles(graph):
        covered: set[str] = set()
        for module in sorted(tangle):
            if module not in covered:
                cycle = cycle_through(graph, tangle, module)
                covered.update(cycle)
                lines.append(" -> ".join(cycle))
        lines.append("")
    return lines


def test_no_import_cycle_among_zoo_modules() -> None:
    shown = shown_cycles(zoo_graph())
    assert not shown, "import cycles among zoo modules (lazy imports included):\n" + "\n".join(shown)


def test_the_graph_counts_lazy_and_relative_imports_and_sees_through_re_exports() -> None:
    sources = {
        "zoo.p": "from zoo.p.sub import thing as alias\nHERE = 1\n",
        "zoo.p.sub": "from . import other\ndef f():\n    import zoo.q.deep\n",
        "zoo.p.other": "from zoo.p import alias, HERE\nfrom zoo.p import sub\nfrom .sub import f\n",
        "zoo.q": "",
        "zoo.q.deep": "from zoo.q.deep import nothing\nfrom zoo.p.sub import f as g\n",
    }
    graph = import_graph(sources, {"zoo.p", "zoo.q"})
    assert graph == {
        "zoo.p": {"zoo.p.sub"},
        "zoo.p.sub": {"zoo.p.other", "zoo.q.deep"},
        "zoo.p.other": {"zoo.p", "zoo.p.sub"},
        "zoo.q": set(),
        "zoo.q.deep": {"zoo.p.sub"},
    }
    assert shown_cycles(graph) == [
        "zoo.p -> zoo.p.sub -> zoo.p.other -> zoo.p",
        "zoo.q.deep -> zoo.p.sub -> zoo.q.deep",
        "",
    ]


def test_cycles_are_found_and_shown_in_import_order() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e", "d"}, "g": {"g"}}
    assert shown_cycles(graph) == ["a -> b -> c -> a", "", "e -> f -> e", ""]
