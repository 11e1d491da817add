"""Benchmark experience retrieval: search latency (p50/p99) and recall@5 at 1k, 10k and 100k experiences.

The index is fed synthetic 384-dim unit vectors shaped like sentence embeddings (a shared direction, a
domain, a topic of about 20 rows and noise, with variances 0.1/0.15/0.25/0.5), so 100k experiences need
no hours of embedding; queries are drawn the same way. Exact search (numpy matmul) is the in-run
baseline: recall is measured against it and its latency is printed beside the node's default index
(exact below inference.ann_threshold = 20,000, faiss IVF above) and the IVF index forced at every size,
with ratios. The end-to-end time of a text query, embedding it with the real bundled MiniLM included, is
reported separately, as is the cost of a library build with the real embedder, cold and cache-warm.
The issue's goal: p50 <= 2 ms and recall@5 >= 0.95 at 100k.

Run: .venv/bin/python benchmarks/retrieval.py [--sizes 1000,10000,100000] [--queries 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.inference.retrieval import DEFAULT_ANN_THRESHOLD, Hit, RetrievalIndex
from zoo.registry.experience import Experience
from zoo.registry.library import Library

DIM = 384
K = 5
DOMAINS = ["math", "math.geometry", "math.algebra", "finance", "finance.tax", "cs", "biology", "chemistry"]


class VectorOnlyEmbedder:
    """Stands in for the model on the synthetic indexes: queries are given as vectors, never text."""

    name = "synthetic"
    dim = DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("the synthetic indexes are searched with vectors only")


def synthetic(n: int, n_queries: int, seed: int) -> tuple[np.ndarray, list[str], np.ndarray]:
    rng = np.random.default_rng(seed)

    def unit(m: int) -> np.ndarray:
        x = rng.standard_normal((m, DIM)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    shared, centers, topics = unit(1)[0], unit(len(DOMAINS)), unit(max(1, n // 20))
    topic_domain = rng.integers(0, len(DOMAINS), len(topics))

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        t = rng.integers(0, len(topics), m)
        x = np.sqrt(0.1) * shared + np.sqrt(0.15) * centers[topic_domain[t]]
        x = x + np.sqrt(0.25) * topics[t] + np.sqrt(0.5) * unit(m)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), topic_domain[t]

    vectors, domains = draw(n)
    queries, _ = draw(n_queries)
    return vectors, [DOMAINS[d] for d in domains], queries


def experiences_for(
    domains: list[str],
    text: str = "When benchmarking case {i}, apply rule {i}.",
    created_at: str = "2026-01-01T00:00:00Z",
) -> list[Experience]:
    """One lesson per domain given, its text the template filled with its position."""
    return [
        Experience.create(
            text=text.format(i=i, domain=d),
            domain=d,
            confidence=0.5,
            author="job:bench",
            base_model="bench",
            created_at=created_at,
        )
        for i, d in enumerate(domains)
    ]


def timed(fn: Callable[[Any], Any], queries: Sequence[Any]) -> tuple[list[float], list[Any]]:
    out, lat = [], []
    for q in queries:
        start = time.perf_counter()
        out.append(fn(q))
        lat.append(time.perf_counter() - start)
    return lat, out


def p50_p99(lat: list[float]) -> tuple[float, float]:
    ordered = sorted(lat)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000


def recall(found: list[list[Hit]], truth: list[list[Hit]]) -> float:
    hit = total = 0
    for f, t in zip(found, truth, strict=True):
        want = {h.experience.id for h in t}
        hit += len(want & {h.experience.id for h in f})
        total += len(want)
    return hit / total if total else 1.0


def bench_size(n: int, n_queries: int, seed: int) -> None:
    vectors, domains, queries = synthetic(n, n_queries, seed)
    experiences = experiences_for(domains)
    embedder = VectorOnlyEmbedder()
    # The node's default is exact below the ANN threshold and IVF above it; the other of the two is
    # built too where it differs, so every size shows both against the exact baseline.
    thresholds = {"exact": n + 1, "default": DEFAULT_ANN_THRESHOLD}
    if n < DEFAULT_ANN_THRESHOLD:
        thresholds = {"exact": n + 1, "ivf (forced)": 1}
    builds: dict[str, tuple[RetrievalIndex, float]] = {}
    for label, threshold in thresholds.items():
        start = time.perf_counter()
        index = RetrievalIndex(experiences, vectors, embedder, ann_threshold=threshold)
        builds[label] = (index, time.perf_counter() - start)
    exact = builds["exact"][0]
    truth_lat, truth = timed(lambda q: exact.search(q, k=K), queries)
    e50, e99 = p50_p99(truth_lat)
    print(f"\n{n:,} experiences, {len(queries)} queries, k={K}")
    print(f"  {'index':<22}{'build s':>9}{'p50 ms':>9}{'p99 ms':>9}{'recall@5':>10}{'p50 vs exact':>14}")
    print(
        f"  {'exact (baseline)':<22}{builds['exact'][1]:>9.2f}{e50:>9.3f}{e99:>9.3f}{1.0:>10.4f}{1.0:>13.2f}x"
    )
    for label, (index, seconds) in builds.items():
        if label == "exact":
            continue
        lat, found = timed(lambda q, index=index: index.search(q, k=K), queries)
        p50, p99 = p50_p99(lat)
        name = f"{label} ({index.kind})"
        got = recall(found, truth)
        print(f"  {name:<22}{seconds:>9.2f}{p50:>9.3f}{p99:>9.3f}{got:>10.4f}{p50 / e50:>13.2f}x")
    ann = builds["default" if "default" in builds else "ivf (forced)"][0]
    for prefix in ("math", "finance.tax"):
        lo, hi = ann.domain_range(prefix)
        sub = queries[: max(50, len(queries) // 4)]
        t_lat, t_found = timed(lambda q, p=prefix: exact.search(q, k=K, domain=p), sub)
        lat, found = timed(lambda q, p=prefix: ann.search(q, k=K, domain=p), sub)
        p50, p99 = p50_p99(lat)
        print(
            f"  filter {prefix!r} ({hi - lo:,} rows, {ann.kind}): p50 {p50:.3f} ms  p99 {p99:.3f} ms  "
            f"recall@5 {recall(found, t_found):.4f}  (exact p50 {p50_p99(t_lat)[0]:.3f} ms)"
        )


def bench_end_to_end(n_queries: int, seed: int) -> None:
    print("\nreal embedder (bundled all-MiniLM-L6-v2, CPU)")
    start = time.perf_counter()
    embedder = SentenceTransformerEmbedder()
    print(f"  load {time.perf_counter() - start:.1f} s ({embedder.name})")
    texts = [f"How do I solve problem number {i} about triangles and their areas?" for i in range(n_queries)]
    embedder.embed(texts[:4])  # warm-up
    embed_lat = []
    for t in texts:
        start = time.perf_counter()
        embedder.embed([t])
        embed_lat.append(time.perf_counter() - start)
    p50, p99 = p50_p99(embed_lat)
    print(f"  query embedding: p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    vectors, domains, _ = synthetic(100_000, 1, seed)
    experiences = experiences_for(domains)
    index = RetrievalIndex(experiences, vectors, embedder)  # the real embedder embeds the text queries
    lat, _ = timed(lambda q: index.search(q, k=K), texts)
    p50, p99 = p50_p99(lat)
    print(f"  end to end (embed + search, 100k {index.kind} index): p50 {p50:.2f} ms  p99 {p99:.2f} ms")

    text = "When solving exercise family {i} in {domain}, write down the known quantities first."
    lessons = experiences_for(DOMAINS * 125, text, created_at="2025-01-01T00:00:00Z")
    library = Library.create(version=1, base_model="bench", experiences=lessons)
    with tempfile.TemporaryDirectory() as tmp, EmbeddingCache(Path(tmp) / "embeddings.sqlite") as cache:
        start = time.perf_counter()
        cold = RetrievalIndex.build(library, embedder, cache)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        warm = RetrievalIndex.build(library, embedder, cache)
        warm_s = time.perf_counter() - start
    print(
        f"  library build, {len(lessons)} lessons: cold {cold_s:.2f} s ({cold.stats.embedded} embedded, "
        f"{cold.stats.embedded / cold_s:.0f}/s), cache-warm {warm_s * 1000:.0f} ms "
        f"({warm.stats.embedded} embedded)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="library sizes, comma-separated")
    parser.add_argument("--queries", type=int, default=1000, help="queries timed per index")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-embedder", action="store_true", help="only the synthetic-vector part")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"retrieval benchmark: {os.cpu_count()} CPUs, load average {load:.2f} (other work inflates times)")
    for n in (int(s) for s in args.sizes.split(",")):
        bench_size(n, args.queries, args.seed)
    if not args.skip_embedder:
        bench_end_to_end(min(args.queries, 200), args.seed)


if __name__ == "__main__":
    main()
