"""Serving benchmarks (issue 12's figures), every ratio against a baseline measured in the same run.

1. Throughput with 1, 4, 16 and 64 concurrent gRPC clients at 32 and 256 new tokens, against one
   sequential client; and single-request latency through the daemon against the in-process backend.
2. The OpenAI-compatible HTTP endpoint against gRPC, same requests alternating (latency and 16-client
   throughput).
3. A flood of concurrent Infer calls: answered, queued-then-answered and refused, peak RSS of the node,
   and whether it is healthy afterwards.
4. Structured output: share of usable TF-GRPO operations JSON from the bundled model, constrained and
   free, and the grammar's cost per generated token.
5. llama.cpp (issue 35): the llamacpp backend's single stream against llama-cpp-python's own
   `Llama.create_chat_completion` on the same GGUF and threads (and the transformers backend), alternating.
6. Launch to first answer with an empty library, and the serving node's resident memory, per backend.
7. Grammar engines for the llamacpp backend: xgrammar's token mask against llama.cpp's own grammar sampler
   (its JSON-schema-to-GBNF converter), on the same schema and the same constrained replies.
8. The node as `./zoo start` runs it (devnet, IPFS and p2p on, the shipped threads) over HTTP, single stream
   and 16 clients, beside llama-cpp-python in the same machine state (benchmarks/shipped_node.py).

Figures 1-4 run on --backend (default llamacpp, the CPU default; transformers for the earlier figures).

Usage: ./zoo bench inference [--only 1,...,8] [--backend llamacpp|transformers] [--runs 6] [--flood 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
_POLICY = os.environ.get("OMP_WAIT_POLICY")

from tests.conftest import NodeProcess, base_config, launch, write_config  # noqa: E402

# The test helpers make OpenMP threads wait passively (for torch's sake, with tests in parallel); that
# slows llama.cpp's OpenMP barriers two- to threefold, here and in the nodes this benchmark launches.
if _POLICY is None:
    os.environ.pop("OMP_WAIT_POLICY", None)
from zoo.inference.backend_protocol import GenerationRequest, ResponseFormat, generate  # noqa: E402
from zoo.inference.bundled_models import prepare_bundled_chat_model  # noqa: E402
from zoo.inference.transformers_backend import TransformersBackend  # noqa: E402
from zoo.node.client import NodeClient  # noqa: E402
from zoo.node.config import default_cache_dir  # noqa: E402
from zoo.v1 import inference_pb2 as pb  # noqa: E402

PROMPT = "Explain in two sentences why the sky is blue."
LONG_PROMPT = "Write a long story about a dragon who learns to bake bread."
THREADS = 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8", help="comma-separated figure numbers")
    ap.add_argument("--backend", choices=("llamacpp", "transformers"), default="llamacpp")
    ap.add_argument("--runs", type=int, default=6, help="alternating runs for latency ratios")
    ap.add_argument("--flood", type=int, default=200, help="concurrent requests in the flood")
    ap.add_argument("--structured-samples", type=int, default=12)
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",")}

    backend = local_backend(args.backend)
    with tempfile.TemporaryDirectory() as tmp:
        # Throughput and overhead: a queue long enough that no client is refused, so rates compare.
        roomy = {"max_batch_size": 16, "max_queued": 256, "max_wait_s": 900}
        print(f"figures 1-4 on the {args.backend} backend, {THREADS} threads")
        if only & {1, 2}:
            with (
                running_node(Path(tmp) / "roomy", roomy, args.backend) as node,
                NodeClient(node.address, timeout_s=900) as c,
            ):
                if 1 in only:
                    latency(c, backend, args.runs)
                    for tokens in (32, 256):
                        throughput(node.address, tokens)
                if 2 in only:
                    http_vs_grpc(node, c, args.runs)
        if 3 in only:  # the flood meets the default admission settings
            with (
                running_node(Path(tmp) / "defaults", {}, args.backend) as node,
                NodeClient(node.address, timeout_s=900) as c,
            ):
                flood(node, c, args.flood)
        if 4 in only:
            structured(backend, args.structured_samples)
        if 5 in only:
            llamacpp_single_stream(args.runs)
        if 6 in only:
            first_answer(Path(tmp), args.runs // 2 or 1)
        if 7 in only:
            grammar_engines(args.structured_samples)
        if 8 in only:
            from benchmarks.shipped_node import measure

            print("\n8) the node as ./zoo start runs it, beside llama-cpp-python in the same machine state")
            measure(rounds=3, runs=max(args.runs // 2, 2), overrides={}, node_env={})


def local_backend(name: str) -> Any:
    if name == "llamacpp":
        from zoo.inference.bundled_models import bundled_gguf
        from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend.load(bundled_gguf(), "local", max_batch_size=16, threads=THREADS)
    import torch

    torch.set_num_threads(THREADS)
    path = prepare_bundled_chat_model(default_cache_dir()).path
    return TransformersBackend.load(path, "local", max_batch_size=16)


@contextlib.contextmanager
def running_node(where: Path, inference: dict, backend: str) -> Iterator[NodeProcess]:
    where.mkdir()
    extra = {"model": {"threads": THREADS, "backend": backend}, "inference": inference}
    node = launch(write_config(where / "bench.toml", base_config(where / "data", extra)), where / "data")
    try:
        node.wait_listening()
        node.wait_component("model", "SERVING", timeout_s=300)
        yield node
    finally:
        node.stop()


def request(prompt: str, tokens: int) -> pb.InferRequest:
    return pb.InferRequest(
        prompt=prompt, disable_experiences=True, sampling=pb.SamplingParams(max_tokens=tokens)
    )


def _grpc_once(client: NodeClient, tokens: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = client.inference.Infer(request(PROMPT, tokens))
    return time.perf_counter() - t0, r.text


def _local_once(backend: Any, tokens: int) -> tuple[float, str]:
    req = GenerationRequest([{"role": "user", "content": PROMPT}], max_tokens=tokens)
    t0 = time.perf_counter()
    r = asyncio.run(generate(backend, req))
    return time.perf_counter() - t0, r.text


def latency(client: NodeClient, backend: Any, runs: int) -> None:
    tokens = 32
    _grpc_once(client, tokens), _local_once(backend, tokens)  # warm both
    remote, local, same = [], [], True
    for i in range(runs):
        a = _grpc_once(client, tokens) if i % 2 == 0 else None
        b = _local_once(backend, tokens)
        a = a or _grpc_once(client, tokens)
        remote.append(a[0])
        local.append(b[0])
        same = same and a[1] == b[1]
    r, lo = statistics.median(remote), statistics.median(local)
    print(
        f"\n1a) single-request latency, {runs} alternating runs, {tokens} tokens, greedy, {THREADS} threads"
    )
    print(f"   in-process backend  median {lo * 1000:8.1f} ms   (baseline)")
    print(f"   gRPC Infer          median {r * 1000:8.1f} ms   ratio {r / lo:.3f}x   (goal <= 1.15x)")
    print(f"   same text both ways: {same}")


def throughput(address: str, tokens: int) -> None:
    """Each client keeps its own channel (as a real client does) and sends its requests one after another."""
    print(f"\n1b) throughput, {tokens} new tokens per request (1 client = sequential baseline)")
    base = 0.0
    for clients in (1, 4, 16, 64):
        n = max(clients, 4 if tokens > 64 else 8)
        channels = [NodeClient(address, timeout_s=900) for _ in range(clients)]

        def one(i: int, channels: list[NodeClient] = channels) -> int:
            r = channels[i % len(channels)].inference.Infer(request(f"{LONG_PROMPT} ({i})", tokens))
            return r.usage.completion_tokens

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            generated = sum(pool.map(one, range(n)))
        dt = time.perf_counter() - t0
        for c in channels:
            c.close()
        tps = generated / dt
        base = base or tps
        label = "1 client (baseline)" if clients == 1 else f"{clients} concurrent clients"
        print(f"   {label:22s} {n:4d} requests {tps:7.1f} tok/s   ratio {tps / base:5.2f}x")


def http_vs_grpc(node: NodeProcess, client: NodeClient, runs: int) -> None:
    http_base = str(node.info.get("http") or "")
    if not http_base:
        print("\n2) the node has no HTTP API (http.enabled = false?): skipped")
        return
    model = client.status().model_id
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 32,
        "temperature": 0,
        "zoo": {"disable_experiences": True},
    }
    with httpx.Client(base_url=http_base, timeout=600) as http:

        def http_once(prompt: str = PROMPT) -> tuple[float, str]:
            t0 = time.perf_counter()
            resp = http.post(
                "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": prompt}]}
            )
            resp.raise_for_status()
            return time.perf_counter() - t0, resp.json()["choices"][0]["message"]["content"]

        http_once(), _grpc_once(client, 32)
        h, g, same = [], [], True
        for i in range(runs):
            pair = (http_once(), _grpc_once(client, 32)) if i % 2 == 0 else (None, _grpc_once(client, 32))
            a = pair[0] or http_once()
            h.append(a[0])
            g.append(pair[1][0])
            same = same and a[1] == pair[1][1]
        print(f"\n2) OpenAI HTTP vs gRPC, {runs} alternating runs, 32 tokens")
        print(f"   gRPC Infer                 median {statistics.median(g) * 1000:8.1f} ms   (baseline)")
        ratio = statistics.median(h) / statistics.median(g)
        h_ms = statistics.median(h) * 1000
        print(f"   POST /v1/chat/completions  median {h_ms:8.1f} ms   ratio {ratio:.3f}x   (goal <= 1.10x)")
        print(f"   same text both ways: {same}")

        def grpc_one(i: int) -> int:
            return client.inference.Infer(request(f"{LONG_PROMPT} ({i})", 32)).usage.completion_tokens

        def http_one(i: int) -> int:
            resp = http.post("/v1/chat/completions", json={**body, "messages": [
                {"role": "user", "content": f"{LONG_PROMPT} ({i})"}]})  # fmt: skip
            return int(resp.json()["usage"]["completion_tokens"])

        rates = {}
        for name, fn in (("gRPC", grpc_one), ("HTTP", http_one), ("gRPC ", grpc_one), ("HTTP ", http_one)):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                generated = sum(pool.map(fn, range(32)))
            rates.setdefault(name.strip(), []).append(generated / (time.perf_counter() - t0))
        g_tps, h_tps = statistics.mean(rates["gRPC"]), statistics.mean(rates["HTTP"])
        print(f"   16 clients: gRPC {g_tps:6.1f} tok/s, HTTP {h_tps:6.1f} tok/s   ratio {g_tps / h_tps:.3f}x")


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def flood(node: NodeProcess, client: NodeClient, n: int) -> None:
    before = client.status().serving
    rss_before = _rss_peak_mb(node.proc.pid)
    codes: dict[str, int] = {}
    waited: list[float] = []

    def one(i: int) -> None:
        try:
            r = client.inference.Infer(request(f"{PROMPT} ({i})", 32), timeout=600)
            waited.append(r.usage.queue_ms)
            codes["OK"] = codes.get("OK", 0) + 1
        except grpc.RpcError as e:
            codes[e.code().name] = codes.get(e.code().name, 0) + 1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    dt = time.perf_counter() - t0
    after = client.status().serving
    queued = after.queued_then_admitted - before.queued_then_admitted
    print(f"\n3) flood of {n} concurrent Infer calls (32 tokens), inference.max_batch_size "
          f"{after.max_batch_size}, max_queued {after.max_queued}: {dt:.1f} s")  # fmt: skip
    print(
        f"   answered {codes.get('OK', 0)} (of them queued first: {queued}), "
        f"refused: {', '.join(f'{k} {v}' for k, v in codes.items() if k != 'OK') or 'none'}"
    )
    if waited:
        print(
            f"   queue wait of answered: median {statistics.median(waited):.0f} ms, max {max(waited):.0f} ms"
        )
    print(f"   node peak RSS {rss_before:.0f} MB before, {_rss_peak_mb(node.proc.pid):.0f} MB after")
    healthy = client.health("") == "SERVING"
    answer = client.inference.Infer(request("Say yes.", 4)).text
    state = "SERVING" if healthy else "NOT SERVING"
    print(f"   afterwards: health {state}, a new request answered: {bool(answer)}")


def structured(backend: Any, samples: int) -> None:
    from zoo.trainer.tasks.loading import load_shipped
    from zoo.trainer.tfgrpo.critic import OperationsReply, compare_messages, finished_part, operations_schema

    tasks = load_shipped("train")[:samples]
    convos = []
    for t in tasks:
        graded = [(1.0, f"The answer is {t.answer}."), (0.0, "The answer is 0.")]
        convos.append(compare_messages(t.question, t.answer, graded, [], 3))
    schema = json.dumps(operations_schema([], 3))

    def usable(text: str) -> bool:
        try:
            OperationsReply.model_validate(json.loads(text))
            return True
        except ValueError:
            return False

    def operations_kept(text: str) -> int:
        """Finished operations the critic takes from a reply, a cut one included (critic.finished_part)."""
        whole = finished_part(text, OperationsReply)
        return len(whole.operations) if whole is not None else 0

    kept: dict[str, int] = {}

    async def run(fmt: ResponseFormat | None) -> tuple[int, float, int]:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(generate(backend, GenerationRequest(m, max_tokens=160,
                                                  response_format=fmt)) for m in convos))  # fmt: skip
        kept["free" if fmt is None else "constrained"] = sum(operations_kept(r.text) > 0 for r in results)
        return (
            sum(usable(r.text) for r in results),
            time.perf_counter() - t0,
            sum(r.completion_tokens for r in results),
        )

    # The grammar's own cost: time inside the constraint's calls, per constrained token. (Whole-run time
    # per token would mostly compare prefill shares: constrained replies are much shorter.)
    from zoo.inference import structured as st

    spent = [0.0, 0]
    original = st.JsonConstraint.mask_logits, st.JsonConstraint.accept, st.JsonConstraint.mask_array

    def timed(fn, count: bool):
        def wrapper(self, *a):
            t0 = time.perf_counter()
            try:
                return fn(self, *a)
            finally:
                spent[0] += time.perf_counter() - t0
                spent[1] += count

        return wrapper

    st.JsonConstraint.mask_logits = timed(original[0], True)
    st.JsonConstraint.accept = timed(original[1], False)
    st.JsonConstraint.mask_array = timed(original[2], True)  # the llamacpp backend's path
    free_ok, free_s, free_tokens = asyncio.run(run(None))
    con_ok, con_s, con_tokens = asyncio.run(run(ResponseFormat("json_schema", schema)))
    st.JsonConstraint.mask_logits, st.JsonConstraint.accept, st.JsonConstraint.mask_array = original
    stats = backend.scheduler.stats
    step_ms = stats.decode_seconds / max(stats.steps, 1) * 1000
    grammar_ms = spent[0] / max(spent[1], 1) * 1000
    print(f"\n4) structured output: TF-GRPO compare replies for {len(convos)} shipped tasks, greedy, batched")
    print(f"   whole operations JSON within 160 tokens: free {free_ok}/{len(convos)}, "
          f"constrained {con_ok}/{len(convos)}")  # fmt: skip
    print(f"   replies the critic takes operations from (a cut one's finished ones too): "
          f"free {kept['free']}/{len(convos)}, constrained {kept['constrained']}/{len(convos)}")  # fmt: skip
    print(f"   grammar time per constrained token {grammar_ms:.2f} ms; a decode step (whole batch) "
          f"{step_ms:.1f} ms on average in this process")  # fmt: skip
    print(
        f"   whole runs: free {free_tokens} tokens in {free_s:.1f} s, "
        f"constrained {con_tokens} in {con_s:.1f} s"
    )
    print("   example constrained reply: ", end="")
    sample = asyncio.run(generate(backend, GenerationRequest(convos[0], max_tokens=160,
                                  response_format=ResponseFormat("json_schema", schema))))  # fmt: skip
    print(sample.text[:300])


ENGINE_RUN = """
import asyncio, json, sys, time
engine, tokens, prompt, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
messages = [{"role": "user", "content": prompt}]
if engine == "llama-cpp-python":
    from llama_cpp import Llama
    from zoo.inference.bundled_models import bundled_gguf
    llm = Llama(model_path=str(bundled_gguf()), n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS,
                verbose=False)
    def once():
        out = llm.create_chat_completion(messages=messages, max_tokens=tokens, temperature=0.0)
        return out["usage"]["completion_tokens"], out["choices"][0]["message"]["content"]
else:
    sys.path.insert(0, "REPO")
    from benchmarks.inference import local_backend
    from zoo.inference.backend_protocol import GenerationRequest, generate
    backend = local_backend(engine)
    def once():
        r = asyncio.run(generate(backend, GenerationRequest(messages, max_tokens=tokens)))
        return r.completion_tokens, r.text
once()  # warm: the prompt's cache, first-call costs
out = []
for _ in range(runs):
    t0 = time.perf_counter()
    n, text = once()
    out.append((time.perf_counter() - t0, n, text))
print(json.dumps(out))
"""


def llamacpp_single_stream(runs: int) -> None:
    """The llamacpp backend against llama-cpp-python's own chat completion on the same GGUF, threads and
    prompts, greedy; the transformers backend beside them. Each engine runs in a child process of its own
    (llama.cpp's OpenMP threads of two engines in one process slow each other), in alternating order;
    both llama.cpp engines reuse the previous prompt's cache, as they do in use."""
    import subprocess

    engines = ("llama-cpp-python", "llamacpp", "transformers")
    code = ENGINE_RUN.replace("THREADS", str(THREADS)).replace("REPO", str(REPO))
    print(
        f"\n5) single stream on the bundled GGUF, greedy, {THREADS} threads, {runs} runs in 2 rounds a engine"
    )
    for tokens, prompt in ((32, PROMPT), (256, LONG_PROMPT)):
        timing: dict[str, list] = {e: [] for e in engines}
        for round_ in range(2):
            for engine in engines if round_ == 0 else tuple(reversed(engines)):
                done = subprocess.run(
                    [sys.executable, "-c", code, engine, str(tokens), prompt, str(max(runs // 2, 1))],
                    capture_output=True, text=True, check=True, cwd=REPO,
                )  # fmt: skip
                timing[engine] += json.loads(done.stdout.strip().splitlines()[-1])
        rates = {e: statistics.median(n / dt for dt, n, _ in t) for e, t in timing.items()}
        base = rates["llama-cpp-python"]
        print(f"   {tokens} new tokens ({prompt[:40]}...):")
        for engine, t in timing.items():
            ms = statistics.median(dt for dt, _, _ in t) * 1000
            label = {"llama-cpp-python": "llama-cpp-python Llama", "llamacpp": "llamacpp backend",
                     "transformers": "transformers backend"}[engine]  # fmt: skip
            rate = rates[engine]
            print(f"     {label:24s} median {ms:8.1f} ms  {rate:6.1f} tok/s  ratio {rate / base:.2f}x")
        text = {e: t[0][2] for e, t in timing.items()}
        print(f"     same text: backend = Llama {text['llamacpp'] == text['llama-cpp-python']}, "
              f"backend = transformers {text['llamacpp'] == text['transformers']}")  # fmt: skip


def first_answer(tmp: Path, runs: int) -> None:
    """Seconds from launching `zoo-node start` to the first chat answer over HTTP (empty library, no
    chain), and the node's resident memory once it has answered, per backend, alternating."""
    results: dict[str, list[tuple[float, float, float]]] = {"llamacpp": [], "transformers": []}
    for i in range(runs):
        for backend in ("llamacpp", "transformers") if i % 2 == 0 else ("transformers", "llamacpp"):
            where = tmp / f"first-{backend}-{i}"
            where.mkdir()
            extra = {"model": {"threads": THREADS, "backend": backend}}
            t0 = time.perf_counter()
            node = launch(write_config(where / "n.toml", base_config(where / "data", extra)), where / "data")
            try:
                node.wait_listening()
                url = str(node.info["http"]) + "/v1/chat/completions"
                body = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 8,
                        "messages": [{"role": "user", "content": "Say hi."}]}  # fmt: skip
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        if httpx.post(url, json=body, timeout=60).status_code == 200:
                            break
                    time.sleep(0.02)
                took = time.perf_counter() - t0
                time.sleep(2)  # what it holds once settled, not only at the answer
                rss = _rss_mb(node.proc.pid)
                results[backend].append((took, rss, _rss_peak_mb(node.proc.pid)))
            finally:
                node.stop()
    print(f"\n6) launch -> first answer, empty library, {runs} launches each (goal for llamacpp: <= 3 s)")
    for backend, rows in results.items():
        took = statistics.median(r[0] for r in rows)
        rss = statistics.median(r[1] for r in rows)
        peak = statistics.median(r[2] for r in rows)
        print(f"   {backend:12s} first answer {took:5.2f} s   resident {rss:6.0f} MB (peak {peak:.0f} MB)")


def _critic_prompts(samples: int) -> tuple[list, str]:
    from zoo.trainer.tasks.loading import load_shipped
    from zoo.trainer.tfgrpo.critic import compare_messages, operations_schema

    convos = []
    for t in load_shipped("train")[:samples]:
        graded = [(1.0, f"The answer is {t.answer}."), (0.0, "The answer is 0.")]
        convos.append(compare_messages(t.question, t.answer, graded, [], 3))
    return convos, json.dumps(operations_schema([], 3))


def _without_patterns(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_patterns(v) for k, v in node.items() if k != "pattern"}
    if isinstance(node, list):
        return [_without_patterns(v) for v in node]
    return node


def grammar_engines(samples: int) -> None:
    """Per generated token, the time to compute the allowed set and record the token: xgrammar (bitmask,
    applied to the row's logits) against llama.cpp's grammar sampler (applied to all candidates), replaying
    the same constrained replies through both. llama.cpp's JSON-schema converter cannot take the critic's
    schema as it is (its lesson `pattern`); the timing uses the schema without patterns, for both."""
    import ctypes

    import numpy as np
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from zoo.inference.bundled_models import bundled_gguf
    from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

    backend = LlamaCppBackend.load(bundled_gguf(), "local", max_batch_size=16, threads=THREADS)
    convos, critic_schema = _critic_prompts(samples)
    lib, vocab, n = backend.gguf.lib, backend.gguf.vocab, backend.gguf.n_vocab
    whole = lib.llama_sampler_init_grammar(vocab, json_schema_to_gbnf(critic_schema).encode(), b"root")
    print("\n7) grammar engines; llama.cpp takes the critic's schema as it is: "
          + ("yes" if whole else "no (its GBNF does not parse: the lesson pattern's \\s)"))  # fmt: skip
    if whole:
        lib.llama_sampler_free(whole)
    schema = json.dumps(_without_patterns(json.loads(critic_schema)))
    fmt = ResponseFormat("json_schema", schema)
    replies = asyncio.run(
        _all(backend, [GenerationRequest(m, max_tokens=160, response_format=fmt) for m in convos])
    )
    # Only whole replies, without their end token: llama.cpp's sampler aborts the process on a token its
    # grammar refuses, and a reply cut by the token limit ends where the grammar still wants more.
    sequences = [backend.gguf.tokenize(r.text) for r in replies if r.finish_reason == "stop"]
    logits = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    gbnf = json_schema_to_gbnf(schema)
    xg_s, cpp_s, steps, agree = 0.0, 0.0, 0, 0
    candidates = (lib.llama_token_data * n)()
    view = np.ctypeslib.as_array(candidates)  # id, logit, p: filled at numpy speed, outside the timing
    for seq in sequences:
        constraint = backend.constraint(fmt)
        sampler = lib.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        assert sampler, "llama.cpp could not parse the grammar"
        for token in seq:
            t0 = time.perf_counter()
            allowed_xg = np.isfinite(constraint.mask_array(logits.copy()))
            constraint.matcher.accept_token(token)
            xg_s += time.perf_counter() - t0
            view["id"], view["logit"], view["p"] = np.arange(n), logits, 0.0
            t0 = time.perf_counter()
            array = lib.llama_token_data_array(candidates, n, -1, False)
            lib.llama_sampler_apply(sampler, ctypes.byref(array))
            lib.llama_sampler_accept(sampler, token)
            cpp_s += time.perf_counter() - t0
            allowed_cpp = np.zeros(n, dtype=bool)
            kept = view[: array.size]
            allowed_cpp[kept["id"][np.isfinite(kept["logit"])]] = True
            agree += int(np.array_equal(allowed_xg, allowed_cpp))
            steps += 1
        lib.llama_sampler_free(sampler)
    print(f"   on the schema without patterns: {len(sequences)} whole replies, {steps} tokens replayed")
    print(f"   xgrammar mask + accept      {xg_s / steps * 1000:7.3f} ms a token")
    print(f"   llama.cpp grammar sampler   {cpp_s / steps * 1000:7.3f} ms a token  ({cpp_s / xg_s:.0f}x)")
    print(f"   steps where both allow exactly the same tokens: {agree}/{steps}")


async def _all(backend: Any, requests: list[GenerationRequest]) -> list:
    return list(await asyncio.gather(*(generate(backend, r) for r in requests)))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    main()
