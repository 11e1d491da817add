"""Connects the inference engine to the node: the engine itself (over the loaded model, once it has
loaded), the active library's retrieval index, what each answer is metered and charged as, expert-factor
processors, and rebuilding the index in the background when the library changes."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from zoo.inference.adapters import AdapterDirectory
from zoo.node.components.library import LibraryComponent
from zoo.node.components.probes import ModelComponent
from zoo.node.config import NodeConfig
from zoo.node.credits.book import CreditBook
from zoo.node.credits.meter import Served, UsageMeter, credited_of
from zoo.node.credits.metered_receipt import MeteredReceipt
from zoo.node.lifecycle import Component, State, in_background_thread
from zoo.node.logs import get_logger
from zoo.node.metrics import NodeMetrics
from zoo.node.provenance.binding import binding_note, binding_problem
from zoo.node.provenance.receipts import Notary
from zoo.registry.library_store import StoredVersion

log = get_logger(__name__)


class NodeLibraryView:
    """The engine's LibraryView: current index (one consistent snapshot per request) or a pinned root. A
    version made for other weights than this node's (node.provenance.binding) resolves with no index: its
    experiences stay out of the prompt, and the answer still names the version it was asked under."""

    def __init__(self, library: LibraryComponent, retriever: Any, model_sha256: str = "") -> None:
        self.library = library
        self.retriever = retriever
        self.model_sha256 = model_sha256

    def resolve(self, root: str) -> tuple[Any, str, int, StoredVersion | None]:
        if root:
            stored = self.library.store.get(root=root)  # NotFound when this node does not hold it
            index = None if self._unbound(stored) else self.retriever.index_for(stored)
            return index, stored.root, stored.version, stored
        index, index_root = self.retriever.snapshot()
        if index is None or not index_root:
            return None, "", 0, None
        active = self.library.active
        stored = (
            active
            if active is not None and active.root == index_root
            else self.library.store.get(root=index_root)
        )
        return None if self._unbound(stored) else index, stored.root, stored.version, stored

    def _unbound(self, stored: StoredVersion) -> bool:
        return binding_problem(stored.library, self.model_sha256) is not None


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
        defer: bool = False,
        model_sha256: str = "",
    ):
        self.library = library
        self.model_sha256 = model_sha256  # the served weights' (node.provenance.binding); "" if unknown
        # Deferred: the embedder (sentence-transformers, so torch) loads only once something needs it: a
        # library with experiences, an embeddings request or a learning job. A llama.cpp node with an
        # empty library answers without ever importing torch.
        self.defer = defer
        self._wanted = asyncio.Event()
        self.embedder_path = embedder_path
        self.cache_file = cache_file
        self.ann_threshold = ann_threshold
        self.index_dir = index_dir
        self.retriever: Any = None
        self.changed = asyncio.Event()

    def library_changed(self) -> None:
        self.changed.set()
        if self._has_experiences():
            self._wanted.set()

    def want(self) -> None:
        """Ask for the embedder (a no-op once it is loading or loaded)."""
        self._wanted.set()

    def _has_experiences(self) -> bool:
        active = self.library.active
        return active is not None and len(active.library.experiences) > 0

    async def setup(self) -> None:
        if not self.defer or self._has_experiences():
            self.retriever = await in_background_thread(self._build, "load-embedder")

    def _build(self) -> Any:
        from zoo.inference.embedder import SentenceTransformerEmbedder
        from zoo.inference.embedding_cache import EmbeddingCache
        from zoo.inference.retriever import Retriever

        embedder = SentenceTransformerEmbedder(self.embedder_path)
        return Retriever(
            embedder,
            EmbeddingCache(self.cache_file),
            ann_threshold=self.ann_threshold,
            index_dir=self.index_dir,
        )

    async def run_forever(self) -> None:
        if self.retriever is None:  # deferred: load once something needs it
            await self._wanted.wait()
            self.retriever = await in_background_thread(self._build, "load-embedder")
        await keep_index_current(self.library, self.retriever, self.changed)

    async def probe(self) -> tuple[State, str]:
        if self.retriever is None:
            if self.defer and not self._wanted.is_set():
                return State.DEGRADED, (
                    "embedder not loaded: it loads with the first library that has experiences, "
                    "embeddings request or learning job"
                )
            return State.STARTING, "loading the embedder"
        _index, root = self.retriever.snapshot()
        active = self.library.active
        if active is None:
            return State.DEGRADED, "no library to index yet"
        problem = binding_problem(active.library, self.model_sha256)
        if problem is not None:
            return State.DEGRADED, problem
        if root != active.root:
            return State.DEGRADED, f"indexing version {active.version}; serving the previous index meanwhile"
        note = binding_note(active.library, self.model_sha256)
        return (
            State.SERVING,
            f"index of version {active.version} ({len(active.library.experiences)} experiences){note}",
        )

    async def stop(self) -> None:
        return None


def answer_metering(
    meter: UsageMeter, credits: CreditBook | None, metrics: NodeMetrics, notary: Notary | None = None
) -> Callable[[Any, Any], Awaitable[None]]:
    """What the engine calls once per answer: charge a credit holder (under its authorization for the
    epoch the answer is metered in), sign the answer's receipt (the client's, when it asked for one, and
    the epoch's receipts log either way: credits/receipt_log.py), commit the usage and the receipt before
    the answer goes out, count it."""

    async def on_answered(outcome: Any, params: Any) -> None:
        served = [Served(e.id, e.author, e.cited) for e in outcome.experiences]
        tokens = outcome.prompt_tokens + outcome.completion_tokens
        now = meter.now()
        epoch = meter.epoch_of(now)
        # Charged only under the client's authorization for the epoch the answer is metered in.
        spend = params.spend if params.spend is not None and params.spend.epoch == epoch else None
        spent = credits.charge(params.client, tokens, spend) if credits is not None else 0
        leaf = b""
        if notary is not None:  # stamped by the meter's clock, so it falls in the epoch it is metered in
            receipt = notary.receipt(outcome, params.request_sha256, params.client, timestamp=int(now))
            leaf = MeteredReceipt.of(receipt, credited_of(served), spent).leaf()
            if params.receipt:
                outcome.receipt = receipt.to_json()
        usage = meter.usage_of(tokens, served, params.client, spent, spend if spent else None, epoch, leaf)
        try:
            await meter.record(usage)  # on disk before the answer goes out
        except sqlite3.Error as e:  # a full disk, say: the node keeps answering; the log says what was lost
            log.error(
                "usage not metered", error=str(e), units=usage.units, client=usage.client or "anonymous"
            )
            return
        metrics.experiences_served.inc(len(served))
        metrics.metered_units.inc(sum(usage.shares.values()))

    return on_answered


def engine_provider(
    cfg: NodeConfig,
    model: ModelComponent,
    library: LibraryComponent,
    retrieval: RetrievalComponent,
    on_answered: Callable[[Any, Any], Awaitable[None]],
) -> Callable[[], Any]:
    """A provider of the inference engine: None until the model has loaded; a new engine when the model
    component's backend changes."""
    from zoo.inference.engine import InferenceEngine

    cache: dict[str, Any] = {}

    def provider() -> Any:
        if model.backend is None:
            return None
        if cache.get("backend") is not model.backend:
            cache["backend"] = model.backend
            cache["engine"] = InferenceEngine(
                model.backend,
                LoadingLibraryView(library, retrieval),
                experience_budget=cfg.inference.experience_budget_tokens,
                lesson_position=cfg.inference.lesson_position,
                factor_builder=lazy_factor_builder(
                    model.backend, cfg.inference.factor_eta, cfg.inference.factor_cap
                ),
                on_answered=on_answered,
                adapters=AdapterDirectory(cfg.adapters_dir),
                model_sha256=retrieval.model_sha256,
            )
        return cache["engine"]

    return provider


def lazy_factor_builder(backend: Any, eta: float, cap: float) -> Callable[[Any], Any] | None:
    """inference.factors.processor_builder, imported by the first request that uses expert factors: the
    module needs torch and transformers, which a llama.cpp node otherwise never loads to answer."""
    if getattr(backend, "tokenizer", None) is None:
        return None
    if not getattr(backend, "supports_logits_processors", False):
        return None
    built: list[Any] = []

    def build(experiences: Any) -> Any:
        if not built:
            from zoo.inference.factors import processor_builder

            built.append(processor_builder(backend, eta, cap))
        return built[0](experiences) if built[0] is not None else None

    return build


class LoadingLibraryView:
    """Resolves through the retriever once the embedder has loaded; before that, no experiences (and a
    request pinned to a root waits: BackendUnavailable)."""

    def __init__(self, library: LibraryComponent, retrieval: RetrievalComponent) -> None:
        self.library = library
        self.retrieval = retrieval

    def resolve(self, root: str) -> Any:
        if self.retrieval.retriever is None:
            if root:
                from zoo.inference.backend_protocol import BackendUnavailable

                self.retrieval.want()
                raise BackendUnavailable("the retrieval index is still loading; retry shortly")
            return None, "", 0, None
        view = NodeLibraryView(self.library, self.retrieval.retriever, self.retrieval.model_sha256)
        return view.resolve(root)
