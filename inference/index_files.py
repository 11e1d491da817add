"""Retrieval indexes kept on disk, so a restarted node loads its active library's index instead of
rebuilding it (at 100k experiences: reading ~150 MB of vectors and ~40 MB of faiss codes, against
minutes of embedding or seconds of k-means).

One directory per library root under the node's index directory (DATA_DIR/retrieval/<root>/):

    meta.json    what the files hold: format, the embedder's cache key, the number of rows, sha256 of the
                 row ids in (domain, id) order, sha256 of each file, and the approximate index's seed
    matrix.npy   the unit float32 vectors, one row per experience in (domain, id) order
    ann.faiss    the approximate index (faiss serialisation), once one was trained

Like the embedding cache, this is a cache: a directory whose meta does not describe this library and
embedder, or whose files do not hash to what meta.json says, is deleted and the index rebuilt. Files
are written under temporary names and renamed into place, meta.json last, so a crash leaves either the
old state or the new. The matrix is memory-mapped on load: its pages are read as searches touch them
and are shared with the page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from zoo.inference.embedder import Embedder
from zoo.inference.ivf import IvfIndex
from zoo.inference.retrieval import RetrievalIndex, cache_model_key, library_rows
from zoo.registry.fsutil import write_atomic
from zoo.registry.library_store import StoredVersion

log = logging.getLogger(__name__)

FORMAT = 1
_META, _MATRIX, _ANN = "meta.json", "matrix.npy", "ann.faiss"


def _ids_digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dir(index_dir: Path, root: str) -> Path:
    return index_dir / root.lower()


def load_index(
    index_dir: Path,
    stored: StoredVersion,
    embedder: Embedder,
    *,
    ann_threshold: int,
    nprobe: int,
    seed: int,
) -> RetrievalIndex | None:
    """The saved index of this version for this embedder, or None (after deleting anything unusable)."""
    started = time.perf_counter()
    where = _dir(index_dir, stored.root)
    if not (where / _META).exists():
        return None
    try:
        meta = json.loads((where / _META).read_text())
        experiences = library_rows(stored.library)
        ids = [e.id for e in experiences]
        expected = {"format": FORMAT, "embedder": cache_model_key(embedder), "rows": len(ids)}
        if {k: meta.get(k) for k in expected} != expected or meta.get("ids_sha256") != _ids_digest(ids):
            raise ValueError("written for another library or embedder")
        if _file_digest(where / _MATRIX) != meta.get("matrix_sha256"):
            raise ValueError("matrix.npy does not hash to what meta.json says")
        matrix = np.load(where / _MATRIX, mmap_mode="r", allow_pickle=False)
        if matrix.dtype != np.float32 or matrix.shape != (len(ids), embedder.dim):
            raise ValueError(f"matrix.npy holds {matrix.dtype} {matrix.shape}")
        ivf = None
        ann = meta.get("ann")
        if ann is not None and ann.get("seed") == seed and len(ids) >= ann_threshold:
            data = np.fromfile(where / _ANN, dtype=np.uint8)
            if hashlib.sha256(data).hexdigest() != ann.get("sha256"):
                raise ValueError("ann.faiss does not hash to what meta.json says")
            ivf = IvfIndex.deserialize(data)
            if ivf.size != len(ids):
                raise ValueError(f"ann.faiss indexes {ivf.size} rows")
    except (OSError, ValueError, TypeError, AttributeError, RuntimeError) as e:
        _log_and_remove(where, f"unusable saved index: {e}")
        return None
    return RetrievalIndex.from_rows(
        experiences,
        matrix,
        embedder,
        ivf,
        version=stored.version,
        ann_threshold=ann_threshold,
        nprobe=nprobe,
        seed=seed,
        seconds=time.perf_counter() - started,
    )


def save_index(index_dir: Path, root: str, index: RetrievalIndex) -> None:
    """Write what the directory lacks of this index: the matrix once, the approximate index once."""
    if not len(index):
        return
    where = _dir(index_dir, root)
    try:
        meta: dict[str, Any] = json.loads((where / _META).read_text()) if (where / _META).exists() else {}
    except (OSError, ValueError):
        meta = {}
    key = cache_model_key(index.embedder)
    if meta.get("embedder") != key or meta.get("rows") != len(index):
        meta = {
            "format": FORMAT,
            "embedder": key,
            "rows": len(index),
            "ids_sha256": _ids_digest(list(index._ids)),
        }
    try:
        where.mkdir(parents=True, exist_ok=True)
        if "matrix_sha256" not in meta:
            tmp = where / f".{_MATRIX}.tmp"
            with tmp.open("wb") as f:
                np.save(f, np.ascontiguousarray(index._matrix), allow_pickle=False)
            tmp.replace(where / _MATRIX)
            meta["matrix_sha256"] = _file_digest(where / _MATRIX)
        if index._ivf is not None and (meta.get("ann") or {}).get("seed") != index.seed:
            data = index._ivf.serialize()
            write_atomic(where / _ANN, data)
            meta["ann"] = {"seed": index.seed, "sha256": hashlib.sha256(data).hexdigest()}
        write_atomic(where / _META, json.dumps(meta, sort_keys=True).encode())
    except OSError as e:
        _log_and_remove(where, f"could not save the index: {e}")


def prune_indexes(index_dir: Path, keep: set[str]) -> None:
    """Delete the saved indexes of roots not in `keep`."""
    keep = {r.lower() for r in keep}
    with contextlib.suppress(OSError):
        for child in index_dir.iterdir():
            if child.is_dir() and child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)


def _log_and_remove(where: Path, reason: str) -> None:
    log.warning("retrieval index files in %s dropped (%s); the index is rebuilt", where, reason)
    shutil.rmtree(where, ignore_errors=True)
