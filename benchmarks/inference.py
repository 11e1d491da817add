"""Inference benchmarks (issue figures 1 and 3), ratios against baselines measured in the same run.

1. Daemon overhead: Infer latency through gRPC against calling the same backend in-process with the same
   prompt, model, thread count and greedy decoding. Runs alternate so machine noise hits both alike.
2. Throughput with 1, 4 and 16 concurrent clients (requests/s, tokens/s) against sequential requests.

Usage: .venv/bin/python benchmarks/inference.py [--runs 8] [--max-tokens 32] [--requests 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import base_config, launch, write_config  # noqa: E402
from zoo.inference.backend import GenerationRequest, generate  # noqa: E402
from zoo.inference.models import prepare_bundled_chat_model  # noqa: E402
from zoo.inference.transformers_backend import TransformersBackend  # noqa: E402
from zoo.node.client import NodeClient  # noqa: E402
from zoo.node.config import default_cache_dir  # noqa: E402
from zoo.v1 import inference_pb2 as pb  # noqa: E402

PROMPT = "Explain in two sentences why the sky is blue."
THREADS = 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=16, help="requests per throughput level")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(THREADS)
    path = prepare_bundled_chat_model(default_cache_dir()).path
    backend = TransformersBackend.load(path, "local")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        extra = {"model": {"threads": THREADS}, "inference": {"concurrency": 16, "max_queue": 64}}
        node = launch(write_config(Path(tmp) / "bench.toml", base_config(data_dir, extra)), data_dir)
        try:
            node.wait_listening()
            node.wait_component("model", "SERVING", timeout_s=300)
            with NodeClient(node.address, timeout_s=600) as client:
                overhead(client, backend, args.runs, args.max_tokens)
                throughput(node.address, args.requests, args.max_tokens)
        finally:
            node.stop()


def _grpc_once(client: NodeClient, max_tokens: int) -> tuple[float, str, int]:
    req = pb.InferRequest(
        prompt=PROMPT, disable_experiences=True, sampling=pb.SamplingParams(max_tokens=max_tokens)
    )
    t0 = time.perf_counter()
    r = client.inference.Infer(req)
    return time.perf_counter() - t0, r.text, r.usage.completion_tokens


def _local_once(backend: TransformersBackend, max_tokens: int) -> tuple[float, str, int]:
    req = GenerationRequest([{"role": "user", "content": PROMPT}], max_tokens=max_tokens)
    t0 = time.perf_counter()
    r = asyncio.run(generate(backend, req))
    return time.perf_counter() - t0, r.text, r.completion_tokens


def overhead(client: NodeClient, backend: TransformersBackend, runs: int, max_tokens: int) -> None:
    _grpc_once(client, max_tokens), _local_once(backend, max_tokens)  # warm both
    remote, local = [], []
    for i in range(runs):
        order = (_grpc_once, _local_once) if i % 2 == 0 else (_local_once, _grpc_once)
        for fn in order:
            dt, text, _tokens = fn(client, max_tokens) if fn is _grpc_once else fn(backend, max_tokens)
            (remote if fn is _grpc_once else local).append(dt)
    r, lo = statistics.median(remote), statistics.median(local)
    print(
        f"\n1) daemon overhead, {runs} alternating runs, {max_tokens} tokens, greedy, {THREADS} threads each"
    )
    print(f"   in-process backend  median {lo * 1000:8.1f} ms   (baseline)")
    print(f"   gRPC Infer          median {r * 1000:8.1f} ms   ratio {r / lo:.3f}x   (goal <= 1.10x)")
    print(f"   same text both ways: {text == _local_once(backend, max_tokens)[1]}")


def throughput(address: str, requests: int, max_tokens: int) -> None:
    def one(i: int) -> int:
        with NodeClient(address, timeout_s=600) as c:
            req = pb.InferRequest(prompt=f"{PROMPT} ({i})", disable_experiences=True,
                                  sampling=pb.SamplingParams(max_tokens=max_tokens))  # fmt: skip
            return c.inference.Infer(req).usage.completion_tokens

    print(f"\n3) throughput, {requests} requests of up to {max_tokens} tokens per level")
    base_rps = 0.0
    for clients in (1, 4, 16):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            tokens = sum(pool.map(one, range(requests)))
        dt = time.perf_counter() - t0
        rps, tps = requests / dt, tokens / dt
        base_rps = base_rps or rps
        label = "sequential (baseline)" if clients == 1 else f"{clients} concurrent clients"
        print(f"   {label:24s} {rps:6.2f} req/s  {tps:7.1f} tok/s  ratio {rps / base_rps:.2f}x")


if __name__ == "__main__":
    main()
