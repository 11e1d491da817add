"""Credits on the devnet's UsageLedger the way settlement gives them, in one call: the devnet's DAO registers
dev5 as a reporting node (a call proposal, passed), dev5 posts a report for the last ended epoch
crediting the account, the chain clock jumps past the challenge window, and the account claims its
record with its proof. For tests and benchmarks that need a credit holder without waiting out an epoch.
"""

from __future__ import annotations

from typing import Any

from web3 import Web3

from zoo.devnet.dev_dao import DevDao
from zoo.devnet.info import DevnetInfo, warp
from zoo.registry.chain import LedgerClient
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.usage_report import build_report

REPORTER = 5


def give_credits(info: DevnetInfo, account: Any, units: int) -> int:
    """Make `account` (an eth_account LocalAccount) hold `units` more credits; returns its balance."""
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 60}))
    funder, reporter = dev_account(0), dev_account(REPORTER)
    ledger = LedgerClient(w3, info.ledger_address)
    if not ledger.is_registered(reporter.address):
        DevDao(w3, info.registry_address, info.settings).call(
            info.ledger_address, ledger.governor_call("registerNode", reporter.address)
        )
    params = ledger.params()
    now = int(w3.eth.get_block("latest")["timestamp"])
    epoch = now // params.epoch_length - 1
    first = ledger.first_epoch(reporter.address)
    # One report per epoch, none before the reporter's registration: move on to an epoch that takes one.
    while epoch < first or ledger.report(reporter.address, epoch) is not None:
        now = warp(w3, params.epoch_length)
        epoch = now // params.epoch_length - 1
    # Published like a node's report, so `zoo-node credits show` can check it against its root.
    report = build_report(
        reporter.address,
        epoch,
        params.epoch_length,
        {account.address: units},
        {},
        params.max_units_per_report,
    )
    with IpfsClient(info.ipfs_api) as ipfs:
        cid = ipfs.add(report.encode())
    LedgerClient(w3, info.ledger_address, reporter).post_report(
        epoch, report.tree().root, tree_size=1, earned_units=units, cid=cid
    )
    warp(w3, params.challenge_window + 1)
    # The account claims its record itself; dev0 gives it gas money (anvil's dev accounts are unlocked).
    w3.eth.send_transaction({"from": funder.address, "to": account.address, "value": 10**17})
    holder = LedgerClient(w3, info.ledger_address, account)
    holder.claim(reporter.address, epoch, units, 0, report.tree().prove(0).path)
    return holder.balance(account.address)
