"""Model identity (zoo.inference.provenance.weights): the hashes are what coreutils computes, and a file
is hashed once per path, size, mtime and inode."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.provenance.weights import WeightHashes
from zoo.registry.errors import ValidationError


def _weights_dir(root: Path) -> Path:
    d = root / "model"
    (d / "sub dir").mkdir(parents=True)
    (d / ".cache").mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "sub dir" / "tokenizer.json").write_text("{}")
    (d / ".cache" / "ignored").write_text("a download's bookkeeping")
    (d / ".gitattributes").write_text("hidden")
    blob = root / "blob"
    blob.write_bytes(b"linked weights")
    (d / "linked.bin").symlink_to(blob)  # as the Hugging Face cache lays files out
    return d


def test_a_file_hashes_as_sha256sum_says(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(os.urandom(100_000))
    expected = subprocess.run(
        ["sha256sum", str(f)], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert WeightHashes().of(f) == expected


def test_a_directory_hashes_as_the_documented_shell_line_says(tmp_path: Path) -> None:
    d = _weights_dir(tmp_path)
    line = (
        "(cd \"$1\" && find -L . -type f -not -path '*/.*' -printf '%P\\n' | LC_ALL=C sort"
        " | xargs -d '\\n' sha256sum) | sha256sum"
    )
    shell = subprocess.run(["bash", "-c", line, "_", str(d)], capture_output=True, text=True, check=True)
    digest = WeightHashes().of(d)
    assert digest == shell.stdout.split()[0]
    # Hidden files are not weights; every other file is, symlinked ones by their content.
    (d / ".cache" / "ignored").write_text("changed")
    assert WeightHashes().of(d) == digest
    (tmp_path / "blob").write_bytes(b"other linked weights")
    assert WeightHashes().of(d) != digest


def test_a_file_is_hashed_once_per_size_mtime_and_inode(tmp_path: Path) -> None:
    f, cache = tmp_path / "model.gguf", tmp_path / "cache" / "hashes.json"
    f.write_bytes(b"a" * 1000)
    first = WeightHashes(cache).of(f)
    assert first == hashlib.sha256(b"a" * 1000).hexdigest()
    # Same size, same mtime, same inode, other bytes: the remembered hash is what comes back (in memory and
    # from the file), which is how one sees the cache is used; any change of the three is hashed afresh.
    st = f.stat()
    with f.open("r+b") as out:
        out.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert WeightHashes(cache).of(f) == first
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert WeightHashes(cache).of(f) == hashlib.sha256(b"b" + b"a" * 999).hexdigest()


def test_a_damaged_cache_file_is_hashed_around(tmp_path: Path) -> None:
    f, cache = tmp_path / "model.gguf", tmp_path / "hashes.json"
    f.write_bytes(b"weights")
    for damage in (
        "not json",
        "[1, 2]",
        '{"x": [1, 2, 3, "short"]}',
        '{"' + str(f) + '": [7, 0, 0, "' + "0" * 64 + '"]}',
    ):
        cache.write_text(damage)
        assert WeightHashes(cache).of(f) == hashlib.sha256(b"weights").hexdigest()


def test_what_is_not_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="neither a weights file nor a directory"):
        WeightHashes().of(tmp_path / "missing.gguf")
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    with pytest.raises(ValidationError, match="holds no file to hash"):
        WeightHashes().of(tmp_path / "empty")


def test_the_bundled_models_hash_is_the_one_the_docs_give() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    assert f"`{WeightHashes().of(bundled_gguf())}`" in doc
