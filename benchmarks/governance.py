"""Benchmark on-chain governance: gas of propose / vote / execute and the wall time of a full round.

A round is propose -> 3 votes -> execute on a fresh anvil, each version built on the previous one, with the
two time jumps (into the voting window, past voting + execution delay) a test chain needs. The baseline is
a round of the same number of plain ERC20 transfers (5) sent through the same client code in the same run,
so the ratio shows what governance costs over the transaction plumbing itself. A second registry gated by
the checkpointed AllowlistVoterRegistry shows what reading membership at the snapshot adds to a vote.

Run: .venv/bin/python benchmarks/governance.py [--rounds N]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable

from web3 import Web3

from zoo.contracts.build import build
from zoo.devnet.anvil import AnvilProcess
from zoo.registry.chain import RegistryClient, TokenClient, deploy_allowlist, deploy_registry, deploy_token
from zoo.registry.keys import dev_account

VOTING_PERIOD = 7 * 24 * 3600
EXECUTION_DELAY = 24 * 3600
TX_PER_ROUND = 5  # propose, 3 votes, execute


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds to time (median reported)")
    args = parser.parse_args()

    started = time.perf_counter()
    artifacts = build()
    build_s = time.perf_counter() - started

    with AnvilProcess().start() as anvil:
        w3 = Web3(Web3.HTTPProvider(anvil.rpc_url))
        accounts = [dev_account(i) for i in range(5)]
        holders = [(a.address, (100 * 10**9) ** 2) for a in accounts[:4]]
        token = deploy_token(w3, accounts[0], holders, artifacts=artifacts)

        def registry_clients(voter_registry: str | None = None) -> list[RegistryClient]:
            address = deploy_registry(
                w3,
                accounts[0],
                token,
                voting_period=VOTING_PERIOD,
                execution_delay=EXECUTION_DELAY,
                proposal_threshold=10**18,
                quorum=250 * 10**9,
                voter_registry=voter_registry,
                artifacts=artifacts,
            )
            return [RegistryClient(w3, address, a, artifacts=artifacts) for a in accounts[:4]]

        clients = registry_clients()
        allowlist = deploy_allowlist(w3, accounts[0], [a.address for a in accounts[:4]], artifacts=artifacts)
        gated_clients = registry_clients(allowlist)
        token_client = TokenClient(w3, token, accounts[0], artifacts=artifacts)

        def travel(seconds: int) -> None:
            w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
            w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

        travel(60)
        # The first vote on a proposal turns a zero tally non-zero (a 20k-gas store), later ones do not.
        gas: dict[str, list[int]] = {"propose": [], "vote (1st)": [], "vote (2nd+)": [], "execute": []}

        def governance_round(n: int) -> None:
            root = hashlib.sha256(f"library-{n}".encode()).digest()
            proposed = clients[0].propose(root, f"bafy-round-{n}", tree_size=100 + n)
            gas["propose"].append(proposed.gas_used)
            travel(1)
            for i, voter in enumerate(clients[1:4]):
                cast = voter.vote(proposed.proposal_id, True)
                gas["vote (1st)" if i == 0 else "vote (2nd+)"].append(cast.gas_used)
            travel(VOTING_PERIOD + EXECUTION_DELAY + 1)
            gas["execute"].append(clients[0].execute(proposed.proposal_id).gas_used)

        gated_gas: dict[str, list[int]] = {"vote, registry (1st)": [], "vote, registry (2nd+)": []}

        def gated_round(n: int) -> None:
            proposed = gated_clients[0].propose(
                hashlib.sha256(f"gated-{n}".encode()).digest(), "bafyg", tree_size=7
            )
            travel(1)
            for i, voter in enumerate(gated_clients[1:4]):
                cast = voter.vote(proposed.proposal_id, True)
                gated_gas["vote, registry (1st)" if i == 0 else "vote, registry (2nd+)"].append(cast.gas_used)
            travel(VOTING_PERIOD + EXECUTION_DELAY + 1)
            gated_clients[0].execute(proposed.proposal_id)

        transfer_gas: list[int] = []

        def transfer_round(n: int) -> None:
            for i in range(TX_PER_ROUND):
                transfer_gas.append(token_client.transfer(accounts[4].address, 1 + i + n).gas_used)

        def timed(fn: Callable[[int], None], rounds: int, offset: int) -> list[float]:
            samples = []
            for n in range(rounds):
                t0 = time.perf_counter()
                fn(offset + n)
                samples.append(time.perf_counter() - t0)
            return samples

        # One untimed round of each warms connections, caches and the accounts' first storage writes.
        governance_round(0)
        transfer_round(0)
        first = {k: v[0] for k, v in gas.items()}
        for values in gas.values():
            values.clear()
        transfer_gas.clear()

        # Interleaved so both see the same machine load.
        gov_samples: list[float] = []
        base_samples: list[float] = []
        for n in range(1, args.rounds + 1):
            gov_samples += timed(governance_round, 1, n)
            base_samples += timed(transfer_round, 1, n)
        version = clients[0].current_version()
        for n in range(3):
            gated_round(n)

    gov_ms, base_ms = _median_ms(gov_samples), _median_ms(base_samples)
    print(f"solc build (cache {'hit' if artifacts.from_cache else 'miss'}): {build_s * 1000:.0f} ms")
    print(f"rounds: {args.rounds} timed (+1 warm-up); library reached version {version}")
    print("gas used, median of timed rounds [warm-up round: version 0 -> 1 writes zero slots, costs differ]:")
    for name, values in gas.items():
        print(f"  {name:<22} {statistics.median(values):>8.0f}   [{first[name]}]")
    for name, values in gated_gas.items():
        print(f"  {name:<22} {statistics.median(values):>8.0f}")
    print(f"  {'transfer':<22} {statistics.median(transfer_gas):>8.0f}")
    print(f"governance round (propose, 3 votes, execute + 2 time jumps): median {gov_ms:.1f} ms")
    print(f"baseline round ({TX_PER_ROUND} ERC20 transfers, same client):            median {base_ms:.1f} ms")
    print(f"ratio governance / baseline: {gov_ms / base_ms:.2f}")


if __name__ == "__main__":
    main()
