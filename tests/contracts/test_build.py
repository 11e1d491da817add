"""The solcjs build: artifacts cached by content hash, rebuilt on any source change, errors in words."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from zoo.contracts import build as build_mod
from zoo.contracts.build import CompilationError, build, default_sources_dir

# A small real source set (with an OpenZeppelin import) keeps each compile to a second or two.
SMALL_SET = ("IVoterRegistry.sol", "AllowlistVoterRegistry.sol")


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in SMALL_SET:
        shutil.copy(default_sources_dir() / name, src / name)
    return src


def test_second_build_is_a_cache_hit_and_a_change_rebuilds(sources: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build(sources_dir=sources, cache_dir=cache)
    assert not first.from_cache
    assert first.path.is_file() and first.path.parent == cache
    assert first.solc_version.startswith("0.8.37")
    assert first.settings["evmVersion"] == "cancun" and first.settings["optimizer"]["runs"] == 200
    allowlist = first.get("AllowlistVoterRegistry")
    assert allowlist.bytecode.startswith("0x60") and len(allowlist.deployed_bytecode) > 100
    assert any(item.get("name") == "isRegistered" for item in allowlist.abi)

    started = time.monotonic()
    second = build(sources_dir=sources, cache_dir=cache)
    hit_seconds = time.monotonic() - started
    assert second.from_cache and second.key == first.key and second.path == first.path
    assert second.get("AllowlistVoterRegistry") == allowlist
    assert hit_seconds < 0.5, hit_seconds

    forced = build(True, sources_dir=sources, cache_dir=cache)
    assert not forced.from_cache and forced.key == first.key

    # Any byte of a source changes the key, even in a comment; the new artifact lands next to the old one.
    target = sources / "AllowlistVoterRegistry.sol"
    target.write_text(target.read_text() + "\n// changed\n")
    third = build(sources_dir=sources, cache_dir=cache)
    assert not third.from_cache and third.key != first.key and third.path != first.path
    assert build(sources_dir=sources, cache_dir=cache).from_cache


def test_key_covers_imported_openzeppelin_files(sources: Path) -> None:
    texts = build_mod._read_sources(sources)
    modules = build_mod.node_modules_dir().resolve()
    deps = build_mod._import_closure(texts, modules)
    assert "@openzeppelin/contracts/access/Ownable2Step.sol" in deps
    assert "@openzeppelin/contracts/access/Ownable.sol" in deps
    assert "@openzeppelin/contracts/utils/Context.sol" in deps  # reached only through Ownable.sol
    base = build_mod._cache_key(texts, deps, "0.8.37")
    changed = dict(deps)
    changed["@openzeppelin/contracts/utils/Context.sol"] += "\n"
    assert build_mod._cache_key(texts, changed, "0.8.37") != base
    assert build_mod._cache_key(texts, deps, "0.8.38") != base


def test_damaged_cache_file_is_rebuilt(sources: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = build(sources_dir=sources, cache_dir=cache)
    first.path.write_text("{not json")
    again = build(sources_dir=sources, cache_dir=cache)
    assert not again.from_cache and again.get("AllowlistVoterRegistry") == first.get("AllowlistVoterRegistry")


def test_compile_error_lists_solc_messages(sources: Path, tmp_path: Path) -> None:
    (sources / "Broken.sol").write_text(
        "// SPDX-License-Identifier: MIT\npragma solidity ^0.8.24;\ncontract Broken { uint256 x = nope; }\n"
    )
    with pytest.raises(CompilationError) as info:
        build(sources_dir=sources, cache_dir=tmp_path / "cache")
    assert any("Undeclared identifier" in e and "Broken.sol" in e for e in info.value.errors)
    assert "Undeclared identifier" in str(info.value)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_missing_import_is_a_compile_error(sources: Path, tmp_path: Path) -> None:
    (sources / "Lost.sol").write_text(
        "// SPDX-License-Identifier: MIT\npragma solidity ^0.8.24;\n"
        'import "@openzeppelin/contracts/Nope.sol";\n'
    )
    with pytest.raises(CompilationError, match=r"Nope\.sol"):
        build(sources_dir=sources, cache_dir=tmp_path / "cache")


def test_unknown_contract_name(sources: Path, tmp_path: Path) -> None:
    artifacts = build(sources_dir=sources, cache_dir=tmp_path / "cache")
    with pytest.raises(KeyError, match="AllowlistVoterRegistry"):
        artifacts.get("NoSuchContract")


def test_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZOO_NODE_CACHE_DIR", str(tmp_path))
    assert build_mod.default_cache_dir() == tmp_path / "contracts"
    monkeypatch.delenv("ZOO_NODE_CACHE_DIR")
    assert build_mod.default_cache_dir() == Path.home() / ".cache" / "zoo-node" / "contracts"


def test_old_artifacts_are_pruned(sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(12):
        stale = cache / f"artifacts-{i:032x}.json"
        stale.write_text("{}")
        os.utime(stale, (1_000_000 + i, 1_000_000 + i))
    monkeypatch.setattr(build_mod, "_CACHE_KEEP", 3)
    fresh = build(sources_dir=sources, cache_dir=cache)
    left = sorted(p.name for p in cache.glob("artifacts-*.json"))
    assert fresh.path.name in left and len(left) == 3
    assert f"artifacts-{11:032x}.json" in left and f"artifacts-{0:032x}.json" not in left
