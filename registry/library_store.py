"""The node's local library store: every version it accepted, the operator's draft, and the pointer to
the current (active) version.

Layout under DATA_DIR/library/:
    versions/v<version>-<root hex>.json   canonical library bytes, immutable once written
    versions/v<version>-<root hex>.meta   {"cid", "sha256"}: the CID it came from, a hash of the whole file
                                          (written before the .json, so a listed version always has one)
    current.json                          {"version", "root", "cid"}: which stored version is active
    draft.json                            the operator's working copy (canonical encoding too)
Every write goes through a temp file, fsync and rename, so a crash (even kill -9) leaves either the old
or the new file and never half of one. The current pointer only ever names a version whose bytes are
on disk and hash to its root; loading re-checks that, so a corrupted file is refused, not served.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.errors import IntegrityError, NotFound, ValidationError
from zoo.registry.experience import Experience
from zoo.registry.fsutil import write_atomic
from zoo.registry.library import Library
from zoo.registry.merkle import HASH_SIZE, MerkleTree, decode_library_leaves, library_tree

_VERSION_FILE = re.compile(r"v(\d+)-0x([0-9a-f]{64})\.json")
# Decoded versions kept in memory, most recently used last: a node syncing for months must not hold every
# version it ever accepted (100k experiences are tens of MB each); older ones are read again if asked for.
CACHED_VERSIONS = 4


def _file_sha256(path: Path) -> str | None:
    """The file's sha256 in hex, read in chunks (not a second copy of a 30 MB library); None if missing."""
    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def root_hex(root: bytes) -> str:
    return "0x" + root.hex()


@dataclass(frozen=True)
class StoredVersion:
    """A verified library version held locally."""

    library: Library
    root: str  # 0x-hex Merkle root
    cid: str
    path: Path
    sha256: str  # hex digest of the canonical bytes that were verified against the root
    leaf_hashes: bytes = b""  # the Merkle leaf hashes, 32 bytes each, in order (one object, not 100k)

    @property
    def version(self) -> int:
        return self.library.version

    def known_leaves(self) -> dict[bytes, Experience]:
        """Each experience by its leaf hash: what the next version may reuse (see decode_library_leaves)."""
        h, experiences = self.leaf_hashes, self.library.experiences
        if len(h) != HASH_SIZE * len(experiences):  # not recorded: nothing to reuse
            return {}
        return {h[HASH_SIZE * i : HASH_SIZE * (i + 1)]: e for i, e in enumerate(experiences)}


class LibraryStore:
    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "library"
        self.versions_dir = self.dir / "versions"
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self._cache: OrderedDict[str, StoredVersion] = OrderedDict()
        self._cache_lock = threading.Lock()  # the daemon reads from request threads and the sync worker
        # Temp files are what a crash mid-write leaves behind; the real files were never touched.
        for tmp in self.dir.rglob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    # -- versions ---------------------------------------------------------------------------------

    def put(
        self,
        library: Library,
        cid: str,
        expected_root: str | None = None,
        raw: bytes | None = None,
        leaf_hashes: Sequence[bytes] | None = None,
    ) -> StoredVersion:
        """Store a version after checking its Merkle root (against expected_root when given).

        `raw` may pass the canonical bytes and `leaf_hashes` their leaves' hashes when the caller already
        holds them (decode_library_leaves gives both), which saves encoding the library again.
        """
        tree = library_tree(library) if leaf_hashes is None else MerkleTree.from_leaf_hashes(leaf_hashes)
        root = root_hex(tree.root)
        if expected_root is not None and root != expected_root.lower():
            raise IntegrityError(
                f"library version {library.version} has Merkle root {root}, not the expected {expected_root}",
                computed=root,
                expected=expected_root,
            )
        path = self._version_file(library.version, root)
        data = raw if raw is not None else encode_library(library)
        # The root commits to the experiences only; this hash also covers version, parent and description.
        meta = {"cid": cid, "sha256": hashlib.sha256(data).hexdigest()}
        # The .meta goes first: list() keys on the .json, so a crash between the two writes leaves an
        # orphan .meta (ignored, overwritten by the next put) rather than a listed version without one.
        write_atomic(path.with_suffix(".meta"), json.dumps(meta).encode())
        write_atomic(path, data)
        stored = StoredVersion(library, root, cid, path, meta["sha256"], b"".join(tree.leaf_level))
        self._remember(stored)
        return stored

    def list(self) -> list[tuple[int, str]]:
        """(version, root) of every stored version, oldest first."""
        out = []
        for p in self.versions_dir.glob("v*.json"):
            m = _VERSION_FILE.fullmatch(p.name)
            if m and p.with_suffix(".meta").exists():
                out.append((int(m.group(1)), "0x" + m.group(2)))
        return sorted(out)

    def get(self, version: int | None = None, root: str | None = None) -> StoredVersion:
        """A stored version by number or root, re-verified against its root; NotFound if absent."""
        for v, r in self.list():
            if (version is None or v == version) and (root is None or r == root.lower()):
                return self._load(v, r)
        what = f"root {root}" if root else f"version {version}"
        raise NotFound(f"library {what} is not in the local store", version=version, root=root)

    def bytes_for_cid(self, cid: str) -> bytes | None:
        """The stored canonical bytes that came from `cid` (intact on disk), or None: what peers may fetch."""
        for v, r in reversed(self.list()):
            path = self._version_file(v, r)
            try:
                if json.loads(path.with_suffix(".meta").read_text()).get("cid") != cid:
                    continue
                return self._read_intact(path)[0]
            except (OSError, ValueError, AttributeError, IntegrityError):
                continue
        return None

    def _version_file(self, version: int, root: str) -> Path:
        return self.versions_dir / f"v{version}-{root}.json"

    def _read_intact(self, path: Path) -> tuple[bytes, str, str]:
        """A version file's bytes, CID and sha256, the bytes checked against the hash in its .meta."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise IntegrityError(f"stored library {path.name} is incomplete: {e}", path=str(path)) from None
        cid, digest = self._read_meta(path)
        if hashlib.sha256(data).hexdigest() != digest:
            raise IntegrityError(
                f"stored library {path.name} is corrupt (its bytes changed on disk)", path=str(path)
            )
        return data, cid, digest

    def _read_meta(self, path: Path) -> tuple[str, str]:
        """The CID and sha256 recorded beside a version file."""
        try:
            meta = json.loads(path.with_suffix(".meta").read_text())
            return str(meta["cid"]), str(meta["sha256"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise IntegrityError(f"stored library {path.name} is incomplete: {e}", path=str(path)) from None

    def _remember(self, stored: StoredVersion) -> None:
        with self._cache_lock:
            self._cache[stored.root] = stored
            self._cache.move_to_end(stored.root)
            while len(self._cache) > CACHED_VERSIONS:
                self._cache.popitem(last=False)

    def _cached(self, root: str) -> StoredVersion | None:
        with self._cache_lock:
            stored = self._cache.get(root)
            if stored is not None:
                self._cache.move_to_end(root)
            return stored

    def _load(self, version: int, root: str) -> StoredVersion:
        cached = self._cached(root)
        if cached is not None:
            return cached
        path = self._version_file(version, root)
        data, cid, digest = self._read_intact(path)
        with self._cache_lock:
            recent = next(reversed(self._cache.values()), None)
        try:
            # Versions share most experiences: those of the most recent one are reused, not re-validated.
            library, leaves = decode_library_leaves(data, known=recent.known_leaves() if recent else None)
        except ValidationError as e:
            raise IntegrityError(f"stored library {path.name} is corrupt: {e}", path=str(path)) from None
        computed = root_hex(MerkleTree.from_leaf_hashes(leaves).root)
        if computed != root or library.version != version:
            raise IntegrityError(f"stored library {path.name} does not match its root (got {computed})")
        stored = StoredVersion(library, root, cid, path, digest, b"".join(leaves))
        self._remember(stored)
        return stored

    # -- the current pointer ------------------------------------------------------------------------

    @property
    def _current_file(self) -> Path:
        return self.dir / "current.json"

    def activate(self, stored: StoredVersion) -> None:
        """Make a stored, verified version the current one (atomically)."""
        # What becomes current must be intact on disk, where a restart will read it: the file still hashing
        # to the bytes that were verified against the root is that check, at a hash's cost (decoding and
        # re-rooting the file again took seconds at 100k experiences).
        path = self._version_file(stored.version, stored.root)
        if self._read_meta(path)[1] != stored.sha256 or _file_sha256(path) != stored.sha256:
            raise IntegrityError(
                f"stored library {path.name} is corrupt (its bytes changed on disk)", path=str(path)
            )
        write_atomic(
            self._current_file,
            json.dumps({"version": stored.version, "root": stored.root, "cid": stored.cid}).encode(),
        )

    def current(self) -> StoredVersion | None:
        """The active version, or None when the node has none yet."""
        try:
            pointer = json.loads(self._current_file.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as e:
            raise IntegrityError(f"{self._current_file} is corrupt: {e}") from None
        return self._load(int(pointer["version"]), str(pointer["root"]))

    # -- the operator's draft -------------------------------------------------------------------------

    @property
    def _draft_file(self) -> Path:
        return self.dir / "draft.json"

    def draft(self) -> Library | None:
        try:
            return decode_library(self._draft_file.read_bytes())
        except FileNotFoundError:
            return None

    def save_draft(self, library: Library) -> None:
        write_atomic(self._draft_file, encode_library(library))

    def discard_draft(self) -> None:
        self._draft_file.unlink(missing_ok=True)
