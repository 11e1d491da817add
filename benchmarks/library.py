"""Benchmark the experience library at 1k, 10k and 100k experiences: canonical encoding, Merkle build,
inclusion proofs, IPFS publish/fetch and the sync latency from an executed approval to activation.

Every figure has a baseline measured in the same run on the same bytes, and the ratio against it:

  encode library       encode_library(lib)                      vs sha256 of the encoded bytes
  decode library       decode_library(bytes) (full validation)  vs json.loads of the same bytes, as a
                                                                caller would run it (the issue's floor),
                                                                and with the collector paused, as
                                                                decode runs (the stricter floor)
  decode, reusing      decode_library_leaves(next, known=...)   vs json.loads of the same bytes
                       as a sync does it: the next version
                       changes --changed of the experiences
  Merkle root          library_root(lib): leaf encoding + tree  vs sha256 of the leaves' bytes (one pass)
  Merkle tree          MerkleTree.from_leaves(leaves)           vs sha256 of the leaves' bytes (one pass)
  proof generate       tree.prove(i), mean of --proofs indices  vs sha256 of the leaf's bytes
  proof verify         verify_inclusion(leaf, proof, root)      vs sha256 of the leaf's bytes
  publish              IpfsClient.add(library bytes), new       vs add of as many fresh random bytes
                       content each sample (nothing deduped)
  fetch                IpfsClient.fetch_verified(cid)           vs cat of those random bytes
  sync, all new        LibrarySyncer.sync_once() right after    vs cat of those random bytes
                       the execute transaction is mined; every
                       experience differs from the active ones
  sync, --changed new  the same for a next version changing     vs cat of those random bytes
                       that share of the experiences
  executed -> serving  sync of a next version with --serving-changed new experiences, then its retrieval
                       index made active as the node does (unchanged vectors copied from the active
                       index, the new ones embedded by the bundled MiniLM); vs cat of random bytes
  sync peak RSS        the process's peak resident memory during the all-new sync (the peak is reset just
                       before it, /proc/self/clear_refs), against the canonical bytes

IPFS is the js-ipfs daemon (zoo.devnet.ipfs_daemon.IpfsDaemon) of a devnet brought up in a temporary
directory, which also provides the chain for the sync figure: each size is published, proposed, voted on by
three dev accounts, and executed, and the clock starts when the execute receipt is back (the LibraryUpdated
event is in a mined block). Sync is measured for sizes whose estimate (from the previous size) stays under
--sync-limit seconds. Figures are medians over repeats (5 for 1k, 3 for 10k, 1 for 100k); the repeats of
publish and sync use that many distinct libraries, each approved as the next version of the one before. The
syncer's IPFS daemon already holds the content (one local daemon), so sync excludes network transfer.

Run: .venv/bin/python benchmarks/library.py [--sizes 1000,10000,100000] [--proofs 1000] [--sync-limit 60]
                                           [--changed 0.01] [--serving-changed 10]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.devnet.dev_dao import DevDao
from zoo.devnet.manager import Devnet
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.inference.retrieval import cache_model_key
from zoo.inference.retriever import Retriever
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.experience import Experience
from zoo.registry.ipfs import IpfsClient
from zoo.registry.library import Library
from zoo.registry.library_store import LibraryStore
from zoo.registry.merkle import (
    MerkleTree,
    decode_library_leaves,
    leaf_hashes,
    library_leaves,
    library_root,
    verify_inclusion,
)
from zoo.registry.sync import LibrarySyncer

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CREATED = "2026-01-01T00:00:00Z"


@dataclass
class Row:
    size: int
    operation: str
    seconds: float
    baseline: str
    baseline_seconds: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.baseline_seconds if self.baseline_seconds else float("inf")


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def mean_time(fn: Callable[[int], Any], indices: list[int]) -> float:
    t0 = time.perf_counter()
    for i in indices:
        fn(i)
    return (time.perf_counter() - t0) / len(indices)


def json_loads_gc_paused(data: bytes) -> Any:
    gc.disable()
    try:
        return json.loads(data)
    finally:
        gc.enable()


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux 4.0+); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_kib(field: str) -> int:
    """VmRSS or VmHWM (peak) of this process from /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def next_version(lib: Library, share: float, variant: int) -> Library:
    """lib's successor with `share` of its experiences replaced by new ones (the rest kept as they are)."""
    n = len(lib.experiences)
    changed = max(1, round(n * share))
    replaced = set(random.Random(variant).sample(range(n), changed))
    kept = [e for i, e in enumerate(lib.experiences) if i not in replaced]
    new = [
        Experience.create(
            text=f"When handling revised case {variant}-{i}, check the boundary values first.",
            domain="bench.case",
            confidence=0.75,
            author="job:bench",
            base_model=BASE_MODEL,
            created_at=CREATED,
        )
        for i in range(changed)
    ]
    return Library.create(
        version=lib.version + 1,
        parent_root="0x" + library_root(lib).hex(),
        base_model=BASE_MODEL,
        description=lib.description,
        experiences=[*kept, *new],
    )


def experiences(n: int, variant: int = 0) -> list[Experience]:
    """n valid experiences; each variant has other confidences, so its bytes differ in every chunk."""
    return [
        Experience.create(
            text=f"When handling case {i}, check the boundary values first.",
            domain="bench.case",
            confidence=0.5 + ((i + 7 * variant) % 500) / 1000,
            author="job:bench",
            base_model=BASE_MODEL,
            created_at=CREATED,
        )
        for i in range(n)
    ]


def bench_size(
    n: int,
    args: argparse.Namespace,
    ipfs: IpfsClient,
    dao: DevDao,
    syncer: LibrarySyncer,
    do_sync: bool,
    retriever: Retriever | None,
) -> tuple[list[Row], dict[str, float]]:
    repeats = 5 if n <= 1_000 else 3 if n <= 10_000 else 1
    rows: list[Row] = []
    extra: dict[str, float] = {}

    # `repeats` libraries, each the next version of the one before (as the sync figure approves them).
    current = dao.proposer.current()
    parent, libs = "0x" + current.root.hex(), []
    t0 = time.perf_counter()
    for k in range(repeats):
        lib = Library.create(
            version=current.version + 1 + k,
            parent_root=parent,
            base_model=BASE_MODEL,
            description=f"benchmark library of {n} experiences",
            experiences=experiences(n, variant=k),
        )
        libs.append(lib)
        parent = "0x" + library_root(lib).hex()
    extra["generate"] = (time.perf_counter() - t0) / repeats
    lib = libs[0]
    data = encode_library(lib)
    leaves = library_leaves(lib)
    joined = b"".join(leaves)
    extra["bytes"] = len(data)
    sha_data = median_time(lambda: hashlib.sha256(data).digest(), repeats)

    rows.append(Row(n, "encode library", median_time(lambda: encode_library(lib), repeats),
                    "sha256(bytes)", sha_data))  # fmt: skip
    decode = median_time(lambda: decode_library(data), repeats)
    loads = median_time(lambda: json.loads(data), repeats)
    rows.append(Row(n, "decode library", decode, "json.loads(bytes)", loads))
    rows.append(Row(n, "decode library", decode, "json.loads, gc paused",
                    median_time(lambda: json_loads_gc_paused(data), repeats)))  # fmt: skip
    successor = next_version(lib, args.changed, variant=n)
    successor_data = encode_library(successor)
    # As the sync does it: experiences the active version holds are found by leaf hash and reused.
    known = dict(zip(leaf_hashes(leaves), lib.experiences, strict=True))
    rows.append(Row(n, f"decode, {args.changed:.0%} new, reuse",
                    median_time(lambda: decode_library_leaves(successor_data, known=known), repeats),
                    "json.loads(bytes)", loads))  # fmt: skip
    merkle_repeats = max(repeats, 5)  # cheap enough for a median of five even at 100k
    sha_leaves = median_time(lambda: hashlib.sha256(joined).digest(), merkle_repeats)
    rows.append(Row(n, "Merkle root (encode+tree)", median_time(lambda: library_root(lib), merkle_repeats),
                    "sha256(leaves)", sha_leaves))  # fmt: skip
    rows.append(Row(n, "Merkle tree (from leaves)",
                    median_time(lambda: MerkleTree.from_leaves(leaves), merkle_repeats),
                    "sha256(leaves)", sha_leaves))  # fmt: skip

    tree = MerkleTree.from_leaves(leaves)
    root = tree.root
    assert root == library_root(lib)
    rng = random.Random(n)
    indices = [rng.randrange(n) for _ in range(args.proofs)]
    proofs = {i: tree.prove(i) for i in set(indices)}
    sha_leaf = mean_time(lambda i: hashlib.sha256(leaves[i]).digest(), indices)
    rows.append(Row(n, "proof generate (mean)", mean_time(tree.prove, indices), "sha256(leaf)", sha_leaf))
    assert all(verify_inclusion(leaves[i], proofs[i], root) for i in indices)
    rows.append(
        Row(
            n,
            "proof verify (mean)",
            mean_time(lambda i: verify_inclusion(leaves[i], proofs[i], root), indices),
            "sha256(leaf)",
            sha_leaf,
        )
    )

    # Publish: every sample adds content the daemon has never seen (no block is deduplicated), the
    # library variants against as many fresh random bytes, interleaved so both see the same load.
    publish, raw_add, cids, raw_cid = [], [], [], ""
    for variant in libs:
        content = encode_library(variant)
        raw = os.urandom(len(content))
        t0 = time.perf_counter()
        raw_cid = ipfs.add(raw)
        raw_add.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cids.append(ipfs.add(content))
        publish.append(time.perf_counter() - t0)
    rows.append(Row(n, "publish (add)", statistics.median(publish), "add random bytes",
                    statistics.median(raw_add)))  # fmt: skip
    assert ipfs.fetch_verified(cids[0]) == data
    raw_cat = median_time(lambda: ipfs.cat(raw_cid), repeats)
    rows.append(Row(n, "fetch (fetch_verified)", median_time(lambda: ipfs.fetch_verified(cids[0]), repeats),
                    "cat random bytes", raw_cat))  # fmt: skip

    if do_sync:
        samples, peaks = [], []
        for variant, cid in zip(libs, cids, strict=True):
            variant_root = library_root(variant)
            proposal = dao.propose_and_pass(variant_root, cid, tree_size=len(variant.experiences))
            dao.execute(proposal)  # returns once the receipt (with the LibraryUpdated log) is back
            rss_before, resettable = rss_kib("VmRSS"), reset_peak_rss()
            t0 = time.perf_counter()
            result = syncer.sync_once()
            samples.append(time.perf_counter() - t0)
            if resettable:
                peaks.append((rss_kib("VmHWM") - rss_before) * 1024)
            assert result.activated is not None and result.activated.root == "0x" + variant_root.hex()
            assert result.activated.version == variant.version
        rows.append(Row(n, "sync, all new", statistics.median(samples), "cat random bytes",
                        raw_cat))  # fmt: skip
        if peaks:
            extra["sync_peak_rss"] = max(peaks)
        # Next versions changing --changed of the experiences, each approved after the one before.
        samples, base = [], result.activated.library
        for k in range(repeats):
            successor = next_version(base, args.changed, variant=1000 * n + k)
            cid = ipfs.add(encode_library(successor))
            dao.approve(library_root(successor), cid, tree_size=len(successor.experiences))
            t0 = time.perf_counter()
            result = syncer.sync_once()
            samples.append(time.perf_counter() - t0)
            assert result.activated is not None and result.activated.version == successor.version
            base = result.activated.library
        rows.append(Row(n, f"sync, {args.changed:.0%} new", statistics.median(samples), "cat random bytes",
                        raw_cat))  # fmt: skip
        if retriever is not None:
            rows.append(serving_row(n, base, retriever, ipfs, dao, syncer, args, raw_cat, extra))
    return rows, extra


def serving_row(
    n: int,
    base: Library,
    retriever: Retriever,
    ipfs: IpfsClient,
    dao: DevDao,
    syncer: LibrarySyncer,
    args: argparse.Namespace,
    raw_cat: float,
    extra: dict[str, float],
) -> Row:
    """Executed -> serving, as the node does it: sync, then the retrieval index of the new version made
    active (vectors of unchanged experiences copied from the active index, new ones embedded by the real
    MiniLM). The active index of `base` is set up first from synthetic vectors put in the cache."""
    active = syncer.store.current()
    assert active is not None and active.library.version == base.version
    rng = np.random.default_rng(n)
    key = cache_model_key(retriever.embedder)
    vectors = rng.standard_normal((len(base.experiences), retriever.embedder.dim)).astype(np.float32)
    assert retriever.cache is not None
    retriever.cache.put_many(key, {e.id: v for e, v in zip(base.experiences, vectors, strict=True)})
    retriever.update(active)
    successor = next_version(base, args.serving_changed / n, variant=7 * n)
    cid = ipfs.add(encode_library(successor))
    dao.approve(library_root(successor), cid, tree_size=len(successor.experiences))
    t0 = time.perf_counter()
    result = syncer.sync_once()
    assert result.activated is not None
    snapshot = retriever.update(result.activated)
    seconds = time.perf_counter() - t0
    assert snapshot.root == result.activated.root and snapshot.index.stats.embedded == args.serving_changed
    t0 = time.perf_counter()
    if retriever.complete_ann():
        extra["ann_seconds"] = time.perf_counter() - t0
    return Row(n, f"executed -> serving, {args.serving_changed} new", seconds, "cat random bytes", raw_cat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated experience counts")
    parser.add_argument("--proofs", type=int, default=1000, help="random indices for the proof figures")
    parser.add_argument("--sync-limit", type=float, default=60.0, help="skip sync when estimated above (s)")
    parser.add_argument("--changed", type=float, default=0.01, help="share a next version changes")
    parser.add_argument("--serving-changed", type=int, default=10,
                        help="new experiences in the executed -> serving figure (0: skip it)")  # fmt: skip
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())

    scratch = Path(tempfile.mkdtemp(prefix="zoo-bench-library-"))
    devnet = Devnet(scratch / "data")
    try:
        info, _ = devnet.up(die_with_parent=True)
        ipfs = IpfsClient(info.ipfs_api, timeout=300)
        dao = DevDao.of(info)
        syncer = LibrarySyncer(dao.proposer, ipfs, LibraryStore(scratch / "node"), fetch_timeout_s=300)
        syncer.sync_once()  # the genesis version, so each size's sync is one new version
        retriever = None
        if args.serving_changed:
            cache = EmbeddingCache(scratch / "embeddings.sqlite")
            retriever = Retriever(SentenceTransformerEmbedder(), cache, keep=1)
        versions = f"python {platform.python_version()}, js-ipfs {ipfs.version()['Version']}"
        print(f"{versions}, {os.cpu_count()} CPUs")

        rows: list[Row] = []
        last_sync: tuple[int, float] | None = None
        for n in sizes:
            estimate = last_sync[1] * n / last_sync[0] if last_sync else 0.0
            do_sync = estimate <= args.sync_limit
            size_rows, extra = bench_size(n, args, ipfs, dao, syncer, do_sync, retriever)
            rows += size_rows
            sync = [r for r in size_rows if r.operation.startswith("sync")]
            if sync:
                last_sync = (n, sync[0].seconds)
            note = "" if do_sync else f"; sync skipped (estimated {estimate:.0f} s > {args.sync_limit:.0f} s)"
            if "ann_seconds" in extra:
                note += f"; approximate index trained {extra['ann_seconds']:.1f} s after serving"
            peak = extra.get("sync_peak_rss")
            if peak is not None:
                note += (f"; peak RSS during the all-new sync +{peak / 1e6:.0f} MB "
                         f"({peak / extra['bytes']:.1f}x the canonical bytes)")  # fmt: skip
            print(
                f"{n:>7} experiences: {extra['bytes'] / 1e6:.2f} MB canonical, "
                f"generated in {fmt(extra['generate'])} per library{note}",
                flush=True,
            )

        print()
        header = f"{'size':>7}  {'operation':<27}{'time':>11}  {'baseline':<22}{'baseline':>11}{'ratio':>9}"
        print(header)
        print("-" * len(header))
        for r in rows:
            print(
                f"{r.size:>7}  {r.operation:<27}{fmt(r.seconds):>11}  {r.baseline:<22}"
                f"{fmt(r.baseline_seconds):>11}{r.ratio:>9.1f}"
            )
        ipfs.close()
    finally:
        devnet.down()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
