"""Gas of the DAO's call proposals and the UsageLedger's settlement: one fixed sequence, printed as a table.

On a fresh anvil: a KEEPER token, an ExperienceRegistry (one-hour vote, no execution delay) and a
UsageLedger governed by it. The sequence: a call proposal of `registerNode(node)` and of
`resolveChallenge(node, epoch, false)`, each voted through and executed; the node posts two reports; a
KEEPER holder challenges one; an author claims from the other and a client's spend is applied with its
consent; where the ledger has it, a challenge the DAO left unresolved is settled as lapsed. Every figure is
the gas of the mined transaction, and the sequence is the same on every version of the contracts, so two
runs compare (the baseline is an ERC20 transfer sent through the same client code).

Run: ./zoo bench gas   (or .venv/bin/python benchmarks/gas.py)
"""

from __future__ import annotations

import argparse
import hashlib

from web3 import Web3

from zoo.contracts.build import build
from zoo.devnet.anvil import AnvilProcess
from zoo.registry.chain import (
    LedgerClient,
    RegistryClient,
    TokenClient,
    deploy_ledger,
    deploy_registry,
    deploy_token,
    record_leaf,
)
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account
from zoo.registry.merkle import MerkleTree
from zoo.registry.spend import sign_spend_authorization

DAY = 24 * 3600
VOTE = 3600
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    artifacts = build()
    with AnvilProcess().start() as anvil:
        w3 = Web3(Web3.HTTPProvider(anvil.rpc_url))
        dev = [dev_account(i) for i in range(6)]
        keeper, node, author, client = dev[0], dev[4], dev[2], dev[3]

        def travel(seconds: int) -> None:
            w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
            w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

        holders = [(a.address, (100 * 10**9) ** 2) for a in dev[:4]]
        token = deploy_token(w3, keeper, holders, artifacts=artifacts)
        registry_address = deploy_registry(
            w3, keeper, token, voting_period=VOTE, execution_delay=0, proposal_threshold=10**18,
            quorum=150 * 10**9, artifacts=artifacts,
        )  # fmt: skip
        ledger_address = deploy_ledger(
            w3, keeper, governor=registry_address, keeper_token=token, epoch_length=DAY,
            challenge_window=DAY, challenge_threshold=10**18, artifacts=artifacts,
        )  # fmt: skip
        registry = [RegistryClient(w3, registry_address, a, artifacts=artifacts) for a in dev[:4]]
        ledger = {a.address: LedgerClient(w3, ledger_address, a, artifacts=artifacts) for a in dev}
        # A minute on, so the transfer always writes new vote checkpoints (in the deployment's second it would
        # overwrite them, cheaper), and every snapshot lies after the deployment.
        travel(60)
        transfer = TokenClient(w3, token, keeper, artifacts=artifacts).transfer(dev[5].address, 1)
        gas: dict[str, int] = {"ERC20 transfer (baseline)": transfer.gas_used}

        def dao_call(name: str, data: bytes) -> None:
            # A fixed salt: calldata gas depends on its zero bytes, and so on a random salt and proposal id.
            proposed = registry[0].propose_call(ledger_address, data, salt=hashlib.sha256(data).digest())
            gas[f"proposeCall {name}"] = proposed.gas_used
            travel(1)
            for voter in registry[1:4]:
                voter.vote(proposed.proposal_id, True)
            travel(VOTE + 1)
            gas[f"execute {name}"] = registry[0].execute(proposed.proposal_id).gas_used

        reader = ledger[keeper.address]
        dao_call("registerNode", reader.governor_call("registerNode", node.address))
        records = [(EARNED, author.address, 700), (SPENT, client.address, 40)]
        tree = MerkleTree.from_leaves([record_leaf(*r) for r in records])
        epochs = []
        for n in range(2):
            epochs.append(int(w3.eth.get_block("latest")["timestamp"]) // DAY)
            travel(DAY)
            posted = ledger[node.address].post_report(
                epochs[-1], tree.root, tree_size=2, earned_units=700, cid=CID
            )
            gas.setdefault("postReport", posted.gas_used)
            if n == 0:
                gas["challenge"] = ledger[keeper.address].challenge(node.address, epochs[0], "bench").gas_used
        dao_call("resolveChallenge", reader.governor_call("resolveChallenge", node.address, epochs[0], False))
        travel(DAY)
        gas["claim"] = (
            ledger[author.address].claim(node.address, epochs[1], 700, 0, tree.prove(0).path).gas_used
        )
        consent = sign_spend_authorization(
            client, w3.eth.chain_id, ledger_address, node.address, epochs[1], 40
        )
        applied = ledger[author.address].apply_spent(
            node.address, epochs[1], 40, 1, tree.prove(1).path, consent
        )
        gas["applySpent"] = applied.gas_used
        if "settleLapsedChallenge" in {f.get("name") for f in reader.contract.abi}:
            epoch = int(w3.eth.get_block("latest")["timestamp"]) // DAY
            travel(DAY)
            ledger[node.address].post_report(epoch, tree.root, tree_size=2, earned_units=700, cid=CID)
            ledger[keeper.address].challenge(node.address, epoch, "never resolved")
            travel(reader.params().resolution_period)
            settled = ledger[dev[5].address].settle_lapsed_challenge(node.address, epoch)
            gas["settleLapsedChallenge"] = settled.gas_used
        source = hashlib.sha256(artifacts.get("UsageLedger").bytecode.encode()).hexdigest()[:12]

    baseline = gas["ERC20 transfer (baseline)"]
    print(f"contracts: UsageLedger bytecode sha256 {source}…")
    print(f"{'transaction':<28}{'gas':>9}  {'vs ERC20 transfer':>17}")
    for name, used in gas.items():
        print(f"{name:<28}{used:>9,}  {used / baseline:>16.2f}×")


if __name__ == "__main__":
    main()
