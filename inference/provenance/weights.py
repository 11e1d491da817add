"""The identity of a model's weights: the SHA-256 of a GGUF file, or, for a weights directory (a Hugging
Face model, a LoRA adapter), the SHA-256 of a manifest of its files' hashes. Anyone can recompute either
without this code: `sha256sum model.gguf`, and for a directory

    (cd DIR && find -L . -type f -not -path '*/.*' -printf '%P\\n' | LC_ALL=C sort \\
       | xargs -d '\\n' sha256sum) | sha256sum

that is, one `sha256sum` line ("<hex>  <relative path>") per file, hidden files and directories left out
(a download's .cache, a .git), sorted by path bytes. Symlinked files count by their content (the Hugging
Face cache links each file to its blob).

A file is hashed once: its hash is remembered by path, size, mtime and inode, in memory and in a JSON file
(the node's cache directory), so a restart or a second node on the same weights reads it back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from zoo.registry.errors import ValidationError

log = logging.getLogger(__name__)

HEX64_CHARS = 64
WEIGHT_HASHES_FILE = "weight-sha256.json"  # in the node's cache directory


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def weight_files(directory: Path) -> list[str]:
    """The files a directory's hash covers: relative POSIX paths, hidden ones left out, in byte order."""
    found = []
    for parent, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(parent).relative_to(directory)
        found += [(rel / f).as_posix() for f in files if not f.startswith(".")]
    return sorted(found, key=lambda p: p.encode())


class WeightHashes:
    """SHA-256 of weights (files and directories), each file hashed once per (path, size, mtime, inode).

    Thread-safe; the cache file is rewritten whole (a temporary file, then a rename), so a crash or a second
    process writing at the same time loses at most some entries, which are then hashed again."""

    def __init__(self, cache_file: Path | None = None) -> None:
        self.cache_file = cache_file
        self._lock = threading.Lock()
        self._known: dict[str, list] = self._load()

    def of(self, path: Path) -> str:
        """The hash of a GGUF (any single file) or of a weights directory; ValidationError when `path` is
        neither, or a directory with no file to hash."""
        if path.is_file():
            digest = self._file(path)
        elif path.is_dir():
            files = weight_files(path)
            if not files:
                raise ValidationError("model", f"{path} holds no file to hash")
            manifest = "".join(f"{self._file(path / f)}  {f}\n" for f in files)
            digest = hashlib.sha256(manifest.encode()).hexdigest()
        else:
            raise ValidationError("model", f"{path} is neither a weights file nor a directory")
        self._save()
        return digest

    def _file(self, path: Path) -> str:
        st = path.stat()  # follows a symlink: the blob's size, mtime and inode
        key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ino]
        with self._lock:
            known = self._known.get(key)
        if known is not None and known[:3] == stamp:
            return str(known[3])
        digest = file_sha256(path)
        with self._lock:
            self._known[key] = [*stamp, digest]
            self._dirty = True
        return digest

    def _load(self) -> dict[str, list]:
        self._dirty = False
        if self.cache_file is None:
            return {}
        try:
            raw = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: everything is hashed again
        if not isinstance(raw, dict):
            return {}
        return {
            k: v
            for k, v in raw.items()
            if isinstance(v, list) and len(v) == 4 and isinstance(v[3], str) and len(v[3]) == HEX64_CHARS
        }

    def _save(self) -> None:
        with self._lock:
            if self.cache_file is None or not self._dirty:
                return
            text, self._dirty = json.dumps(self._known, sort_keys=True), False
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            staging = self.cache_file.with_name(
                f".{self.cache_file.name}.{os.getpid()}-{threading.get_ident()}"
            )
            staging.write_text(text)
            os.replace(staging, self.cache_file)
        except OSError as e:  # a read-only cache directory: hashes stay right, only computed again next time
            log.warning("cannot remember model hashes in %s: %s", self.cache_file, e)
