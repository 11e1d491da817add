"""The node as `./zoo start` runs it, beside llama-cpp-python in the same machine state (issue 49's figure).

The node runs on its embedded defaults: a devnet chain (anvil and IPFS started by the node), p2p on, the
bundled GGUF on llama.cpp with the shipped `model.threads`; only its data directory and ports are this
benchmark's. It is asked over HTTP for 32 new tokens, greedy, experiences off:
  single stream: one request at a time;
  16 clients:    16 requests at once, total new tokens per second.
llama-cpp-python's own `Llama.create_chat_completion` on the same GGUF runs in a child process while the
node, its devnet and its peers keep running (the same machine state), at 1 and 2 threads (its default is
half the cores); it answers one request at a time, so its 16-client rate is its single-stream rate.
Node and Llama alternate, round by round; the ratios are against the faster Llama of the same round.

--proofs (issue 47's proof cost on the node as shipped): instead of llama-cpp-python, the same node is asked
the same requests with experiences on (as a client's request is served by default) with and without a proof
of inference (`zoo.proof`), alternating round by round, single stream and 16 clients; the ratio is tokens per
second without proofs over with.

Usage: ./zoo bench shipped_node [--rounds 3] [--runs 4] [--set model.threads=1] [--env GOMP_SPINCOUNT=0]
       ./zoo bench shipped_node --proofs [--rounds 3] [--runs 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import tomli_w

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.conftest import NodeProcess, launch  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Explain in two sentences why the sky is blue."
TOKENS = 32
CLIENTS = 16

LLAMA_RUN = """
import json, sys, time
from llama_cpp import Llama
from zoo.inference.bundled_models import bundled_gguf
threads, runs, tokens, prompt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = Llama(model_path=str(bundled_gguf()), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
            verbose=False)
messages = [{"role": "user", "content": prompt}]
def once():
    t0 = time.perf_counter()
    out = llm.create_chat_completion(messages=messages, max_tokens=tokens, temperature=0.0)
    return out["usage"]["completion_tokens"], time.perf_counter() - t0
once()  # warm: the prompt's cache, first-call costs
print(json.dumps([once() for _ in range(runs)]))
"""


def shipped_config(where: Path, overrides: dict[str, str]) -> Path:
    """The embedded defaults but for the data directory and ports (and `--set` overrides)."""
    cfg: dict = {
        "data_dir": str(where / "data"),
        "server": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
    }
    for key, raw in overrides.items():
        section, leaf = key.split(".", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        cfg.setdefault(section, {})[leaf] = value
    path = where / "node.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


_clients = threading.local()


def ask(url: str, zoo: dict | None = None) -> tuple[int, float]:
    """One request on this thread's own keep-alive client, as an OpenAI SDK client sends it (a fresh
    `httpx.post` builds a TLS context each call: ~50 ms here, more than the answer's prefill). `zoo`: the
    request's zoo extension (default: experiences off)."""
    client = getattr(_clients, "client", None)
    if client is None:
        client = _clients.client = httpx.Client(timeout=600)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "zoo": {"disable_experiences": True} if zoo is None else zoo,
    }
    t0 = time.perf_counter()
    r = client.post(url, json=body)
    r.raise_for_status()
    if zoo and zoo.get("proof") and not r.json().get("zoo", {}).get("proof"):
        raise RuntimeError("the node answered a request for a proof without one")
    return int(r.json()["usage"]["completion_tokens"]), time.perf_counter() - t0


def node_rates(url: str, runs: int, zoo: dict | None = None) -> tuple[float, float]:
    """(single-stream tok/s, 16-client tok/s), medians of `runs` single requests and one 16-client wave."""
    single = statistics.median(n / dt for n, dt in (ask(url, zoo) for _ in range(runs)))
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        done = list(pool.map(lambda _: ask(url, zoo), range(CLIENTS)))
    return single, sum(n for n, _ in done) / (time.perf_counter() - t0)


def llama_rate(threads: int, runs: int, env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LLAMA_RUN, str(threads), str(runs), str(TOKENS), PROMPT],
        capture_output=True, text=True, check=True, cwd=REPO, env=env,
    )  # fmt: skip
    return statistics.median(n / dt for n, dt in json.loads(out.stdout.strip().splitlines()[-1]))


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and every live descendant (anvil, IPFS)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        todo += children.get(p, [])
    return total


def idle_load(node: NodeProcess, seconds: float = 10.0) -> float:
    """Cores the idle node and its devnet keep busy (CPU seconds per second)."""
    before = tree_cpu_seconds(node.proc.pid)
    time.sleep(seconds)
    return (tree_cpu_seconds(node.proc.pid) - before) / seconds


def wait_serving(node: NodeProcess) -> str:
    node.wait_listening(timeout_s=300)
    node.wait_component("model", "SERVING", timeout_s=300)
    node.wait_component("library", "SERVING", timeout_s=300)  # the devnet is up and its library active
    node.wait_component("retrieval", "SERVING", timeout_s=300)  # and indexed: the start's work is done
    url = str(node.info["http"]) + "/v1/chat/completions"
    ask(url)  # warm
    return url


@contextlib.contextmanager
def shipped_node(overrides: dict[str, str], node_env: dict[str, str]) -> Iterator[tuple[NodeProcess, str]]:
    """The node on its embedded defaults in a scratch directory, serving: (its process, its chat URL)."""
    # The test helpers make OpenMP wait passively; a user's shell does not.
    os.environ.pop("OMP_WAIT_POLICY", None)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        node = launch(shipped_config(where, overrides), where / "data", env=node_env)
        try:
            yield node, wait_serving(node)
        finally:
            node.stop()


def measure(rounds: int, runs: int, overrides: dict[str, str], node_env: dict[str, str]) -> None:
    rows: list[tuple[float, float, float, float]] = []
    with shipped_node(overrides, node_env) as (node, url):
        base_env = dict(os.environ)
        print(f"   the idle node, its devnet and peers keep {idle_load(node):.2f} cores busy", flush=True)
        for r in range(rounds):
            llama = {t: llama_rate(t, runs, base_env) for t in ((1, 2) if r % 2 == 0 else (2, 1))}
            single, many = node_rates(url, runs)
            rows.append((single, many, llama[1], llama[2]))
            print(
                f"   round {r + 1}: node {single:6.1f} tok/s single, {many:6.1f} at {CLIENTS} clients; "
                f"llama-cpp-python {llama[1]:6.1f} (1 thread) {llama[2]:6.1f} (2 threads)",
                flush=True,
            )
    single, many, l1, l2 = (statistics.median(x) for x in zip(*rows, strict=True))
    best = max(l1, l2)
    shown = ", ".join(f"{k}={v}" for k, v in {**overrides, **node_env}.items()) or "none"
    print(f"   the node as ./zoo start runs it (changed: {shown}), {TOKENS} new tokens, medians of rounds:")
    print(f"     llama-cpp-python   {l1:6.1f} tok/s (1 thread)  {l2:6.1f} tok/s (2 threads)")
    print(f"     node, 1 stream     {single:6.1f} tok/s   {single / best:.2f}x the faster llama-cpp-python")
    print(
        f"     node, {CLIENTS} clients   {many:6.1f} tok/s   {many / best:.2f}x "
        "(llama-cpp-python answers one request at a time)"
    )


def measure_proofs(rounds: int, runs: int, overrides: dict[str, str], node_env: dict[str, str]) -> None:
    """Tokens per second of the shipped node with and without proofs of inference, alternating rounds."""
    plain, proving = {"proof": False}, {"proof": True}
    rows: list[tuple[float, float, float, float]] = []
    with shipped_node(overrides, node_env) as (_node, url):
        ask(url, proving)  # warm the proving path too
        for r in range(rounds):
            if r % 2 == 0:
                (s0, m0), (s1, m1) = node_rates(url, runs, plain), node_rates(url, runs, proving)
            else:
                (s1, m1), (s0, m0) = node_rates(url, runs, proving), node_rates(url, runs, plain)
            rows.append((s0, m0, s1, m1))
            print(
                f"   round {r + 1}: without proofs {s0:6.1f} tok/s single, {m0:6.1f} at {CLIENTS}; "
                f"with {s1:6.1f} single, {m1:6.1f} at {CLIENTS}",
                flush=True,
            )
    s0, m0, s1, m1 = (statistics.median(x) for x in zip(*rows, strict=True))
    print(f"   the node as ./zoo start runs it, experiences on, {TOKENS} new tokens, medians of rounds:")
    print(f"     1 stream     {s0:6.1f} tok/s without proofs, {s1:6.1f} with: cost {s0 / s1:.2f}x")
    print(f"     {CLIENTS} clients   {m0:6.1f} tok/s without proofs, {m1:6.1f} with: cost {m0 / m1:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=4, help="single-stream requests a round, each engine")
    ap.add_argument("--set", action="append", default=[], help="a node config override, KEY=VALUE")
    ap.add_argument("--env", action="append", default=[], help="an environment variable for the node")
    ap.add_argument("--proofs", action="store_true", help="the node with and without proofs of inference")
    args = ap.parse_args()
    overrides = dict(s.split("=", 1) for s in args.set)
    node_env = dict(e.split("=", 1) for e in args.env)
    (measure_proofs if args.proofs else measure)(args.rounds, args.runs, overrides, node_env)


if __name__ == "__main__":
    main()
