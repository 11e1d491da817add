"""Persistent cache of experience embeddings, so a library update embeds only the experiences that are new.

One SQLite file (by default DATA_DIR/embeddings.sqlite) holds one row per (embedder name, experience id)
with the vector as a little-endian float32 blob. The key is sound because both halves pin the content:
experience ids are derived from (domain, text) (registry/experience.py), and an embedder's name carries
a hash of its model files (embedder.py). What text is embedded for an experience is decided by the
caller (retrieval.py), which folds a version of that recipe into the name it passes here, so changing
the recipe never reuses vectors of the old one.

The file is only a cache: everything in it can be recomputed, so a file SQLite cannot open is
deleted and started afresh rather than stopping the node, and writes use synchronous=NORMAL (WAL mode):
a power cut may lose the last few writes, never consistency.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

import numpy as np

DEFAULT_FILENAME = "embeddings.sqlite"
_SCHEMA_VERSION = 1
# SQLite builds older than 3.32 allow at most 999 bound parameters per statement.
_CHUNK = 900
_FLOAT32_LE = np.dtype("<f4")


class EmbeddingCache:
    """Embedding vectors keyed by (embedder name, experience id). Safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError:
            # Not a database, or damaged beyond SQLite's own recovery: drop it, it is only a cache.
            self._remove_files()
            self._conn = self._open()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> EmbeddingCache:
        return cls(Path(data_dir) / DEFAULT_FILENAME)

    def _open(self) -> sqlite3.Connection:
        # check_same_thread=False: the connection is shared by the request and worker threads, and
        # every use of it holds self._lock, which is what that check would otherwise stand in for.
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                conn.execute("DROP TABLE IF EXISTS embeddings")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings ("
                " model TEXT NOT NULL, id TEXT NOT NULL, vector BLOB NOT NULL,"
                " PRIMARY KEY (model, id)) WITHOUT ROWID"
            )
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            conn.execute("SELECT count(*) FROM embeddings WHERE model = ''").fetchone()
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    def get_many(self, model: str, ids: Iterable[str], dim: int | None = None) -> dict[str, np.ndarray]:
        """The cached vectors of those ids that have one, as read-only float32 arrays.

        With `dim`, a stored vector of another length counts as missing (the caller re-embeds it).
        """
        wanted = list(dict.fromkeys(ids))
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT id, vector FROM embeddings WHERE model = ? AND id IN ({marks})", (model, *chunk)
                )
                for exp_id, blob in rows:
                    if len(blob) % 4 or (dim is not None and len(blob) != 4 * dim):
                        continue
                    found[exp_id] = np.frombuffer(blob, dtype=_FLOAT32_LE)
        return found

    def put_many(self, model: str, vectors: Mapping[str, np.ndarray]) -> None:
        """Store (or replace) vectors, all in one transaction."""
        rows = [
            (model, exp_id, np.ascontiguousarray(vec, dtype=_FLOAT32_LE).reshape(-1).tobytes())
            for exp_id, vec in vectors.items()
        ]
        if not rows:
            return
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO embeddings (model, id, vector) VALUES (?, ?, ?)", rows
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def count(self, model: str | None = None) -> int:
        """How many vectors are stored (for one embedder name, or for all)."""
        with self._lock:
            if model is None:
                return int(self._conn.execute("SELECT count(*) FROM embeddings").fetchone()[0])
            query = "SELECT count(*) FROM embeddings WHERE model = ?"
            return int(self._conn.execute(query, (model,)).fetchone()[0])

    def prune(self, model: str, keep: Iterable[str]) -> int:
        """Delete this embedder's vectors whose ids are not in `keep`; returns how many were deleted.

        Experiences dropped from every library the node still holds only take space; the daemon may
        call this with the ids of the versions it keeps.
        """
        keep_set = set(keep)
        with self._lock:
            stored = [
                row[0] for row in self._conn.execute("SELECT id FROM embeddings WHERE model = ?", (model,))
            ]
            gone = [exp_id for exp_id in stored if exp_id not in keep_set]
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    "DELETE FROM embeddings WHERE model = ? AND id = ?", [(model, g) for g in gone]
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        return len(gone)

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
