"""The import direction the layout promises, read from every module's imports (lazy ones included):
contracts <- registry <- inference <- trainer <- node, with devnet (the local chain and IPFS, a tool the
node's CLI and daemon and the tests drive) on registry and contracts only, beside inference and trainer
(neither imports it, it imports neither); inside node the front doors (api, cli) and the daemon that wires
them on top of everything else, never imported by it; inside trainer the LoRA jobs (gspo, sft) on the LoRA
core they share (lora), never on each other.

And no import cycle among zoo modules, lazy (function-level) and TYPE_CHECKING imports counted: every module
is an edge to each zoo module it imports (`import zoo.a.b` and `from zoo.a.b import c` go to zoo.a.b, or to
zoo.a.b.c where that is a module); a name taken from a package whose `__init__` only re-exports it goes to
the module that defines it, and a name the `__init__` defines itself goes to the package. The enclosing
packages that every import also runs are no edge, so a package's `__init__` re-exporting its modules is no
cycle with them.

And every absolute zoo import, in the packages and in tests/, benchmarks/ and scripts/, lazy ones included,
names a module that is there and only names that module binds at its top level or has as a submodule: read
from the source, so an import in a function of a benchmark that CI never runs is checked too."""

from __future__ import annotations

import ast
import re
import tomllib
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
# Inside zoo.node: who may import the top (the front doors: the APIs, the CLI, the web app; and the daemon's
# wiring). The HTTP API mounts the web app, and the web app answers errors by the API's status table.
NODE_TOP = {
    "api": {"api", "cli", "daemon", "webapp"},
    "cli": {"cli"},
    "daemon": {"cli", "daemon"},
    "webapp": {"webapp", "api", "daemon"},
}
# Inside zoo.trainer: the jobs' sub-packages each of them may import (besides its own modules): the LoRA
# jobs (gspo; sft, rft and distill in sft) the LoRA core they share (lora), never each other; the core
# neither of them, and training-free GRPO (tfgrpo) none of them.
TRAINER_JOBS = {"lora": set(), "gspo": {"lora"}, "sft": {"lora"}, "tfgrpo": set()}


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


def test_the_trainer_jobs_import_the_lora_core_and_never_each_other() -> None:
    wrong = []
    for job, allowed in TRAINER_JOBS.items():
        for path in modules(f"trainer/{job}"):
            for name, line in imports_of(path):
                bits = name.split(".")
                other = bits[2] if bits[:2] == ["zoo", "trainer"] and len(bits) > 2 else None
                if other in TRAINER_JOBS and other != job and other not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "imports between zoo.trainer's job packages against their order:\n" + "\n".join(wrong)


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


# Every zoo import names a module and names that are there (see the module's docstring).
CHECKED = ["tests", "benchmarks", "scripts"]  # beside the packages' own folders
# The gRPC stubs (`X_pb2`, `X_pb2_grpc`) are generated from `X.proto` by the build (setup.py,
# scripts/gen_proto.py) into files git ignores, so a fresh checkout has none: such a module counts as there
# when its `X.proto` is, whether or not it has been generated yet, and the names taken from it are not
# checked (the stubs bind their messages at import time from the descriptors; no AST shows them).
GENERATED = re.compile(r"(?P<proto>\w+?)_pb2(_grpc)?")


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Each zoo package -> its folder, as pyproject's package-dir maps them for the build and the editable
    install (`zoo.node` -> node/, `zoo.v1` -> proto/zoo/v1/)."""
    with (root / "pyproject.toml").open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in mapping.items()}


def locate(module: str, dirs: dict[str, Path]) -> Path | None:
    """Where `module` is: its .py file, a package's `__init__.py`, the folder of a package that has none
    (`zoo` itself, a package-dir folder such as proto/zoo/v1), the `.proto` a stub is generated from; None
    where there is no such module."""
    if module == "zoo":
        return ROOT
    package = max((p for p in dirs if module == p or module.startswith(f"{p}.")), key=len, default=None)
    if package is None:
        return None
    parts = module[len(package) :].split(".")[1:]
    place = dirs[package].joinpath(*parts)
    if (place / "__init__.py").is_file():
        return place / "__init__.py"
    if not parts and place.is_dir():
        return place
    if parts and (stub := GENERATED.fullmatch(parts[-1])):
        proto = place.with_name(f"{stub['proto']}.proto")
        if proto.is_file():
            return proto
    return place.with_suffix(".py") if place.with_suffix(".py").is_file() else None


def top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when a module is imported: its own, and those inside `if`, `try`, `with`,
    `for` and `while` blocks at its top level (not the bodies of its functions and classes)."""
    for node in body:
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from top_level(getattr(node, field, []))


def bound_at_top(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level, in its `if`/`try`/`with`/`for` blocks too: defs, classes,
    assignments (annotated ones with a value), imports, loop and `with … as` targets, the names of
    `__all__`; None where any name may be there (a star import, a module `__getattr__`)."""
    names: set[str] = set()
    targets: list[ast.expr] = []
    for node in top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AugAssign) or (isinstance(node, ast.AnnAssign) and node.value):
            assigned = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets += assigned
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in assigned):
                elements = getattr(node.value, "elts", [])
                names.update(e.value for e in elements if isinstance(e, ast.Constant))
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.For | ast.AsyncFor):
            targets.append(node.target)
        elif isinstance(node, ast.With | ast.AsyncWith):
            targets += [item.optional_vars for item in node.items if item.optional_vars]
    for target in targets:
        names.update(
            n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        )
    return None if names & {"*", "__getattr__"} else names


def zoo_imports(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, the names taken from it: [] for `import zoo.a.b`) of every absolute zoo import
    anywhere in `tree`, in the order of the source: top level, in functions, under `if TYPE_CHECKING`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "zoo"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "zoo":
            found.append((node.lineno, node.module, [a.name for a in node.names]))
    return iter(sorted(found))


def broken_imports(paths: list[Path], dirs: dict[str, Path], root: Path = ROOT) -> list[str]:
    """`file:line: from zoo.x import name: no such module|name` (`import zoo.x: no such module`) for each zoo
    import in `paths` whose module is not there, and each name one takes that its module neither binds at
    its top level nor has as a submodule."""
    bound: dict[Path, set[str] | None] = {}
    wrong = []
    for path in paths:
        for line, module, names in zoo_imports(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(root)}:{line}"
            place = locate(module, dirs)
            if place is None:
                statement = f"from {module} import {', '.join(names)}" if names else f"import {module}"
                wrong.append(f"{where}: {statement}: no such module")
                continue
            if place.suffix == ".proto":
                continue
            if place.suffix == ".py" and place not in bound:
                bound[place] = bound_at_top(ast.parse(place.read_text(), str(place)))
            there = bound.get(place, set())
            for name in names:
                if name == "*" or there is None or name in there:
                    continue
                if (place.is_dir() or place.name == "__init__.py") and locate(f"{module}.{name}", dirs):
                    continue
                wrong.append(f"{where}: from {module} import {name}: no such name")
    return wrong


def checked_files(root: Path = ROOT) -> list[Path]:
    """Every .py file of the packages' folders, tests/, benchmarks/, scripts/ and the repository's top."""
    folders = {*package_dirs(root).values(), *(root / f for f in CHECKED)}
    files = {path for folder in folders for path in folder.rglob("*.py")}
    return sorted(files | set(root.glob("*.py")))


def test_every_zoo_import_names_a_module_and_names_that_are_there() -> None:
    wrong = broken_imports(checked_files(), package_dirs())
    assert not wrong, "imports of zoo modules or names that are not there:\n" + "\n".join(wrong)


def test_broken_imports_are_found_lazy_ones_and_generated_stubs_included(tmp_path: Path) -> None:
    files = {
        "p/__init__.py": "from zoo.p.impl import Thing as Alias\n__all__ = ['late']\n",
        "p/impl.py": (
            "import os.path\nfrom typing import TYPE_CHECKING\nclass Thing: ...\nX: int = 1\nY: int\n"
            "A, (B, *C) = 1, (2, 3)\nfor I in (): pass\nwith open(__file__) as (F, G): pass\n"
            "try:\n    import json as fast\nexcept ImportError:\n    fast = None\n"
            "if TYPE_CHECKING:\n    from zoo.p import Alias\n"
        ),
        "p/sub/__init__.py": "",
        "proto/zoo/v1/api.proto": "",
        "user.py": (
            "import zoo.p.sub\nfrom zoo.p import Alias, impl, sub, late, gone\n"
            "from zoo.p.impl import Thing, X, Y, A, B, C, I, F, G, fast, os, TYPE_CHECKING, Alias\n"
            "from zoo.v1 import api_pb2, api_pb2_grpc, other_pb2\nfrom zoo.v1.api_pb2 import Request\n"
            "from zoo import p, q\n"
            "def lazy():\n    from zoo.p.impl import messages_for\n    import zoo.p.nowhere\n"
            "    from zoo.q import anything\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    dirs = {"zoo.p": tmp_path / "p", "zoo.v1": tmp_path / "proto/zoo/v1"}
    assert broken_imports([tmp_path / "user.py"], dirs, tmp_path) == [
        "user.py:2: from zoo.p import gone: no such name",
        "user.py:3: from zoo.p.impl import Y: no such name",
        "user.py:4: from zoo.v1 import other_pb2: no such name",
        "user.py:6: from zoo import q: no such name",
        "user.py:8: from zoo.p.impl import messages_for: no such name",
        "user.py:9: import zoo.p.nowhere: no such module",
        "user.py:10: from zoo.q import anything: no such module",
    ]
