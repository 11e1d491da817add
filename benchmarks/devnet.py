"""Benchmark `Devnet.up()`: cold, warm, warm-restart and reuse, plus a full DAO round on the devnet.

cold          fresh data dir and a fresh contract cache: solcjs compile + IPFS repo init + deploy + genesis
warm          fresh data dir, compiled artifacts cached: IPFS repo init + deploy + genesis
warm-restart  the same data dir after `down`: the saved chain state and IPFS repo are resumed (no deploy, no
              genesis); this is the devnet restart time with state
reuse         the devnet is already running: `up` only checks the recorded processes and both endpoints

Each figure is the median of --runs runs; the ratios divide by the reuse median measured in the same run.
The DAO round (propose -> 3 votes -> execute, with the two clock jumps a devnet needs) goes through
RegistryClient against the devnet left running at the end. Everything lives in a temporary directory
(ZOO_NODE_CACHE_DIR included, so the user's contract cache is neither used nor touched) that is removed
afterwards; every devnet is brought down, and is tied to this process besides (PR_SET_PDEATHSIG).

Run: .venv/bin/python benchmarks/devnet.py [--runs N] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# Before any zoo import: zoo.contracts.build.default_cache_dir() reads ZOO_NODE_CACHE_DIR (at each build()),
# so the benchmark controls which compiled artifacts exist.
SCRATCH = Path(tempfile.mkdtemp(prefix="zoo-bench-devnet-"))
os.environ["ZOO_NODE_CACHE_DIR"] = str(SCRATCH / "cache-initial")

from web3 import Web3  # noqa: E402

from zoo.contracts.build import build, default_cache_dir  # noqa: E402
from zoo.devnet.info import DevnetInfo, warp  # noqa: E402
from zoo.devnet.manager import Devnet, DevnetSettings  # noqa: E402
from zoo.registry.chain import RegistryClient  # noqa: E402
from zoo.registry.keys import dev_account  # noqa: E402

VOTERS = (1, 2, 3)


class Phases:
    """Times the steps `up` reports through its progress callback."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._step: str | None = None
        self._t = 0.0

    def start(self) -> None:
        self._step, self._t = None, time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        if self._step is not None:
            self.samples[self._step].append(now - self._t)
        self._step, self._t = step, now

    def finish(self) -> None:
        self("")
        self._step = None


def timed_up(data_dir: Path, expect_reuse: bool, phases: Phases | None = None) -> tuple[float, DevnetInfo]:
    devnet = Devnet(data_dir, DevnetSettings())
    if phases is not None:
        phases.start()
    t0 = time.perf_counter()
    info, reused = devnet.up(progress=phases, die_with_parent=True)
    took = time.perf_counter() - t0
    if phases is not None and not reused:
        phases.finish()
    if reused != expect_reuse:
        raise SystemExit(f"up() in {data_dir} reported reused={reused}, expected {expect_reuse}")
    return took, info


def down(data_dir: Path) -> None:
    stopped = Devnet(data_dir).down()
    if sorted(stopped) != ["anvil", "chain-state", "ipfs"]:
        raise SystemExit(f"down() in {data_dir} stopped {stopped}, expected anvil, chain-state and ipfs")


def dao_round(info: DevnetInfo, n: int) -> float:
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
    proposer = RegistryClient(w3, info.registry_address, dev_account(0))
    voters = [RegistryClient(w3, info.registry_address, dev_account(i)) for i in VOTERS]
    period = info.settings["voting_period_s"] + info.settings["execution_delay_s"]
    root = os.urandom(32)
    t0 = time.perf_counter()
    proposed = proposer.propose(root, f"bafy-bench-round-{n}", tree_size=1)
    warp(w3, 1)  # voting opens one second after the proposal
    for voter in voters:
        voter.vote(proposed.proposal_id, True)
    warp(w3, period + 1)
    proposer.execute(proposed.proposal_id)
    took = time.perf_counter() - t0
    if proposer.current_root() != root:
        raise SystemExit(f"DAO round {n} did not make its root current")
    return took


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    parser.add_argument("--rounds", type=int, default=5, help="DAO rounds to time (median reported)")
    args = parser.parse_args()

    results: dict[str, list[float]] = {}
    phases = {"cold": Phases(), "warm": Phases(), "warm-restart": Phases()}
    running: Path | None = None
    try:
        # cold: a brand-new contract cache and data dir per run.
        results["cold"] = []
        for i in range(args.runs):
            os.environ["ZOO_NODE_CACHE_DIR"] = str(SCRATCH / f"cache-cold-{i}")
            data_dir = SCRATCH / f"cold-{i}"
            took, _ = timed_up(data_dir, False, phases["cold"])
            results["cold"].append(took)
            down(data_dir)

        # warm: artifacts cached (compiled once, untimed), a new data dir per run.
        os.environ["ZOO_NODE_CACHE_DIR"] = str(SCRATCH / "cache-warm")
        build()
        if not build().from_cache:
            raise SystemExit(f"contract cache in {default_cache_dir()} did not take")
        results["warm"] = []
        for i in range(args.runs):
            data_dir = SCRATCH / f"warm-{i}"
            took, _ = timed_up(data_dir, False, phases["warm"])
            results["warm"].append(took)
            down(data_dir)

        # warm-restart: the last warm data dir again (its IPFS repo exists); the last one stays up.
        restart_dir = SCRATCH / f"warm-{args.runs - 1}"
        results["warm-restart"] = []
        for i in range(args.runs):
            took, info = timed_up(restart_dir, False, phases["warm-restart"])
            running = restart_dir
            results["warm-restart"].append(took)
            if i < args.runs - 1:
                down(restart_dir)
                running = None

        # reuse: up() on the running devnet.
        results["reuse"] = [timed_up(restart_dir, True)[0] for _ in range(args.runs)]

        dao_round(info, 0)  # untimed warm-up: connections, first storage writes of the history
        rounds = [dao_round(info, n) for n in range(1, args.rounds + 1)]
        assert running is not None
        down(running)
        running = None
    finally:
        if running is not None:
            Devnet(running).down()
        shutil.rmtree(SCRATCH, ignore_errors=True)

    base = median_ms(results["reuse"])
    print(f"Devnet.up(), median of {args.runs} runs (ratio = median / reuse median):")
    for name in ("cold", "warm", "warm-restart", "reuse"):
        ms = median_ms(results[name])
        spread = ", ".join(f"{s * 1000:.0f}" for s in results[name])
        print(f"  {name:<13} {ms:>9.1f} ms   x{ms / base:>7.1f}   [runs: {spread} ms]")
    print("phases of up(), median ms (as reported through its progress callback):")
    steps = list(dict.fromkeys(step for p in phases.values() for step in p.samples))
    print(f"  {'step':<48} " + " ".join(f"{n:>13}" for n in phases))
    for step in steps:
        cells = " ".join(
            f"{median_ms(p.samples[step]):>13.0f}" if p.samples.get(step) else f"{'-':>13}"
            for p in phases.values()
        )
        print(f"  {step:<48} {cells}")
    dao_ms = median_ms(rounds)
    print(
        f"DAO round (propose, 3 votes, execute + 2 clock jumps) via RegistryClient: median {dao_ms:.1f} ms "
        f"over {args.rounds} rounds (+1 warm-up), x{dao_ms / base:.1f} reuse"
    )


if __name__ == "__main__":
    main()
