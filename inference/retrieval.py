"""Top-k experience retrieval (paper §4.7, eq. 11): which lessons of the active library go into a prompt.

A `RetrievalIndex` is built once per library version and is immutable afterwards, so any number of
request threads may search it while a worker thread builds the next one; the `Retriever` swaps the
active index by replacing one reference, and a request that took a `snapshot()` keeps using its index
(and the library root it came from) to the end, whatever is swapped in meanwhile.

What is embedded for an experience is f"{domain}: {text}" (see `embedding_text`): the domain names the
field in plain words ("math.geometry"), which helps a query that never repeats the lesson's wording.
Vectors are cached by (embedder name + that recipe's version, experience id) in embedding_cache.py, so
a new library version embeds only its new experiences.

Search is cosine similarity over L2-normalised vectors, reported as the score. Rows are kept sorted by
(domain, id), which makes every dotted-prefix domain filter one contiguous row range: "math" selects
"math" and "math.*" (these sort together, as no domain character sorts before "."), and not
"mathematics" (which sorts after "math/", the end of the range).

Below `ann_threshold` experiences (default 20,000) the search is exact: one numpy matrix-vector product.
Above it an approximate index is used, faiss IndexIVFFlat (inner product, spherical k-means with a fixed
seed, so a build is deterministic: the same library gives the same index byte for byte, whatever the
thread count). Candidates measured on this 2-core machine (load average 1.3-1.7 from other work) in one
run, on the data of benchmarks/retrieval.py: 100k 384-dim unit vectors with the topic structure of
sentence embeddings, 1000 queries, top-5, one query at a time, builds on 2 threads:

    exact numpy matmul                          recall@5 1.000   p50 4.44 ms   p99 9.65 ms
    faiss IVFFlat, as configured here           recall@5 0.986   p50 0.49 ms   p99 0.61 ms   build  6.1 s
    faiss HNSWFlat M=32 efC=80 efSearch=64      recall@5 0.980   p50 0.35 ms   p99 0.49 ms   build 16.1 s
    hnswlib 0.8.0 M=32 efC=80 ef=64             recall@5 0.990   p50 0.32 ms   p99 0.55 ms   build 18.5 s
    usearch 2.26.6 connectivity=32 ef=64        recall@5 0.984   p50 1.33 ms   p99 2.05 ms   build 52.2 s

All but usearch meet the goal (p50 <= 2 ms, recall@5 >= 0.95) with room to spare; IVF is chosen for the
rest: its build is 3x faster (a library update re-indexes in the background, and 100k experiences are
ready in seconds), it is deterministic on any thread count (HNSW graphs built on several threads depend
on scheduling; on one thread they take 2x longer still), and faiss filters by id range inside the scan
(IDSelectorRange), which the domain filter below uses. On uniformly random vectors every candidate falls
below 0.3 recall at these speeds: there is no neighbourhood structure to exploit, which real embeddings
always have, so benchmarks and tests use structured vectors.

The filter never costs recall. A domain range of at most `exact_subset_limit` rows (default: the ANN
threshold) is searched exactly: every list is probed and only rows in the range are scored, about 1 ms
at 100k. A larger range is served from the query's own approximate neighbourhood, over-fetched (64
rows) and then filtered, when that neighbourhood holds k matching rows; otherwise the query's
neighbours lie outside the domain, its best matches inside it are scattered over lists a probe would
miss, and the range is searched exactly. These exact range scans go through faiss too (probing every
list, scoring only rows in range), because the IVF path keeps no second copy of the vectors: at 100k
that copy would cost 150 MB per held index to save about 2 ms on such queries (benchmark: a filter
keeping 37k of 100k rows, mostly off-domain queries, p50 3.5 ms against 1.8 ms for numpy on the range;
a 13k-row filter 1.3 ms; unfiltered 0.55 ms).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from zoo.inference.embedder import Embedder, normalise_rows
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.registry.experience import DOMAIN_RE, Experience, Library
from zoo.registry.store import StoredVersion

DEFAULT_ANN_THRESHOLD = 20_000
DEFAULT_NPROBE = 32
DEFAULT_SEED = 1234
# Bump when embedding_text() changes: it is part of the cache key, so old vectors are not reused.
EMBED_TEXT_VERSION = 1
# Experiences embedded per call (and written to the cache per transaction): an interrupted build keeps
# what it finished, and progress is reported at this granularity.
EMBED_CHUNK = 256
# faiss warns (and k-means degrades) with fewer than 39 training points per list.
_MIN_POINTS_PER_LIST = 39
# 64 points per list train centroids as well as faiss's default 256 here (recall 1.000 either way at
# 100k) at a quarter of the k-means time; 10 iterations instead of 25 likewise.
_TRAIN_POINTS_PER_LIST = 64
_KMEANS_ITERATIONS = 10
# Rows fetched beyond k, so that ties at the cut can still be ordered by id.
_TIE_MARGIN = 8
# Neighbours of the query fetched (at least) before a domain filter is applied on the approximate path.
_OVERFETCH = 64

ProgressFn = Callable[[int, int], None]


def embedding_text(experience: Experience) -> str:
    """The text embedded for an experience (version EMBED_TEXT_VERSION of the recipe)."""
    return f"{experience.domain}: {experience.text}"


def cache_model_key(embedder: Embedder) -> str:
    """The name vectors are cached under: the embedder's content-derived name plus the text recipe."""
    return f"{embedder.name}|text-v{EMBED_TEXT_VERSION}"


def domain_matches(domain: str, prefix: str) -> bool:
    """Whether `domain` is in the dotted-prefix filter `prefix` ("" matches every domain)."""
    return not prefix or domain == prefix or domain.startswith(prefix + ".")


@dataclass(frozen=True, slots=True)
class Hit:
    experience: Experience
    score: float  # cosine similarity to the query, in [-1, 1]


@dataclass(frozen=True, slots=True)
class BuildStats:
    experiences: int
    cached: int  # vectors read from the cache
    embedded: int  # vectors computed by the embedder during this build
    seconds: float
    kind: str  # "exact" or "ivf"


class _IvfIndex:
    """faiss IndexIVFFlat over unit vectors, row number = faiss id (rows are added in order)."""

    def __init__(self, vectors: np.ndarray, *, seed: int) -> None:
        import faiss  # imported only when a library is large enough to need it

        self._faiss = faiss
        n, dim = vectors.shape
        self.size = n
        self.nlist = max(1, min(round(4 * math.sqrt(n)), n // _MIN_POINTS_PER_LIST))
        self._quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(self._quantizer, dim, self.nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.cp.spherical = True  # unit-norm centroids: assigning by inner product is assigning by cosine
        index.cp.niter = _KMEANS_ITERATIONS
        index.cp.max_points_per_centroid = _TRAIN_POINTS_PER_LIST
        index.train(vectors)
        index.add(vectors)
        self._index = index

    def search(
        self, query: np.ndarray, k: int, nprobe: int, lo: int, hi: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, scores) of up to k best rows in [lo, hi) among the nprobe lists nearest the query."""
        faiss = self._faiss
        # Parameters are per call, not set on the index: concurrent searches must not share them.
        selector = faiss.IDSelectorRange(lo, hi, True) if (lo, hi) != (0, self.size) else None
        params = faiss.SearchParametersIVF(nprobe=min(nprobe, self.nlist), sel=selector)
        scores, rows = self._index.search(query.reshape(1, -1), k, params=params)
        keep = rows[0] >= 0  # -1 marks "fewer than k found in the probed lists"
        return rows[0][keep], scores[0][keep]

    def serialize(self) -> bytes:
        return bytes(self._faiss.serialize_index(self._index))


class RetrievalIndex:
    """An immutable search structure over one library's experiences. Thread-safe to search."""

    def __init__(
        self,
        experiences: Sequence[Experience],
        vectors: np.ndarray,
        embedder: Embedder,
        *,
        version: int = -1,
        ann_threshold: int = DEFAULT_ANN_THRESHOLD,
        nprobe: int = DEFAULT_NPROBE,
        exact_subset_limit: int | None = None,
        seed: int = DEFAULT_SEED,
        stats: BuildStats | None = None,
    ) -> None:
        """Index `experiences` whose vectors are the rows of `vectors` (same order); see also build()."""
        if len(experiences) != len(vectors):
            raise ValueError(f"{len(experiences)} experiences but {len(vectors)} vectors")
        if len(experiences) and vectors.shape[1] != embedder.dim:
            raise ValueError(f"vectors have {vectors.shape[1]} dimensions, the embedder {embedder.dim}")
        if nprobe < 1:
            raise ValueError(f"nprobe must be at least 1, got {nprobe}")
        started = time.perf_counter()
        order = sorted(range(len(experiences)), key=lambda i: (experiences[i].domain, experiences[i].id))
        self.experiences: tuple[Experience, ...] = tuple(experiences[i] for i in order)
        self._domains = [e.domain for e in self.experiences]
        self._ids = [e.id for e in self.experiences]
        self.embedder = embedder
        self.version = version
        self.nprobe = nprobe
        self.exact_subset_limit = ann_threshold if exact_subset_limit is None else exact_subset_limit
        matrix = normalise_rows(np.asarray(vectors, dtype=np.float32)[order]) if order else None
        self._matrix: np.ndarray | None = None
        self._ivf: _IvfIndex | None = None
        if matrix is not None and len(matrix) >= ann_threshold:
            self._ivf = _IvfIndex(matrix, seed=seed)  # holds its own copy; the matrix is dropped
        else:
            self._matrix = matrix
        self.kind = "ivf" if self._ivf is not None else "exact"
        spent = time.perf_counter() - started
        if stats is None:
            stats = BuildStats(len(self.experiences), 0, 0, spent, self.kind)
        self.stats = BuildStats(
            stats.experiences, stats.cached, stats.embedded, stats.seconds + spent, self.kind
        )

    @classmethod
    def build(
        cls,
        library: Library,
        embedder: Embedder,
        cache: EmbeddingCache | None,
        *,
        ann_threshold: int = DEFAULT_ANN_THRESHOLD,
        nprobe: int = DEFAULT_NPROBE,
        seed: int = DEFAULT_SEED,
        progress: ProgressFn | None = None,
    ) -> RetrievalIndex:
        """Embed what the cache lacks (progress(done, to_embed) after each chunk), then index everything."""
        started = time.perf_counter()
        experiences = library.experiences
        key = cache_model_key(embedder)
        known = cache.get_many(key, (e.id for e in experiences), dim=embedder.dim) if cache else {}
        missing = [e for e in experiences if e.id not in known]
        fresh: dict[str, np.ndarray] = {}
        for start in range(0, len(missing), EMBED_CHUNK):
            chunk = missing[start : start + EMBED_CHUNK]
            vectors = embedder.embed([embedding_text(e) for e in chunk])
            if vectors.shape != (len(chunk), embedder.dim):
                raise ValueError(
                    f"embedder {embedder.name} returned shape {vectors.shape} for {len(chunk)} texts"
                )
            batch = {e.id: v for e, v in zip(chunk, vectors, strict=True)}
            if cache is not None:
                cache.put_many(key, batch)
            fresh.update(batch)
            if progress is not None:
                progress(start + len(chunk), len(missing))
        matrix = np.empty((len(experiences), embedder.dim), dtype=np.float32)
        for row, e in enumerate(experiences):
            matrix[row] = known[e.id] if e.id in known else fresh[e.id]
        stats = BuildStats(len(experiences), len(known), len(fresh), time.perf_counter() - started, "")
        return cls(
            experiences,
            matrix,
            embedder,
            version=library.version,
            ann_threshold=ann_threshold,
            nprobe=nprobe,
            seed=seed,
            stats=stats,
        )

    @classmethod
    def empty(cls, embedder: Embedder) -> RetrievalIndex:
        """An index with no experiences (what a node serves before it holds any library)."""
        return cls((), np.zeros((0, embedder.dim), dtype=np.float32), embedder)

    def __len__(self) -> int:
        return len(self.experiences)

    def embed_query(self, query: str | np.ndarray) -> np.ndarray:
        """The query as a unit float32 vector: a string is embedded, a vector is checked and normalised."""
        if isinstance(query, str):
            vector = self.embedder.embed([query])
        else:
            vector = np.asarray(query, dtype=np.float32).reshape(1, -1)
            if vector.shape[1] != self.embedder.dim:
                raise ValueError(
                    f"query vector has {vector.shape[1]} dimensions, expected {self.embedder.dim}"
                )
        return normalise_rows(vector)[0]

    def domain_range(self, domain: str) -> tuple[int, int]:
        """Rows [lo, hi) whose domain is `domain` or below it; ValueError for a malformed domain."""
        if not domain:
            return 0, len(self._domains)
        if not DOMAIN_RE.fullmatch(domain):
            raise ValueError(
                f"domain filter {domain[:100]!r} is not a dotted lower-case domain like math.geometry"
            )
        lo = bisect.bisect_left(self._domains, domain)
        # "/" is the character right after ".", so domain + "/" sorts after every "domain.<x>" and
        # before every "domain<x>" that is not below it (e.g. "mathematics" after "math/").
        hi = bisect.bisect_left(self._domains, domain + "/", lo)
        return lo, hi

    def search(
        self, query: str | np.ndarray, k: int = 5, domain: str = "", min_score: float = -1.0
    ) -> list[Hit]:
        """The k experiences most similar to the query (within the domain prefix, scoring at least
        min_score), best first; equal scores in id order. Fewer than k when fewer qualify."""
        if k < 0:
            raise ValueError(f"k must not be negative, got {k}")
        lo, hi = self.domain_range(domain)
        if k == 0 or lo == hi:
            return []  # nothing to rank, so the query need not even be embedded
        q = self.embed_query(query)
        want = min(k, hi - lo)
        if self._ivf is not None:
            rows, scores = self._search_ivf(q, want, lo, hi)
        else:
            assert self._matrix is not None
            rows, scores = self._search_exact(q, want, lo, hi)
        # Scores of float32 unit vectors can stray a rounding step outside [-1, 1].
        ranked = sorted(
            ((min(1.0, max(-1.0, float(s))), int(r)) for r, s in zip(rows, scores, strict=True)),
            key=lambda sr: (-sr[0], self._ids[sr[1]]),
        )
        return [Hit(self.experiences[r], s) for s, r in ranked[:want] if s >= min_score]

    def _search_exact(self, q: np.ndarray, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        assert self._matrix is not None
        scores = self._matrix[lo:hi] @ q
        if k < len(scores):
            top = np.argpartition(-scores, k - 1)[:k]
            # Every row tying with the k-th score stays a candidate, so the id tie-break is exact.
            rows = np.flatnonzero(scores >= scores[top].min())
        else:
            rows = np.arange(len(scores))
        return rows + lo, scores[rows]

    def _search_ivf(self, q: np.ndarray, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        assert self._ivf is not None
        ivf, size = self._ivf, hi - lo
        if size < len(self) and size <= self.exact_subset_limit:
            return ivf.search(q, k + _TIE_MARGIN, ivf.nlist, lo, hi)  # every list, only rows in range
        if size < len(self):
            # Over-fetch the query's own neighbourhood and keep what is in range. When that holds k
            # rows, they are the range's best as surely as an unfiltered top-k is the library's; when
            # it does not, the query's neighbours lie outside the domain and its best matches inside
            # are scattered over far lists an approximate probe misses, so the range is searched exactly.
            rows, scores = ivf.search(q, max(_OVERFETCH, 8 * k), self.nprobe, 0, len(self))
            inside = (rows >= lo) & (rows < hi)
            if np.count_nonzero(inside) >= k:
                return rows[inside], scores[inside]
            return ivf.search(q, k + _TIE_MARGIN, ivf.nlist, lo, hi)
        rows, scores = ivf.search(q, k + _TIE_MARGIN, self.nprobe, lo, hi)
        if len(rows) < k:  # the probed lists hold fewer than k rows (a very large k): search them all
            rows, scores = ivf.search(q, k + _TIE_MARGIN, ivf.nlist, lo, hi)
        return rows, scores

    def fingerprint(self) -> bytes:
        """The index contents as bytes (faiss serialisation or the exact matrix): equal for equal builds."""
        if self._ivf is not None:
            return self._ivf.serialize()
        return b"" if self._matrix is None else self._matrix.tobytes()


class Snapshot(NamedTuple):
    """One index and the library root it was built from; a request uses one snapshot throughout."""

    index: RetrievalIndex
    root: str  # "" for the empty index served before any library is active


class Retriever:
    """Owns the active RetrievalIndex and a small LRU of recently built ones, by library root.

    update() builds in the calling thread (the daemon's worker) while searches go on against the old
    index; the swap is one reference assignment under a lock held for microseconds, never while
    building. Builds are serialised among themselves so each library is embedded once.
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
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.embedder = embedder
        self.cache = cache
        self.keep = keep
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
        """Make a stored version's index the active one (building it first when needed)."""
        # The build lock covers the swap too, so concurrent updates take effect in the order they build.
        with self._build_lock:
            index = self._prepare(stored, progress)
            root = stored.root.lower()
            with self._state_lock:
                self._current = Snapshot(index, root)
                self._built[root] = index
                self._built.move_to_end(root)
                self._evict()
                return self._current

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
        index = RetrievalIndex.build(
            stored.library, self.embedder, self.cache, progress=progress, **self._build_args
        )
        with self._state_lock:
            self._built[root] = index
            self._evict()
        return index

    def _evict(self) -> None:
        # Least recently used first, never the active index: every request uses it, so it counts as the
        # most recent; during update() that is still the index being replaced, which thereby outlives
        # older pinned ones.
        for root in list(self._built):
            if len(self._built) <= self.keep:
                break
            if root != self._current.root:
                del self._built[root]
