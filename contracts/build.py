"""Compile the Solidity sources in contracts/src with solcjs and cache the artifacts by content hash.

The cache key covers every byte the compiler sees (our sources and the OpenZeppelin files they import,
transitively), the solc package version, the compiler settings and compile.js itself, so a cached artifact is
used only when a rebuild would produce the same thing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.contracts.jstools import node_binary, node_modules_dir

__all__ = [
    "Artifacts",
    "CompilationError",
    "ContractArtifact",
    "build",
    "default_cache_dir",
    "default_sources_dir",
]

# Bump when the artifact file layout changes, so older cache files are never read as the new layout.
_FORMAT = 1
# Artifact files kept in the cache (one per source state); older ones are deleted after each build.
_CACHE_KEEP = 8

_HERE = Path(__file__).resolve().parent
_COMPILE_JS = _HERE / "compile.js"

SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 200},
    "evmVersion": "cancun",
}

_OUTPUTS = ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "metadata"]

# `import "x";`, `import "x" as y;`, `import * as y from "x";`, `import {a, b as c} from "x";`
_IMPORT_RE = re.compile(r"""^\s*import\s+(?:[^;"']*?\bfrom\s+)?["']([^"']+)["']""", re.MULTILINE)


class CompilationError(RuntimeError):
    """solc rejected the sources (or could not run); `errors` holds its formatted messages.

    Not a ZooError: contracts is the layer below registry, where ZooError lives, and imports nothing of
    zoo's; it is a build tool's error that no client sees.
    """

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("Solidity compilation failed:\n" + "\n".join(errors))


@dataclass(frozen=True)
class ContractArtifact:
    """One compiled contract: what is needed to deploy it and talk to it."""

    name: str
    source: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str


@dataclass(frozen=True)
class Artifacts:
    """All contracts compiled from one source tree, plus how they were compiled."""

    contracts: Mapping[str, ContractArtifact]
    solc_version: str
    settings: Mapping[str, Any]
    key: str
    path: Path
    from_cache: bool = False
    warnings: tuple[str, ...] = field(default=())

    def get(self, name: str) -> ContractArtifact:
        """The artifact of contract `name` (e.g. "ExperienceRegistry")."""
        try:
            return self.contracts[name]
        except KeyError:
            known = ", ".join(sorted(self.contracts)) or "none"
            raise KeyError(f"no compiled contract named {name!r} (compiled: {known})") from None

    def names(self) -> list[str]:
        """Names of all compiled contracts, sorted."""
        return sorted(self.contracts)


def default_sources_dir() -> Path:
    """contracts/src of this package."""
    return _HERE / "src"


def default_cache_dir() -> Path:
    """$ZOO_NODE_CACHE_DIR/contracts, else $XDG_CACHE_HOME (or ~/.cache)/zoo-node/contracts.

    The same rule as the node's `cache_dir` default; a configured cache_dir is passed to build().
    """
    env = os.environ.get("ZOO_NODE_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(env).expanduser() if env else (Path(xdg) if xdg else Path.home() / ".cache") / "zoo-node"
    return base / "contracts"


def build(
    force: bool = False,
    *,
    sources_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> Artifacts:
    """Compile every .sol file under `sources_dir` (recursively), reusing cached artifacts if nothing changed.

    `force` recompiles and rewrites the cache even on a hit. Raises CompilationError listing solc's messages
    when the sources do not compile.
    """
    sources_dir = (sources_dir or default_sources_dir()).resolve()
    cache_dir = cache_dir or default_cache_dir()
    modules = node_modules_dir().resolve()

    sources = _read_sources(sources_dir)
    dependencies = _import_closure(sources, modules)
    solc_package = _solc_package_version(modules)
    key = _cache_key(sources, dependencies, solc_package)
    path = cache_dir / f"artifacts-{key[:32]}.json"

    if not force:
        cached = _load(path, key)
        if cached is not None:
            # Marks the file as recently used, so pruning keeps it.
            with contextlib.suppress(OSError):
                os.utime(path)
            return cached

    standard_input = {
        "language": "Solidity",
        # Dependencies go in with the exact bytes that were hashed; the import callback only serves
        # anything the import scan missed (which then keeps the result out of the cache, see below).
        "sources": {unit: {"content": text} for unit, text in {**dependencies, **sources}.items()},
        "settings": {
            **SETTINGS,
            "outputSelection": {unit: {"*": _OUTPUTS} for unit in sources},
        },
    }
    output = _run_solc(standard_input, modules)
    artifacts = _parse_output(output, sources, key, path)

    unhashed = set(output.get("sources", {})) - set(sources) - set(dependencies)
    if not unhashed:
        _write_atomic(path, json.dumps(_to_json(artifacts), sort_keys=True).encode())
        _prune(cache_dir, keep=path)
    return artifacts


def _read_sources(sources_dir: Path) -> dict[str, str]:
    if not sources_dir.is_dir():
        raise CompilationError([f"Solidity source folder {sources_dir} does not exist"])
    sources = {
        path.relative_to(sources_dir).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(sources_dir.rglob("*.sol"))
    }
    if not sources:
        raise CompilationError([f"no .sol files under {sources_dir}"])
    return sources


def _resolve_import(importer: str, target: str) -> str:
    """solc's source-unit name for `target` imported from unit `importer`."""
    if target.startswith(("./", "../")):
        return posixpath.normpath(posixpath.join(posixpath.dirname(importer), target))
    return target


def _import_closure(sources: Mapping[str, str], modules: Path) -> dict[str, str]:
    """Texts of the node_modules files the sources import, directly or through other imports."""
    found: dict[str, str] = {}
    pending = list(sources.items())
    while pending:
        unit, text = pending.pop()
        for target in _IMPORT_RE.findall(text):
            dep = _resolve_import(unit, target)
            if dep in sources or dep in found:
                continue
            file = (modules / dep).resolve()
            # Unresolvable imports are left to solc, which reports them as compile errors.
            if not file.is_relative_to(modules) or not file.is_file():
                continue
            found[dep] = file.read_text(encoding="utf-8")
            pending.append((dep, found[dep]))
    return found


def _solc_package_version(modules: Path) -> str:
    package = modules / "solc" / "package.json"
    try:
        return str(json.loads(package.read_text())["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise CompilationError([f"cannot read the solc version from {package}: {exc}"]) from exc


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _cache_key(sources: Mapping[str, str], dependencies: Mapping[str, str], solc_package: str) -> str:
    material = {
        "format": _FORMAT,
        "solc": solc_package,
        "settings": SETTINGS,
        "outputs": _OUTPUTS,
        "compile.js": _sha256(_COMPILE_JS.read_bytes()),
        "sources": {unit: _sha256(text) for unit, text in sources.items()},
        "dependencies": {unit: _sha256(text) for unit, text in dependencies.items()},
    }
    return _sha256(json.dumps(material, sort_keys=True))


def _run_solc(standard_input: dict[str, Any], modules: Path) -> dict[str, Any]:
    env = {**os.environ, "ZOO_NODE_MODULES": str(modules)}
    try:
        proc = subprocess.run(
            [node_binary(), str(_COMPILE_JS)],
            input=json.dumps(standard_input).encode(),
            capture_output=True,
            env=env,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CompilationError(["solcjs did not finish within 600 s"]) from exc
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        raise CompilationError([f"solcjs exited with status {proc.returncode}: {stderr}"])
    try:
        output: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise CompilationError([f"solcjs printed something that is not JSON: {proc.stdout[:500]!r}"]) from exc
    errors = [
        e.get("formattedMessage") or e.get("message", "?")
        for e in output.get("errors", [])
        if e.get("severity") == "error"
    ]
    if errors:
        raise CompilationError([msg.strip() for msg in errors])
    return output


def _parse_output(output: Mapping[str, Any], sources: Mapping[str, str], key: str, path: Path) -> Artifacts:
    contracts: dict[str, ContractArtifact] = {}
    solc_version = ""
    for unit in sources:
        for name, data in output.get("contracts", {}).get(unit, {}).items():
            if name in contracts:
                raise CompilationError(
                    [f"contract name {name} is defined in both {contracts[name].source} and {unit}"]
                )
            bytecode = data["evm"]["bytecode"]["object"]
            if "__$" in bytecode:
                raise CompilationError([f"{unit}:{name} needs library linking, which build() does not do"])
            if data.get("metadata") and not solc_version:
                solc_version = json.loads(data["metadata"])["compiler"]["version"]
            contracts[name] = ContractArtifact(
                name=name,
                source=unit,
                abi=data["abi"],
                bytecode="0x" + bytecode,
                deployed_bytecode="0x" + data["evm"]["deployedBytecode"]["object"],
            )
    warnings = tuple(
        (e.get("formattedMessage") or e.get("message", "?")).strip()
        for e in output.get("errors", [])
        if e.get("severity") != "error"
    )
    return Artifacts(
        contracts=contracts,
        solc_version=solc_version,
        settings=dict(SETTINGS),
        key=key,
        path=path,
        warnings=warnings,
    )


def _to_json(artifacts: Artifacts) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "key": artifacts.key,
        "solc_version": artifacts.solc_version,
        "settings": artifacts.settings,
        "warnings": list(artifacts.warnings),
        "contracts": {
            name: {
                "source": c.source,
                "abi": c.abi,
                "bytecode": c.bytecode,
                "deployed_bytecode": c.deployed_bytecode,
            }
            for name, c in artifacts.contracts.items()
        },
    }


def _load(path: Path, key: str) -> Artifacts | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    # A damaged or foreign file is a cache miss, never an error: the rebuild overwrites it.
    if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("key") != key:
        return None
    try:
        contracts = {
            name: ContractArtifact(
                name=name,
                source=c["source"],
                abi=c["abi"],
                bytecode=c["bytecode"],
                deployed_bytecode=c["deployed_bytecode"],
            )
            for name, c in data["contracts"].items()
        }
        return Artifacts(
            contracts=contracts,
            solc_version=data["solc_version"],
            settings=data["settings"],
            key=key,
            path=path,
            from_cache=True,
            warnings=tuple(data.get("warnings", ())),
        )
    except (KeyError, TypeError, AttributeError):
        return None


def _prune(cache_dir: Path, keep: Path) -> None:
    """Delete all but the most recently used artifact files (several checkouts may share the cache)."""
    files = []
    for file in cache_dir.glob("artifacts-*.json"):
        with contextlib.suppress(OSError):
            files.append((file.stat().st_mtime, file))
    files.sort(reverse=True)
    for _, file in files[_CACHE_KEEP:]:
        if file != keep:
            with contextlib.suppress(OSError):
                file.unlink()


def _write_atomic(path: Path, data: bytes) -> None:
    # Not zoo.registry.fsutil.write_atomic: contracts is the bottom layer and may import no other zoo package.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
