"""The `Retriever`: the active library version's RetrievalIndex (retrieval.py), swapped for the next
version's while requests search on, a few recent versions' indexes held for requests pinned to them, and
with an index directory every index also kept on disk (index_files.py) for a restart.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

from zoo.inference.embedder import Embedder
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.inference.index_files import load_index, prune_indexes, save_index
from zoo.inference.retrieval import (
    DEFAULT_ANN_THRESHOLD,
    DEFAULT_NPROBE,
    DEFAULT_SEED,
    ProgressFn,
    RetrievalIndex,
)
from zoo.registry.library_store import StoredVersion


class Snapshot(NamedTuple):
    """One index and the library root it was built from; a request uses one snapshot throughout."""

    index: RetrievalIndex
    root: str  # "" for the empty index served before any library is active


class Retriever:
    """Owns the active RetrievalIndex and a small LRU of recently built ones, by library root.

    update() builds in the calling thread (the daemon's worker) while searches go on against the old
    index; the swap is one reference assignment under a lock held for microseconds, never while
    building. Builds are serialised among themselves so each library is embedded once.

    update() makes a version's index active without waiting for its approximate index: vectors of
    experiences the held indexes already have are copied from them, so a version that changes a few
    of 100k experiences embeds only those few and is searched (exactly) at once. complete_ann() then
    trains the approximate index and swaps it in. With `index_dir`, indexes are also kept on disk (see
    index_files.py), so a restart loads them instead of rebuilding.
    """

    def __init__(
        self,
        embedder: Embedder,
        cache: EmbeddingCache | None = None,
        *,
        keep: int = 3,
        ann_threshold: int = DEFAULT_ANN_THRESHOLD,
        nprobe: int = DEFAULT_NPROBE,
        seed: int = DEFAULT_SEED,
        index_dir: Path | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.embedder = embedder
        self.cache = cache
        self.keep = keep
        self.index_dir = index_dir
        self._build_args: dict[str, Any] = {"ann_threshold": ann_threshold, "nprobe": nprobe, "seed": seed}
        self._state_lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._built: OrderedDict[str, RetrievalIndex] = OrderedDict()
        self._current = Snapshot(RetrievalIndex.empty(embedder), "")

    def snapshot(self, root: str | None = None) -> Snapshot:
        """The active (index, root), or with `root` that version's index if it is still held.

        KeyError when `root` is not among the held indexes (see roots(); index_for() builds one).
        """
        with self._state_lock:
            if root is None:
                return self._current
            root = root.lower()
            if root == self._current.root:
                return self._current
            if root not in self._built:
                raise KeyError(f"no retrieval index is held for library root {root}")
            self._built.move_to_end(root)
            return Snapshot(self._built[root], root)

    def roots(self) -> list[str]:
        """Roots with a held index, least recently used first."""
        with self._state_lock:
            return list(self._built)

    def index_for(self, stored: StoredVersion, progress: ProgressFn | None = None) -> RetrievalIndex:
        """The index of a stored version (for a request pinned to it), built now unless held.

        It joins the held indexes but is not made active. Only a build waits for a build in progress;
        a held index is returned at once, whatever is being built meanwhile.
        """
        held = self._held(stored.root.lower())
        if held is not None:
            return held
        with self._build_lock:
            return self._prepare(stored, progress)

    def update(self, stored: StoredVersion, progress: ProgressFn | None = None) -> Snapshot:
        """Make a stored version's index the active one (building it first when needed, searched
        exactly until complete_ann() adds its approximate index)."""
        # The build lock covers the swap too, so concurrent updates take effect in the order they build.
        with self._build_lock:
            index = self._prepare(stored, progress)
            root = stored.root.lower()
            with self._state_lock:
                self._current = Snapshot(index, root)
                self._built[root] = index
                self._built.move_to_end(root)
                self._evict()
                current = self._current
        self._save(current)
        return current

    def complete_ann(self, root: str | None = None) -> bool:
        """Train the approximate index of a held version (the active one by default) that wants one,
        and swap it in; False when there was nothing to do (small, already done, or no longer held)."""
        with self._build_lock:
            with self._state_lock:
                root = (root or self._current.root).lower()
                index = self._built.get(root)
            if index is None or not index.wants_ann:
                return False
            upgraded = index.with_ann()
            with self._state_lock:
                if self._built.get(root) is not index:
                    return False
                self._built[root] = upgraded
                if self._current.root == root:
                    self._current = Snapshot(upgraded, root)
        self._save(Snapshot(upgraded, root))
        return True

    def _held(self, root: str) -> RetrievalIndex | None:
        with self._state_lock:
            held = self._built.get(root)
            if held is not None:
                self._built.move_to_end(root)
            return held

    def _prepare(self, stored: StoredVersion, progress: ProgressFn | None) -> RetrievalIndex:
        root = stored.root.lower()
        held = self._held(root)
        if held is not None:
            return held
        index = self._load(stored)
        if index is None:
            with self._state_lock:
                reuse = [self._current.index, *reversed(self._built.values())]
            index = RetrievalIndex.build(
                stored.library,
                self.embedder,
                self.cache,
                progress=progress,
                ann=False,
                reuse=reuse,
                **self._build_args,
            )
        with self._state_lock:
            self._built[root] = index
            self._evict()
        return index

    def _load(self, stored: StoredVersion) -> RetrievalIndex | None:
        if self.index_dir is None:
            return None
        return load_index(self.index_dir, stored, self.embedder, **self._build_args)

    def _save(self, snapshot: Snapshot) -> None:
        """Keep the index on disk for a restart (what is there already is not written again), and drop
        the files of versions no longer held. A failure costs a rebuild after a restart, nothing more."""
        if self.index_dir is None or not snapshot.root:
            return
        save_index(self.index_dir, snapshot.root, snapshot.index)
        with self._state_lock:
            held = set(self._built) | {self._current.root}
        prune_indexes(self.index_dir, keep=held)

    def _evict(self) -> None:
        # Least recently used first, never the active index: every request uses it, so it counts as the
        # most recent; during update() that is still the index being replaced, which thereby outlives
        # older pinned ones.
        for root in list(self._built):
            if len(self._built) <= self.keep:
                break
            if root != self._current.root:
                del self._built[root]
