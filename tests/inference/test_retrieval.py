"""Retrieval: the real bundled embedder ranks lessons by meaning; domain-prefix filters, min_score and k;
the embedding cache (what a rebuild embeds, persistence); the approximate (faiss IVF) path against exact
search on synthetic vectors; swapping and pinning indexes under concurrent searches."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from zoo.inference.embedder import Embedder, SentenceTransformerEmbedder, model_fingerprint
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.inference.mean_pooled import mean_pooled_layout
from zoo.inference.retrieval import (
    Hit,
    RetrievalIndex,
    _copy_rows,
    cache_model_key,
    domain_matches,
    embedding_text,
)
from zoo.inference.retriever import Retriever
from zoo.registry.canonical import encode_library
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.library_store import StoredVersion, root_hex
from zoo.registry.merkle import library_root

pytestmark = pytest.mark.numerics

AUTHOR = "0x" + "ab" * 20
LESSONS = [
    ("math.geometry", "When computing the area of a triangle, take half the base times the height."),
    ("math.geometry", "For circle problems, write the circumference as two pi times the radius."),
    ("math.algebra", "When solving a quadratic equation, check the discriminant before using the formula."),
    ("math", "When a math problem gives units, carry the units through every step."),
    ("mathematics", "When writing a mathematics proof, state every assumption explicitly."),
    ("finance", "When comparing loans, compute the total interest paid over the whole term."),
    ("finance.tax", "When estimating income tax, apply each bracket's rate only to the income inside it."),
    ("cs.algorithms", "When sorting nearly sorted data, prefer insertion sort over quicksort."),
    ("biology", "When explaining photosynthesis, separate the light reactions from the Calvin cycle."),
]
TRIANGLE_QUERY = "How do I find the area of a triangle with base 6 cm and height 4 cm?"
LOAN_QUERY = "Which mortgage costs me less in interest over thirty years?"


def make_experience(domain: str, text: str) -> Experience:
    return Experience.create(
        text=text,
        domain=domain,
        confidence=0.8,
        author=AUTHOR,
        base_model="smollm2-135m-instruct",
        created_at="2025-10-17T12:00:00Z",
    )


def make_library(lessons: Sequence[tuple[str, str]], version: int = 1) -> Library:
    return Library.create(
        version=version,
        base_model="smollm2-135m-instruct",
        experiences=[make_experience(d, t) for d, t in lessons],
    )


def stored(library: Library) -> StoredVersion:
    digest = hashlib.sha256(encode_library(library)).hexdigest()
    return StoredVersion(library, root_hex(library_root(library)), "", Path("unused"), digest)


class CountingEmbedder:
    """Wraps an embedder and records every text it is asked to embed."""

    def __init__(self, inner: Embedder, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dim = inner.dim
        self.texts: list[str] = []
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.texts.extend(texts)
        return self.inner.embed(texts)


class TableEmbedder:
    """Looks vectors up by text: pure index logic on chosen vectors, no model involved."""

    def __init__(self, table: dict[str, np.ndarray], dim: int, name: str = "table") -> None:
        self.table, self.dim, self.name = table, dim, name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()  # the real bundled all-MiniLM-L6-v2, loaded once


@pytest.fixture(scope="module")
def library() -> Library:
    return make_library(LESSONS)


@pytest.fixture(scope="module")
def index(library: Library, embedder: SentenceTransformerEmbedder) -> RetrievalIndex:
    return RetrievalIndex.build(library, embedder, None)


# -- the embedder -----------------------------------------------------------------------------------------


def test_embedder_returns_unit_float32_rows(embedder: SentenceTransformerEmbedder) -> None:
    vectors = embedder.embed(["When in doubt, check the units.", "For primes, try small divisors."])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32 and embedder.dim == 384
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        embedder.embed("a bare string")  # type: ignore[arg-type]


def test_embedder_name_changes_with_model_content(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    source = embedder.path
    assert embedder.name.endswith(model_fingerprint(source))
    assert model_fingerprint(source) == model_fingerprint(source)
    copy = _linked_copy(source, tmp_path / "model")
    assert model_fingerprint(copy) == model_fingerprint(source)
    (copy / "README.md").unlink()  # documentation is not part of what the model computes
    assert model_fingerprint(copy) == model_fingerprint(source)
    config = copy / "config.json"
    text = config.read_text()
    config.unlink()
    config.write_text(text.replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    assert model_fingerprint(copy) != model_fingerprint(source)


def _linked_copy(source: Path, copy: Path) -> Path:
    for file in source.rglob("*"):
        if file.is_file():
            target = copy / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(file)
    return copy


def test_the_mean_pooled_path_gives_sentence_transformers_vectors(
    embedder: SentenceTransformerEmbedder,
) -> None:
    from sentence_transformers import SentenceTransformer

    assert embedder._encoder is not None  # the bundled model runs without sentence-transformers
    texts = [
        "When a triangle's base and height are given, the area is half their product.",
        "  outer spaces are stripped  ",
        "é ünïcode 漢字 🙂",
        "",
        "word " * 400,  # beyond max_seq_length: truncated alike
        *[f"For case {i}, check the boundary values first." for i in range(70)],  # more than a batch
    ]
    reference = SentenceTransformer(str(embedder.path), device="cpu", local_files_only=True)
    expected = reference.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    assert np.abs(embedder.embed(texts) - expected).max() < 1e-5


@pytest.mark.parametrize(
    ("file", "change"),
    [
        ("1_Pooling/config.json", ('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true')),
        ("sentence_bert_config.json", ('"do_lower_case": false', '"do_lower_case": true')),
        ("modules.json", ('"path": ""', '"path": "0_Transformer"')),
    ],
)
def test_another_layout_is_loaded_by_sentence_transformers(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, file: str, change: tuple[str, str]
) -> None:
    copy = _linked_copy(embedder.path, tmp_path / "model")
    target = copy / file
    text = target.read_text()
    assert change[0] in text
    target.unlink()
    target.write_text(text.replace(*change))
    assert mean_pooled_layout(copy) is None
    if file != "modules.json":  # (that one names a folder the copy does not have: only the check is shown)
        other = SentenceTransformerEmbedder(copy)
        assert other._encoder is None  # (CLS and mean pooling together: 768 dimensions)
        assert other.embed(["When in doubt, check the units."]).shape == (1, other.dim)


# -- ranking with the real embedder -----------------------------------------------------------------------


def test_triangle_area_query_ranks_the_geometry_lesson_first(index: RetrievalIndex) -> None:
    hits = index.search(TRIANGLE_QUERY, k=len(index))
    assert hits[0].experience.domain == "math.geometry" and "triangle" in hits[0].experience.text
    finance = next(h for h in hits if h.experience.domain == "finance")
    assert hits[0].score > finance.score + 0.2
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_loan_query_ranks_the_finance_lesson_first(index: RetrievalIndex) -> None:
    hits = index.search(LOAN_QUERY, k=3)
    assert hits[0].experience.domain == "finance"
    assert all(h.experience.domain != "math.geometry" for h in hits[:2])


def test_scores_are_cosine_similarities(index: RetrievalIndex, embedder: SentenceTransformerEmbedder) -> None:
    hits = index.search(TRIANGLE_QUERY, k=3)
    q = embedder.embed([TRIANGLE_QUERY])[0]
    for hit in hits:
        v = embedder.embed([embedding_text(hit.experience)])[0]
        assert hit.score == pytest.approx(float(q @ v), abs=1e-5)
    # A vector query gives the same ranking and scores as the text it came from.
    by_vector = index.search(q, k=3)
    assert [(h.experience.id, round(h.score, 5)) for h in by_vector] == [
        (h.experience.id, round(h.score, 5)) for h in hits
    ]


def test_domain_filter_is_a_dotted_prefix(index: RetrievalIndex) -> None:
    def domains(prefix: str) -> set[str]:
        return {h.experience.domain for h in index.search(TRIANGLE_QUERY, k=100, domain=prefix)}

    assert domains("math") == {"math", "math.geometry", "math.algebra"}
    assert domains("mathematics") == {"mathematics"}
    assert domains("math.geometry") == {"math.geometry"}
    assert domains("finance") == {"finance", "finance.tax"}
    assert domains("math.geo") == set()  # a prefix of a name is not a prefix of the domain
    assert domains("chemistry") == set()
    assert len(domains("")) == len({d for d, _ in LESSONS})
    # Filtering ranks exactly like the unfiltered search restricted to the domain.
    everything = index.search(LOAN_QUERY, k=100)
    for prefix in ("math", "finance", "cs"):
        expected = [h for h in everything if domain_matches(h.experience.domain, prefix)][:2]
        got = index.search(LOAN_QUERY, k=2, domain=prefix)
        assert [h.experience.id for h in got] == [h.experience.id for h in expected]
        # The same cosines, up to float32 rounding of a product over a different slice.
        assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-6)
    for bad in ("Math", "math.", ".math", "math..geometry"):
        with pytest.raises(ValueError):
            index.search(TRIANGLE_QUERY, domain=bad)


def test_min_score_drops_weaker_hits(index: RetrievalIndex) -> None:
    everything = index.search(TRIANGLE_QUERY, k=len(index))
    cut = everything[3].score
    kept = index.search(TRIANGLE_QUERY, k=len(index), min_score=cut)
    assert kept == [h for h in everything if h.score >= cut] and len(kept) >= 4
    assert all(h.score >= cut for h in kept)
    assert index.search(TRIANGLE_QUERY, k=5, min_score=1.01) == []
    assert len(index.search(TRIANGLE_QUERY, k=5, min_score=-1.0)) == 5


def test_k_bounds(index: RetrievalIndex) -> None:
    assert index.search(TRIANGLE_QUERY, k=0) == []
    assert len(index.search(TRIANGLE_QUERY, k=1)) == 1
    assert len(index.search(TRIANGLE_QUERY)) == 5  # the paper's default
    everything = index.search(TRIANGLE_QUERY, k=len(index) + 10)
    assert len(everything) == len(index) == len(LESSONS)
    assert len({h.experience.id for h in everything}) == len(LESSONS)
    assert len(index.search(TRIANGLE_QUERY, k=50, domain="finance")) == 2
    with pytest.raises(ValueError):
        index.search(TRIANGLE_QUERY, k=-1)


def test_equal_scores_are_ordered_by_id() -> None:
    experiences = [make_experience("math", f"When tied, case {i} must order by id.") for i in range(6)]
    same = np.ones(8, dtype=np.float32)
    table = {embedding_text(e): same for e in experiences}
    index = RetrievalIndex.build(
        make_library([(e.domain, e.text) for e in experiences]), TableEmbedder(table, 8), None
    )
    hits = index.search(same, k=4)
    assert [h.experience.id for h in hits] == sorted(e.id for e in experiences)[:4]
    assert all(h.score == pytest.approx(1.0) for h in hits)


def test_empty_index_does_not_embed_the_query(embedder: SentenceTransformerEmbedder) -> None:
    counting = CountingEmbedder(embedder)
    empty = RetrievalIndex.build(make_library([]), counting, None)
    assert len(empty) == 0 and empty.search(TRIANGLE_QUERY, k=5) == []
    assert counting.texts == []


# -- the embedding cache ----------------------------------------------------------------------------------


def test_cache_embeds_only_what_is_new_and_survives_reopening(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, library: Library
) -> None:
    path = tmp_path / "embeddings.sqlite"
    counting = CountingEmbedder(embedder)
    progress: list[tuple[int, int]] = []
    with EmbeddingCache(path) as cache:
        first = RetrievalIndex.build(library, counting, cache, progress=lambda d, t: progress.append((d, t)))
        assert len(counting.texts) == len(LESSONS) and first.stats.embedded == len(LESSONS)
        assert progress[-1] == (len(LESSONS), len(LESSONS))
        assert cache.count(cache_model_key(embedder)) == len(LESSONS)

        counting.texts.clear()
        second = RetrievalIndex.build(library, counting, cache)
        assert counting.texts == [] and second.stats.cached == len(LESSONS) and second.stats.embedded == 0
        assert second.search(TRIANGLE_QUERY, k=3) == first.search(TRIANGLE_QUERY, k=3)

        counting.texts.clear()
        added = ("chemistry", "When balancing a chemical equation, count the atoms of each element.")
        grown = make_library([*LESSONS, added], version=2)
        third = RetrievalIndex.build(grown, counting, cache)
        assert counting.texts == [f"{added[0]}: {added[1]}"]
        assert (
            third.search("How many oxygen atoms are on each side?", k=1)[0].experience.domain == "chemistry"
        )

    counting.texts.clear()
    with EmbeddingCache(path) as reopened:
        assert reopened.count() == len(LESSONS) + 1
        again = RetrievalIndex.build(grown, counting, reopened)
        assert counting.texts == []
        assert again.search(TRIANGLE_QUERY, k=3) == third.search(TRIANGLE_QUERY, k=3)
        # Another embedder (another name) never sees these vectors.
        other = CountingEmbedder(embedder, name="another-model-0123456789ab")
        RetrievalIndex.build(library, other, reopened)
        assert len(other.texts) == len(LESSONS)


def test_cache_round_trips_vectors_and_replaces_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    rng = np.random.default_rng(3)
    vectors = {f"exp-{i:016x}": rng.standard_normal(16).astype(np.float32) for i in range(2000)}
    with EmbeddingCache(path) as cache:
        cache.put_many("m", vectors)
        got = cache.get_many("m", [*vectors, "exp-ffffffffffffffff"])
        assert got.keys() == vectors.keys()
        assert all(np.array_equal(got[k], v) for k, v in vectors.items())
        assert cache.get_many("m", list(vectors)[:3], dim=8) == {}  # wrong length counts as missing
        assert cache.get_many("other", list(vectors)) == {}
        assert cache.prune("m", list(vectors)[:10]) == 1990 and cache.count("m") == 10
    path.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    with EmbeddingCache(path) as cache:
        assert cache.count() == 0
        cache.put_many("m", {"exp-0000000000000001": np.ones(4, dtype=np.float32)})
        assert cache.count("m") == 1


# -- the approximate path, on synthetic vectors -----------------------------------------------------------

N_SYNTHETIC = 30_000
DIM = 384
# Domains and their shares of the library: a nested family, a sibling that shares its spelling
# ("alphabet"), and one large family whose filter keeps most of the library.
DOMAIN_SHARES = {"alpha": 0.04, "alpha.one": 0.08, "alphabet": 0.08, "beta.x": 0.40, "beta.y": 0.40}


def synthetic_vectors(
    n: int, n_queries: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Unit vectors shaped like sentence embeddings: shared direction + domain + topic + noise
    (variances 0.1/0.15/0.25/0.5; about 20 rows per topic). Queries are drawn the same way."""
    rng = np.random.default_rng(seed)

    def unit(m: int) -> np.ndarray:
        x = rng.standard_normal((m, DIM)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    names = list(DOMAIN_SHARES)
    shared, centers, topics = unit(1)[0], unit(len(names)), unit(n // 20)
    topic_domain = rng.choice(len(names), size=len(topics), p=list(DOMAIN_SHARES.values()))

    def draw(m: int) -> tuple[np.ndarray, list[str]]:
        t = rng.integers(0, len(topics), m)
        d = topic_domain[t]
        x = (
            np.sqrt(0.1) * shared
            + np.sqrt(0.15) * centers[d]
            + np.sqrt(0.25) * topics[t]
            + np.sqrt(0.5) * unit(m)
        )
        return x / np.linalg.norm(x, axis=1, keepdims=True), [names[i] for i in d]

    vectors, domains = draw(n)
    queries, query_domains = draw(n_queries)
    return vectors.astype(np.float32), queries.astype(np.float32), domains, query_domains


def synthetic_library(vectors: np.ndarray, domains: list[str]) -> tuple[Library, TableEmbedder]:
    experiences = [
        make_experience(d, f"When handling synthetic case {i}, apply rule {i}.")
        for i, d in enumerate(domains)
    ]
    library = Library.create(version=1, base_model="m", experiences=experiences)
    table = {embedding_text(e): v for e, v in zip(experiences, vectors, strict=True)}
    return library, TableEmbedder(table, DIM, name="synthetic")


@dataclass
class Synthetic:
    ann: RetrievalIndex
    exact: RetrievalIndex
    queries: np.ndarray
    query_domains: list[str]
    library: Library
    table: TableEmbedder


@pytest.fixture(scope="module")
def synthetic() -> Synthetic:
    vectors, queries, domains, query_domains = synthetic_vectors(N_SYNTHETIC, 200, seed=7)
    library, table = synthetic_library(vectors, domains)
    ann = RetrievalIndex.build(library, table, None, ann_threshold=20_000)
    exact = RetrievalIndex.build(library, table, None, ann_threshold=N_SYNTHETIC + 1)
    assert ann.kind == "ivf" and exact.kind == "exact"
    return Synthetic(ann, exact, queries, query_domains, library, table)


def _recall(found: list[list[Hit]], truth: list[list[Hit]]) -> float:
    total = sum(
        len({h.experience.id for h in f} & {h.experience.id for h in t})
        for f, t in zip(found, truth, strict=True)
    )
    return total / sum(len(t) for t in truth)


def test_ann_recall_at_5_against_exact_search(synthetic: Synthetic) -> None:
    ann, exact, queries = synthetic.ann, synthetic.exact, synthetic.queries
    found = [ann.search(q, k=5) for q in queries]
    truth = [exact.search(q, k=5) for q in queries]
    assert _recall(found, truth) >= 0.95
    for hits, best in zip(found, truth, strict=True):
        assert len(hits) == 5 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        exact_scores = {h.experience.id: h.score for h in best}
        for h in hits:  # approximate in which rows it visits, never in how it scores them
            if h.experience.id in exact_scores:
                assert h.score == pytest.approx(exact_scores[h.experience.id], abs=1e-5)


@pytest.mark.parametrize("prefix", ["alpha", "alpha.one", "alphabet", "beta", "beta.x"])
def test_ann_domain_filter_matches_exact_search_on_the_subset(synthetic: Synthetic, prefix: str) -> None:
    ann, exact, queries, query_domains = (
        synthetic.ann,
        synthetic.exact,
        synthetic.queries,
        synthetic.query_domains,
    )
    lo, hi = ann.domain_range(prefix)
    assert hi > lo
    # Queries from inside and outside the domain: an outside query's best matches in the domain are
    # far from it, the case where filtering after an approximate search would lose them.
    found, truth = [], []
    for q in queries[:60]:
        found.append(ann.search(q, k=5, domain=prefix))
        truth.append(exact.search(q, k=5, domain=prefix))
    for hits in found:
        assert len(hits) == 5 and all(domain_matches(h.experience.domain, prefix) for h in hits)
    if prefix == "alpha":
        assert {h.experience.domain for hits in found for h in hits} >= {"alpha", "alpha.one"}
        assert all(h.experience.domain != "alphabet" for hits in found for h in hits)
    if hi - lo <= ann.exact_subset_limit:
        assert [[h.experience.id for h in f] for f in found] == [[h.experience.id for h in t] for t in truth]
    else:  # "beta": 80% of the library, searched approximately with proportionally more probes
        assert hi - lo > ann.exact_subset_limit
        assert _recall(found, truth) >= 0.98
    assert any(d != prefix and not domain_matches(d, prefix) for d in query_domains[:60])


def test_ann_k_beyond_the_probed_lists_falls_back_to_exact(synthetic: Synthetic) -> None:
    ann, exact, queries = synthetic.ann, synthetic.exact, synthetic.queries
    hits = ann.search(queries[0], k=3000)
    assert len(hits) == 3000 and len({h.experience.id for h in hits}) == 3000
    assert [h.experience.id for h in hits[:20]] == [h.experience.id for h in exact.search(queries[0], k=20)]


def test_ann_build_is_deterministic(synthetic: Synthetic) -> None:
    ann, library, table = synthetic.ann, synthetic.library, synthetic.table
    again = RetrievalIndex.build(library, table, None, ann_threshold=20_000)
    assert again.fingerprint() == ann.fingerprint()
    other_seed = RetrievalIndex.build(library, table, None, ann_threshold=20_000, seed=99)
    assert other_seed.fingerprint() != ann.fingerprint()


# -- the retriever: swapping and pinning -------------------------------------------------------------------


def test_retriever_starts_empty_and_swaps_to_the_active_version(
    embedder: SentenceTransformerEmbedder,
) -> None:
    retriever = Retriever(embedder)
    index, root = retriever.snapshot()
    assert root == "" and len(index) == 0 and index.search(TRIANGLE_QUERY) == []
    v1 = stored(make_library(LESSONS[:5], version=1))
    snap = retriever.update(v1)
    assert snap.root == v1.root and retriever.snapshot() == snap
    assert {h.experience.id for h in snap.index.search(TRIANGLE_QUERY, k=10)} == {
        e.id for e in v1.library.experiences
    }


def test_retriever_pins_older_roots_in_an_lru(embedder: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    counting = CountingEmbedder(embedder)
    retriever = Retriever(counting, EmbeddingCache(tmp_path / "e.sqlite"), keep=2)
    versions = [stored(make_library(LESSONS[: 4 + i], version=i + 1)) for i in range(3)]
    retriever.update(versions[0])
    pinned_before = retriever.snapshot()
    retriever.update(versions[1])
    # A request that took its snapshot before the swap still answers from version 1.
    assert {h.experience.id for h in pinned_before.index.search(LOAN_QUERY, k=10)} == {
        e.id for e in versions[0].library.experiences
    }
    assert retriever.snapshot(versions[0].root).index is pinned_before.index
    assert retriever.index_for(versions[0]) is pinned_before.index  # held: nothing rebuilt
    counting.texts.clear()
    # Holding two, the third evicts the least recently used; the index being replaced was in use by
    # every request until now, so the older pinned one goes.
    retriever.update(versions[2])
    assert counting.texts == [embedding_text(make_experience(*LESSONS[5]))]  # only the new lesson
    assert retriever.roots() == [versions[1].root, versions[2].root]
    with pytest.raises(KeyError):
        retriever.snapshot(versions[0].root)
    assert len(pinned_before.index.search(LOAN_QUERY, k=10)) == 4  # a request holding it is unaffected
    counting.texts.clear()
    rebuilt = retriever.index_for(versions[0])  # rebuilt from the cache, held, not made active
    assert counting.texts == []
    assert len(rebuilt) == 4 and retriever.snapshot().root == versions[2].root
    assert retriever.roots() == [versions[2].root, versions[0].root]  # the active one is never evicted


def test_failed_update_keeps_the_previous_index(embedder: SentenceTransformerEmbedder) -> None:
    class Broken(CountingEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            raise RuntimeError("model crashed")

    retriever = Retriever(Broken(embedder))
    with pytest.raises(RuntimeError):
        retriever.update(stored(make_library(LESSONS)))
    assert retriever.snapshot().root == "" and retriever.roots() == []


def test_swapping_during_concurrent_searches(embedder: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    # Two versions with no experience in common, so every hit says which version answered.
    v1 = stored(make_library(LESSONS[:5], version=1))
    v2 = stored(make_library(LESSONS[5:], version=2))
    ids = {v.root: {e.id for e in v.library.experiences} for v in (v1, v2)}
    retriever = Retriever(embedder, EmbeddingCache(tmp_path / "e.sqlite"), keep=1)
    retriever.update(v1)
    queries = [embedder.embed([q])[0] for q in (TRIANGLE_QUERY, LOAN_QUERY)]
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[set[str]] = []
    searches = [0] * 4

    def search_loop(worker: int) -> None:
        roots: set[str] = set()
        try:
            while not stop.is_set():
                index, root = retriever.snapshot()
                i = searches[worker]
                query = TRIANGLE_QUERY if i % 10 == 0 else queries[(i + worker) % 2]
                hits = index.search(query, k=3)
                assert len(hits) == 3
                assert {h.experience.id for h in hits} <= ids[root], "hits mix versions"
                roots.add(root)
                searches[worker] += 1
        except BaseException as e:
            errors.append(e)
        seen.append(roots)

    threads = [threading.Thread(target=search_loop, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for n in range(12):  # keep=1: every swap rebuilds the index (from the cache) while searches run
        before = sum(searches)
        retriever.update(v2 if n % 2 == 0 else v1)
        deadline = time.monotonic() + 30
        while sum(searches) < before + 20 and time.monotonic() < deadline and not errors:
            time.sleep(0.001)  # let every version serve searches before the next swap
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    assert sum(searches) >= 12 * 20
    assert set().union(*seen) == {v1.root, v2.root}


# -- updates that reuse what is in memory; the approximate index added later; indexes kept on disk ------


def test_an_update_copies_the_vectors_the_held_index_has_and_embeds_only_the_rest(
    embedder: SentenceTransformerEmbedder,
) -> None:
    counting = CountingEmbedder(embedder)
    retriever = Retriever(counting)  # no cache at all: whatever is not embedded again came from memory
    v1 = stored(make_library(LESSONS[:6], version=1))
    v2 = stored(make_library(LESSONS[1:7], version=2))
    held = retriever.update(v1).index
    counting.texts.clear()
    snap = retriever.update(v2)
    new_text = embedding_text(make_experience(*LESSONS[6]))
    assert counting.texts == [new_text]
    stats = snap.index.stats
    assert (stats.reused, stats.cached, stats.embedded) == (5, 0, 1)
    # Reused rows are the held index's rows, bit for bit; the new one is what embedding it alone gives
    # (normalised once more on the way in: a float32 rounding, ~1e-9).
    for row, exp_id in enumerate(snap.index._ids):
        if exp_id in held._ids:
            assert np.array_equal(snap.index._matrix[row], held._matrix[held._ids.index(exp_id)]), exp_id
        else:
            assert np.allclose(snap.index._matrix[row], embedder.embed([new_text])[0], rtol=0, atol=1e-7)
    # A fresh build embeds the same texts in another batch (other padding, other rounding): the same
    # vectors within the embedder's measured cross-batch bound (1e-5; seen here: up to 1.7e-7).
    fresh = RetrievalIndex.build(v2.library, embedder, None)
    assert snap.index._ids == fresh._ids
    assert np.allclose(snap.index._matrix, fresh._matrix, atol=1e-5)
    for query in (TRIANGLE_QUERY, LOAN_QUERY):
        assert [h.experience.id for h in snap.index.search(query, k=4)] == [
            h.experience.id for h in fresh.search(query, k=4)
        ]


@pytest.mark.parametrize("layout", ["one run", "runs", "scattered", "none"])
def test_rows_are_copied_as_fancy_indexing_would(layout: str) -> None:
    rng = np.random.default_rng(7)
    src = rng.standard_normal((500, 4)).astype(np.float32)
    if layout == "one run":
        to, frm = np.arange(10, 400), np.arange(0, 390)
    elif layout == "runs":  # a version sharing most rows: a few inserted and dropped
        to = np.delete(np.arange(480), [3, 50, 51, 300])
        frm = np.delete(np.arange(2, 490), [7, 8, 9, 100, 200, 201, 202, 203, 450, 451, 452, 453])
    elif layout == "scattered":
        to, frm = np.sort(rng.choice(480, 300, replace=False)), rng.choice(500, 300, replace=False)
    else:
        to, frm = np.arange(0), np.arange(0)
    expected = np.zeros((480, 4), dtype=np.float32)
    expected[to] = src[frm]
    got = np.zeros((480, 4), dtype=np.float32)
    _copy_rows(got, src, to, frm)
    assert np.array_equal(got, expected)


class CountingTable(TableEmbedder):
    def __init__(self, table: dict[str, np.ndarray], dim: int, name: str = "table") -> None:
        super().__init__(table, dim, name)
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += len(texts)
        return super().embed(texts)


def test_a_large_version_serves_exactly_at_once_then_gains_its_approximate_index(
    synthetic: Synthetic, tmp_path: Path
) -> None:
    table = CountingTable(synthetic.table.table, DIM, name="synthetic")
    retriever = Retriever(table, ann_threshold=20_000, index_dir=tmp_path / "idx")
    version = stored(synthetic.library)
    snap = retriever.update(version)
    assert snap.index.kind == "exact" and snap.index.wants_ann
    queries = synthetic.queries[:40]
    exact_answers = [[h.experience.id for h in snap.index.search(q, k=5)] for q in queries]
    assert exact_answers == [[h.experience.id for h in synthetic.exact.search(q, k=5)] for q in queries]
    assert retriever.complete_ann() is True and retriever.complete_ann() is False
    upgraded = retriever.snapshot()
    assert upgraded.root == snap.root and upgraded.index.kind == "ivf" and not upgraded.index.wants_ann
    assert upgraded.index.fingerprint() == synthetic.ann.fingerprint()  # as if built in one go
    assert snap.index.kind == "exact"  # a request holding the exact snapshot keeps it, unchanged

    # A restart (a new retriever on the same directory) loads both halves: nothing embedded or trained.
    table.calls = 0
    again = Retriever(table, ann_threshold=20_000, index_dir=tmp_path / "idx")
    loaded = again.update(version).index
    assert table.calls == 0 and loaded.kind == "ivf" and loaded.stats.embedded == 0
    assert loaded.fingerprint() == synthetic.ann.fingerprint()
    for q in queries:
        assert [h.experience.id for h in loaded.search(q, k=5, domain="alpha")] == [
            h.experience.id for h in synthetic.exact.search(q, k=5, domain="alpha")
        ]


def test_saved_index_files_that_do_not_check_out_are_dropped_and_rebuilt(
    synthetic: Synthetic, tmp_path: Path
) -> None:
    small = Library.create(version=3, base_model="m", experiences=synthetic.library.experiences[:500])
    version = stored(small)
    table = CountingTable(synthetic.table.table, DIM, name="synthetic")
    Retriever(table, index_dir=tmp_path).update(version)
    where = tmp_path / version.root
    assert (where / "matrix.npy").exists() and (where / "meta.json").exists()
    assert not (where / "ann.faiss").exists()  # below the threshold: exact only

    data = bytearray((where / "matrix.npy").read_bytes())
    data[-7] ^= 0x40  # one flipped bit in a vector
    (where / "matrix.npy").write_bytes(bytes(data))
    table.calls = 0
    rebuilt = Retriever(table, index_dir=tmp_path).update(version).index
    assert table.calls == 500 and rebuilt.stats.embedded == 500  # not served from the damaged file
    assert (where / "meta.json").exists()  # and written again

    other = CountingTable(synthetic.table.table, DIM, name="another-embedder")
    assert Retriever(other, index_dir=tmp_path).update(version).index.stats.embedded == 500

    # Versions no longer held lose their files; the active one keeps them.
    retriever = Retriever(table, index_dir=tmp_path, keep=1)
    retriever.update(version)
    newer = stored(Library.create(version=4, base_model="m", experiences=synthetic.library.experiences[:600]))
    retriever.update(newer)
    assert sorted(p.name for p in tmp_path.iterdir()) == [newer.root]


def test_filtered_queries_below_the_threshold_are_exact_matrix_slices(synthetic: Synthetic) -> None:
    ann, exact = synthetic.ann, synthetic.exact
    lo, hi = ann.domain_range("alpha.one")
    assert 0 < hi - lo <= ann.exact_subset_limit
    for q in synthetic.queries[:30]:
        assert ann._search_ann(ann.embed_query(q), 5, lo, hi) is None  # the approximate index stays out
        found = ann.search(q, k=5, domain="alpha.one")
        truth = exact.search(q, k=5, domain="alpha.one")
        assert [(h.experience.id, h.score) for h in found] == [(h.experience.id, h.score) for h in truth]
