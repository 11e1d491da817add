"""Benchmark priority for credit holders: a holder's latency while 200 anonymous requests flood the node.

A node is started on its own devnet (bundled model, a batch of --batch, short answers). A client account
is given credits the way the ledger gives them (zoo.devnet.dev_ledger: a reporting node posts a usage
report crediting it, the challenge window passes, it claims with its proof). Then, with one short
request:

  idle            the holder's signed requests, one after another, on an idle node (its baseline)
  flood, holder   the same while --flood anonymous requests are outstanding (each answered one is
                  replaced at once, so the backlog stays full)
  flood, unsigned the same client sending unsigned requests during a second flood: an anonymous
                  request's latency under the flood, and what priority saves

The issue's goal: the holder's p50 under the flood at most 2x its idle p50.

Run: .venv/bin/python benchmarks/credits_flood.py [--flood 200] [--requests 8] [--batch 4]
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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import tomli_w
from eth_account import Account

from zoo.devnet.dev_ledger import give_credits
from zoo.devnet.manager import Devnet
from zoo.devnet.process import dies_with_this_process
from zoo.node.client import NodeClient
from zoo.v1 import inference_pb2 as pb
from zoo.v1 import node_pb2

HOLDER = Account.from_key("0x" + "5a" * 32)
PROMPT = "Name one prime number."


def start_node(data_dir: Path, batch: int, flood: int) -> tuple[subprocess.Popen[bytes], dict]:
    cfg = {
        "data_dir": str(data_dir),
        "server": {"listen": "127.0.0.1:0", "grace_period_s": 2, "max_concurrent_rpcs": 4 * flood},
        "metrics": {"listen": "127.0.0.1:0"},
        "http": {"enabled": False},
        "p2p": {"enabled": False},
        "chain": {"mode": "devnet", "poll_interval_s": 0.5},
        "inference": {
            "max_batch_size": batch,
            "max_queued": flood + 8,
            "max_wait_s": 600,
            "default_max_tokens": 4,
        },
    }
    config = data_dir.parent / "node.toml"
    config.write_text(tomli_w.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOO_NODE_") or k == "ZOO_NODE_CACHE_DIR"}
    log = (data_dir.parent / "node.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.node.cli", "start", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        preexec_fn=dies_with_this_process(),
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the node exited; see {log.name}")
        info = json.loads((data_dir / "node.json").read_text()) if (data_dir / "node.json").exists() else {}
        if info.get("pid") == proc.pid:
            with NodeClient(info["listen"]) as c:
                states = {x.name: x.state for x in c.status().components}
            serving = node_pb2.ComponentState.Value("COMPONENT_STATE_SERVING")
            if all(states.get(n) == serving for n in ("model", "library", "retrieval")):
                return proc, info
        time.sleep(0.5)
    raise SystemExit("the node did not serve within 600 s")


def timed_requests(client: NodeClient, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        client.inference.Infer(
            pb.InferRequest(prompt=PROMPT, sampling=pb.SamplingParams(max_tokens=4)), timeout=600
        )
        samples.append(time.perf_counter() - t)
    return samples


def during_flood(address: str, flood: int, measure: Callable[[], list[float]]) -> list[float]:
    """Run `measure` while `flood` anonymous requests stay outstanding (each one answered is replaced at
    once); returns its samples."""
    with NodeClient(address) as anonymous:
        request = pb.InferRequest(prompt=PROMPT, sampling=pb.SamplingParams(max_tokens=4))
        outstanding: set[grpc.Future] = set()
        lock = threading.Lock()
        flooding = threading.Event()
        flooding.set()

        def send() -> None:
            future = anonymous.inference.Infer.future(request, timeout=900)
            with lock:
                outstanding.add(future)

            def answered(f: grpc.Future) -> None:
                with lock:
                    outstanding.discard(f)
                if f.cancelled() or not flooding.is_set():
                    return
                if f.exception() is not None:
                    print(f"a flood request failed: {f.exception()}", file=sys.stderr)
                send()

            future.add_done_callback(answered)

        for _ in range(flood):
            send()
        time.sleep(2.0)  # the backlog is queued
        samples = measure()
        flooding.clear()
        with lock:
            pending = list(outstanding)
        for f in pending:
            f.cancel()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=200)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="zoo-bench-flood-"))
    proc = None
    try:
        proc, info = start_node(scratch / "data", args.batch, args.flood)
        devnet = Devnet(scratch / "data").info()
        assert devnet is not None
        balance = give_credits(devnet, HOLDER, 10**9)
        print(f"holder {HOLDER.address} holds {balance:,} credits")
        address = info["listen"]
        with NodeClient(address, signer=HOLDER, spend=10**9) as signed, NodeClient(address) as unsigned:
            timed_requests(signed, 2)  # warm-up (and the holder's balance is read once)
            idle = timed_requests(signed, args.requests)
            holder = during_flood(address, args.flood, lambda: timed_requests(signed, args.requests))
            # Each of these waits out the whole backlog (minutes on a CPU): two show the magnitude.
            plain = during_flood(address, args.flood, lambda: timed_requests(unsigned, 2))
        base = statistics.median(idle)
        print(f"\n{'requests':<34}{'p50 s':>8}{'vs idle':>9}")
        for name, samples in (
            ("holder, idle", idle),
            (f"holder, signed, {args.flood} anonymous flood", holder),
            (f"same client unsigned, {args.flood} flood", plain),
        ):
            p50 = statistics.median(samples)
            print(f"{name:<34}{p50:>8.2f}{p50 / base:>8.2f}×")
        print("goal: the holder's p50 under the flood at most 2x its idle p50")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
