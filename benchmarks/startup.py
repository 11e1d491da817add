"""Benchmark `zoo-node start` with a large active library: seconds from launch until the node serves it.

A data directory is prepared with an active library of --size experiences (100k by default) in the
local store, and the embedding cache holding a vector for each under the bundled embedder's cache key
(synthetic unit vectors: embedding 100k texts with MiniLM would take this CPU many minutes, and the
figure is about loading what is cached, not computing it). A first start builds the retrieval index
from that cache and keeps it on disk (DATA_DIR/retrieval/); it is stopped once the approximate index is
saved. Then the node is started --repeats times, and for each start the script records when

  listening    the gRPC port is open (node.json written)
  library      the library component serves the 100k version (decoded and verified against its root)
  retrieval    the retrieval component serves that version's index
  serving      model, library and retrieval all serve

The in-run baseline is the same node started as often on an empty data directory (no library, so only
the model is waited for): what start-up costs whatever the library. The issue's goal: serving within
5 s with 100k experiences.

Run: .venv/bin/python benchmarks/startup.py [--size 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tomli_w

from zoo.devnet.process import dies_with_this_process
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.inference.embedding_cache import EmbeddingCache
from zoo.inference.retrieval import DEFAULT_ANN_THRESHOLD, cache_model_key
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.library_store import LibraryStore

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DOMAINS = ["math", "math.geometry", "math.algebra", "finance", "finance.tax", "cs", "biology", "chemistry"]
WATCHED = ("model", "library", "retrieval")


def prepare(data_dir: Path, size: int) -> None:
    experiences = [
        Experience.create(
            text=f"When handling case {i} of {DOMAINS[i % len(DOMAINS)]}, check the boundary values first.",
            domain=DOMAINS[i % len(DOMAINS)],
            confidence=0.5 + (i % 500) / 1000,
            author="job:bench",
            base_model=BASE_MODEL,
            created_at="2026-01-01T00:00:00Z",
        )
        for i in range(size)
    ]
    library = Library.create(version=1, base_model=BASE_MODEL, experiences=experiences)
    store = LibraryStore(data_dir)
    store.activate(store.put(library, cid="bafkreibenchmark"))
    embedder = SentenceTransformerEmbedder()
    rng = np.random.default_rng(0)
    cache = EmbeddingCache.in_data_dir(data_dir)
    key = cache_model_key(embedder)
    for start in range(0, size, 10_000):
        chunk = experiences[start : start + 10_000]
        vectors = rng.standard_normal((len(chunk), embedder.dim)).astype(np.float32)
        cache.put_many(key, {e.id: v for e, v in zip(chunk, vectors, strict=True)})
    cache.close()


def config(data_dir: Path) -> Path:
    cfg = {
        "data_dir": str(data_dir),
        "server": {"listen": "127.0.0.1:0", "grace_period_s": 5},
        "metrics": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
        "chain": {"mode": "off"},
        "p2p": {"enabled": False},
    }
    path = data_dir.parent / f"{data_dir.name}.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


def start_once(
    config_file: Path, data_dir: Path, watched: tuple[str, ...] = WATCHED, until_ann: bool = False
) -> dict[str, float]:
    """Launch, time each milestone until every `watched` component serves, stop (SIGTERM).

    until_ann: also wait for the approximate index to be saved."""
    from zoo.node.client import NodeClient
    from zoo.v1 import node_pb2

    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOO_NODE_")}
    log = config_file.with_suffix(".log").open("wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.node.cli", "start", "--config", str(config_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=dies_with_this_process(),
    )
    marks: dict[str, float] = {}
    try:
        node_file = data_dir / "node.json"
        while "listening" not in marks:
            if proc.poll() is not None:
                raise SystemExit(f"node exited with {proc.returncode}; see {log.name}")
            if node_file.exists():
                info = json.loads(node_file.read_text() or "{}")
                if info.get("pid") == proc.pid:
                    marks["listening"] = time.perf_counter() - t0
            time.sleep(0.01)
        serving = node_pb2.ComponentState.Value("COMPONENT_STATE_SERVING")
        with NodeClient(info["listen"]) as client:
            deadline = time.perf_counter() + 600
            while time.perf_counter() < deadline:
                states = {c.name: c.state for c in client.status().components}
                now = time.perf_counter() - t0
                for name in watched:
                    if states.get(name) == serving:
                        marks.setdefault(name, now)
                if all(n in marks for n in watched):
                    marks.setdefault("serving", now)
                    ann_files = list((data_dir / "retrieval").glob("*/ann.faiss"))
                    if not until_ann or ann_files:
                        break
                time.sleep(0.02)
            else:
                raise SystemExit(f"the node did not serve within 600 s; see {log.name}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the data directories and node logs")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="zoo-bench-startup-"))
    try:
        empty, large = scratch / "empty", scratch / "large"
        empty.mkdir()
        t = time.perf_counter()
        prepare(large, args.size)
        print(f"prepared {args.size:,} experiences in {time.perf_counter() - t:.1f} s", flush=True)
        first = start_once(config(large), large, until_ann=args.size >= DEFAULT_ANN_THRESHOLD)
        print(f"first start (builds and saves the index): serving after {first['serving']:.2f} s", flush=True)
        runs: dict[str, list[dict[str, float]]] = {"empty": [], "large": []}
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            runs["empty"].append(start_once(config(empty), empty, watched=("model",)))
            runs["large"].append(start_once(config(large), large))
        # Seconds from launch (medians); the last column is the 100k node's time after it was listening,
        # which leaves out the Python imports both nodes pay before they open a port.
        header = f"{'milestone':<12}{'empty node':>12}{f'{args.size:,} lib':>12}{'difference':>12}"
        print(f"\n{header}{'after listening':>17}")
        for mark in ("listening", "library", "retrieval", "model", "serving"):
            big = statistics.median(r[mark] for r in runs["large"])
            after = statistics.median(r[mark] - r["listening"] for r in runs["large"])
            if all(mark in r for r in runs["empty"]):
                base = statistics.median(r[mark] for r in runs["empty"])
                print(f"{mark:<12}{base:>11.2f}s{big:>11.2f}s{big - base:>+11.2f}s{after:>16.2f}s")
            else:  # an empty node has no library to serve, nor its index
                print(f"{mark:<12}{'-':>12}{big:>11.2f}s{'':>12}{after:>16.2f}s")
    finally:
        if args.keep:
            print(f"data directories and node logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
