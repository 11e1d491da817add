"""Connects the inference engine to the node: the active library's retrieval index, usage counters,
expert-factor processors, and rebuilding the index in the background when the library changes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from zoo.node.components.library import LibraryComponent
from zoo.node.components.supervisor import Component, State, in_background_thread
from zoo.node.logs import get_logger
from zoo.registry.store import StoredVersion

log = get_logger(__name__)


class NodeLibraryView:
    """The engine's LibraryView: current index (one consistent snapshot per request) or a pinned root."""

    def __init__(self, library: LibraryComponent, retriever: Any) -> None:
        self.library = library
        self.retriever = retriever

    def resolve(self, root: str) -> tuple[Any, str, int, StoredVersion | None]:
        if root:
            stored = self.library.store.get(root=root)  # NotFound when this node does not hold it
            return self.retriever.index_for(stored), stored.root, stored.version, stored
        index, index_root = self.retriever.snapshot()
        if index is None or not index_root:
            return None, "", 0, None
        active = self.library.active
        stored = (
            active
            if active is not None and active.root == index_root
            else self.library.store.get(root=index_root)
        )
        return index, stored.root, stored.version, stored


async def keep_index_current(
    library: LibraryComponent, retriever: Any, version_changed: asyncio.Event
) -> None:
    """Rebuild the retrieval index in a worker thread whenever the active library changes.

    Queries keep using the previous index until the new one is swapped in whole; a large library is
    searched exactly at once and gains its approximate index next, unless a newer version came first.
    """
    built_root, ann_tried = "", ""
    while True:
        active = library.active
        if active is not None and active.root != built_root:
            snapshot = await asyncio.to_thread(retriever.update, active)
            built_root = active.root
            stats = snapshot.index.stats
            log.info(
                "retrieval index ready",
                version=active.version,
                experiences=stats.experiences,
                reused=stats.reused,
                cached=stats.cached,
                embedded=stats.embedded,
                seconds=round(stats.seconds, 3),
            )
            continue  # a newer version may have arrived meanwhile: it goes first
        index, root = retriever.snapshot()
        if root and root == built_root != ann_tried and index.wants_ann and not version_changed.is_set():
            ann_tried = root  # tried once per version: a failure leaves exact search, which is correct
            try:
                if await asyncio.to_thread(retriever.complete_ann, root):
                    log.info("approximate retrieval index ready", root=root)
            except Exception as e:  # the exact index keeps serving
                log.warning("approximate retrieval index failed; searching exactly", error=str(e))
            continue
        await version_changed.wait()
        version_changed.clear()


class RetrievalComponent(Component):
    """Loads the embedder and keeps the retrieval index in step with the active library."""

    name = "retrieval"
    probe_interval_s = 1.0
    has_background_task = True

    def __init__(
        self,
        library: LibraryComponent,
        embedder_path: Path | None,
        cache_file: Path,
        ann_threshold: int,
        index_dir: Path | None = None,
    ):
        self.library = library
        self.embedder_path = embedder_path
        self.cache_file = cache_file
        self.ann_threshold = ann_threshold
        self.index_dir = index_dir
        self.retriever: Any = None
        self.changed = asyncio.Event()

    def library_changed(self) -> None:
        self.changed.set()

    async def setup(self) -> None:
        self.retriever = await in_background_thread(self._build, "load-embedder")

    def _build(self) -> Any:
        from zoo.inference.embedder import SentenceTransformerEmbedder
        from zoo.inference.embedding_cache import EmbeddingCache
        from zoo.inference.retrieval import Retriever

        embedder = SentenceTransformerEmbedder(self.embedder_path)
        return Retriever(
            embedder,
            EmbeddingCache(self.cache_file),
            ann_threshold=self.ann_threshold,
            index_dir=self.index_dir,
        )

    async def run_forever(self) -> None:
        await keep_index_current(self.library, self.retriever, self.changed)

    async def probe(self) -> tuple[State, str]:
        if self.retriever is None:
            return State.STARTING, "loading the embedder"
        _index, root = self.retriever.snapshot()
        active = self.library.active
        if active is None:
            return State.DEGRADED, "no library to index yet"
        if root != active.root:
            return State.DEGRADED, f"indexing version {active.version}; serving the previous index meanwhile"
        return (
            State.SERVING,
            f"index of version {active.version} ({len(active.library.experiences)} experiences)",
        )

    async def stop(self) -> None:
        return None
