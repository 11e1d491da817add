"""Benchmark the UsageLedger's gas: posting a usage report, claiming credits, applying a spend.

On a fresh anvil, one node posts one report per epoch whose tree holds --sizes records (the report's
records are synthetic; only the tree's depth matters to a claim, whose proof has log2(size) hashes). Each
figure is the gas of the mined transaction; the in-run baseline is a plain KEEPER token transfer (an
ERC20 transfer to an address that holds tokens already) sent through the same client code.

Run: .venv/bin/python benchmarks/ledger.py [--sizes 2,1000,100000]
"""

from __future__ import annotations

import argparse

from web3 import Web3

from zoo.contracts.build import build
from zoo.devnet.anvil import AnvilProcess
from zoo.registry.chain import LedgerClient, TokenClient, deploy_ledger, deploy_token, record_leaf
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account
from zoo.registry.merkle import MerkleTree
from zoo.registry.spend import sign_spend_authorization

DAY = 24 * 3600
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,1000,100000", help="records per report, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    artifacts = build()
    with AnvilProcess().start() as anvil:
        w3 = Web3(Web3.HTTPProvider(anvil.rpc_url))
        governor, node, author, client = (dev_account(i) for i in (0, 1, 2, 3))
        token = deploy_token(
            w3, governor, [(governor.address, 10**24), (author.address, 10**18)], artifacts=artifacts
        )
        ledger_address = deploy_ledger(
            w3, governor, governor=governor.address, keeper_token=token, epoch_length=DAY,
            challenge_window=DAY, max_units_per_report=10**30, artifacts=artifacts,
        )  # fmt: skip
        transfer = TokenClient(w3, token, governor, artifacts=artifacts).transfer(author.address, 1).gas_used
        as_gov, as_node = (LedgerClient(w3, ledger_address, a, artifacts=artifacts) for a in (governor, node))
        as_author, as_client = (
            LedgerClient(w3, ledger_address, a, artifacts=artifacts) for a in (author, client)
        )
        as_gov.register_node(node.address)
        print(f"{'records':>9}  {'transaction':<24}{'gas':>9}  {'vs ERC20 transfer':>17}")
        print(f"{'':>9}  {'ERC20 transfer (baseline)':<24}{transfer:>9,}  {1:>16.2f}×")
        for size in sizes:
            records = [(EARNED, author.address, 700), (SPENT, client.address, 40)]
            records += [(EARNED, Web3.to_checksum_address(f"0x{i + 1:040x}"), 1) for i in range(size - 2)]
            tree = MerkleTree.from_leaves([record_leaf(*r) for r in records])
            epoch = int(w3.eth.get_block("latest")["timestamp"]) // DAY
            w3.provider.make_request("evm_increaseTime", [DAY])  # type: ignore[arg-type]
            w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
            earned = sum(u for k, _, u in records if k == EARNED)
            post = as_node.post_report(
                epoch, tree.root, tree_size=size, earned_units=earned, cid=CID
            ).gas_used
            w3.provider.make_request("evm_increaseTime", [DAY])  # type: ignore[arg-type]
            claim = as_author.claim(node.address, epoch, 700, 0, tree.prove(0).path).gas_used
            consent = sign_spend_authorization(
                client, w3.eth.chain_id, ledger_address, node.address, epoch, 40
            )
            spend = as_client.apply_spent(node.address, epoch, 40, 1, tree.prove(1).path, consent).gas_used
            for name, gas in (("postReport", post), ("claim", claim), ("applySpent", spend)):
                print(f"{size:>9,}  {name:<24}{gas:>9,}  {gas / transfer:>16.2f}×")


if __name__ == "__main__":
    main()
