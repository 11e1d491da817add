"""Settlement: the node's metered usage goes on chain, epoch by epoch, as a UsageLedger report.

Every `poll_s`, for each metered epoch that has ended by the node's clock and by the chain's (the meter
counts by the one, the ledger accepts by the other) and is not settled yet:
1. no report on chain: add the epoch's metered receipts to IPFS (credits/receipt_log.py), build the
   report from the meter naming them (registry/usage_report.py), keep its bytes and the receipts' in
   `reports_dir` (what is posted is what the spends are later proven from), add the report to IPFS, post
   root, size, earned units and CID. An epoch with nothing to record is settled without a transaction.
2. a report on chain whose challenge window has passed, unchallenged: prove and apply each SPENT record
   the ledger has not applied yet (so the clients' balances go down on chain), then mark the epoch settled
   in the meter (the credit book stops subtracting those spends itself).
3. a voided report: settled as is (nothing of it will ever apply). A challenged one waits for the DAO.
4. no report on chain and the ledger will take none: an epoch before the node's registration, or one whose
   report window has closed (the node was down or unregistered too long): settled as dropped, logged with
   what it held, so the meter stops carrying it (its clients' spends are then never charged).

It signs with the node's own key (DATA_DIR/node.key). It never stops the node serving: a round that fails
(chain or IPFS unreachable, the node not registered, no gas, content that does not match its root) leaves
the meter as it was, marks the component DEGRADED with the reason, is logged and counted, and the next
round tries again. On the devnet the node's account is given gas money by dev0 once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.node.credits.meter import UsageMeter
from zoo.node.lifecycle import Component, State
from zoo.node.logs import get_logger
from zoo.registry.fsutil import write_atomic

log = get_logger(__name__)
DEVNET_GAS_MONEY = 10**18  # wei dev0 gives a devnet node's account, once


@dataclass
class Round:
    """What one settlement round did."""

    posted: list[int]
    applied: list[int]  # epochs whose spends were applied (and which are now settled)
    skipped: list[int]  # epochs with nothing to report, settled without a transaction
    waiting: list[int]  # epochs posted and in their challenge window (or challenged)
    dropped: list[int]  # epochs the ledger takes no report for (before registration, window closed)

    def describe(self) -> str:
        parts = [f"{name} {values}" for name, values in vars(self).items() if values]
        return "; ".join(parts) or "nothing to settle"


class Settlement(Component):
    name = "settlement"
    has_background_task = True
    probe_interval_s = 5.0

    def __init__(
        self,
        meter: UsageMeter,
        *,
        rpc_url: str,
        ledger_address: str,
        ipfs_api: str | None,
        key_file: Path,
        reports_dir: Path,
        poll_s: float = 30.0,
        devnet: bool = False,
        clock: Callable[[], float] = time.time,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.meter = meter
        self.rpc_url, self.ledger_address, self.ipfs_api = rpc_url, ledger_address, ipfs_api
        self.key_file, self.reports_dir = key_file, reports_dir
        self.poll_s, self.devnet, self.clock = poll_s, devnet, clock
        self.on_failure = on_failure
        self._state, self._detail = State.STARTING, "starting"
        self.ledger: Any = None
        self.node = ""

    # -- component ---------------------------------------------------------------------------------------

    async def setup(self) -> None:
        await asyncio.to_thread(self.connect)

    async def probe(self) -> tuple[State, str]:
        return self._state, self._detail

    async def run_forever(self) -> None:
        while True:
            try:
                done = await asyncio.to_thread(self.settle_once)
            except Exception as e:  # any failure: report it, keep serving, try again next round
                self.on_failure()
                self._state, self._detail = State.DEGRADED, f"{type(e).__name__}: {e}"[:500]
                log.warning("settlement round failed", error=self._detail)
            else:
                if done is not None:  # None: settle_once said why not (DEGRADED)
                    self._state, self._detail = State.SERVING, done.describe()
            await asyncio.sleep(self.poll_s)

    # -- the work (blocking: called in a worker thread) ----------------------------------------------------

    def connect(self) -> None:
        from eth_account import Account
        from web3 import Web3

        from zoo.registry.chain import LedgerClient
        from zoo.registry.keys import Signer

        account = Account.from_key(self.key_file.read_text().strip())
        w3 = Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 30}))
        self.ledger = LedgerClient(w3, self.ledger_address, Signer(account, str(self.key_file)))
        self.node = account.address
        self.params = self.ledger.params()
        if self.params.epoch_length != self.meter.epoch_s:
            raise RuntimeError(
                f"the ledger's epoch is {self.params.epoch_length} s but this node meters "
                f"{self.meter.epoch_s} s epochs: set credits.epoch_s to the ledger's"
            )
        if self.devnet and w3.eth.get_balance(self.node) == 0:
            from zoo.registry.keys import dev_account

            w3.eth.send_transaction(
                {"from": dev_account(0).address, "to": self.node, "value": DEVNET_GAS_MONEY}
            )

    def settle_once(self) -> Round | None:
        """One round; None when the node is not registered (nothing can be posted)."""
        if self.ledger is None:
            self.connect()
        if not self.ledger.is_registered(self.node):
            self._state = State.DEGRADED
            self._detail = (
                f"node {self.node} is not registered on the UsageLedger: its usage is kept until it is "
                f"(`zoo-node dao propose-node {self.node}`)"
            )
            return None
        chain_now = int(self.ledger.w3.eth.get_block("latest")["timestamp"])
        length = self.params.epoch_length
        ended = min(chain_now // length, int(self.clock()) // length)  # epochs below it are over for both
        done = Round([], [], [], [], [])
        settled = self.meter.settled_epochs()
        first = self.ledger.first_epoch(self.node)
        for epoch in self.meter.epochs():
            if epoch < ended and epoch not in settled:
                self._settle_epoch(epoch, chain_now, first, done)
        return done

    def _settle_epoch(self, epoch: int, chain_now: int, first: int, done: Round) -> None:
        from zoo.node.credits.receipt_log import encode_document, receipts_ref
        from zoo.registry.usage_report import build_report

        posted = self.ledger.report(self.node, epoch)
        deadline = (epoch + 1) * self.params.epoch_length + self.params.report_window
        if posted is None and (epoch < first or chain_now >= deadline):
            answered, units = self.meter.answered(epoch)
            log.warning(
                "usage of an epoch the ledger takes no report for: dropped",
                epoch=epoch,
                why=f"before the node's registration (epoch {first})" if epoch < first
                else f"its report window closed at {deadline}",
                answered=answered,
                units=units,
            )  # fmt: skip
            self.meter.mark_settled(epoch)
            done.dropped.append(epoch)
            return
        if posted is None:
            report = build_report(
                self.node,
                epoch,
                self.params.epoch_length,
                {a.author: a.units for a in self.meter.by_author(epoch)},
                self.meter.spent_by_client(epoch),
                self.params.max_units_per_report,
                self.meter.authorizations(epoch, self.node),
            )
            if not report.records:
                self.meter.mark_settled(epoch)
                done.skipped.append(epoch)
                return
            leaves = self.meter.receipt_leaves(epoch)
            receipts = encode_document(self.node, epoch, leaves)
            self.reports_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.reports_dir / f"epoch-{epoch}.receipts.json", receipts)
            with self._ipfs() as ipfs:
                report = dataclasses.replace(report, receipts=receipts_ref(ipfs.add(receipts), leaves))
                data = report.encode()
                write_atomic(self._report_file(epoch), data)
                cid = ipfs.add(data)
            tree = report.tree()
            tx = self.ledger.post_report(
                epoch, tree.root, tree_size=len(report.records), earned_units=report.earned_units, cid=cid
            )
            log.info(
                "usage report posted",
                epoch=epoch,
                records=len(report.records),
                receipts=len(leaves),
                cid=cid,
                gas=tx.gas_used,
                earned=report.earned_units,
                capped_from=report.earned_before_cap,
            )
            done.posted.append(epoch)
            return
        if posted.voided:
            log.warning("usage report voided by the DAO: its spends will not apply", epoch=epoch)
            self.meter.mark_settled(epoch)
            return
        if posted.challenged or chain_now < posted.posted_at + self.params.challenge_window:
            done.waiting.append(epoch)
            return
        self._apply_spent(epoch, posted)
        self.meter.mark_settled(epoch)
        done.applied.append(epoch)

    def _apply_spent(self, epoch: int, posted: Any) -> None:
        from zoo.registry.chain.ledger import SPENT
        from zoo.registry.usage_report import Report, fetch_report

        path = self._report_file(epoch)
        if path.exists():
            report = Report.decode(path.read_bytes())
            report.check_against(posted)
        else:  # posted by this key from elsewhere, or the file was lost: the posted content is on IPFS
            with self._ipfs() as ipfs:
                report = fetch_report(ipfs, posted)
        tree = report.tree()
        for index, record in enumerate(report.records):
            if record.kind == SPENT and not self.ledger.settled(self.node, epoch, SPENT, record.account):
                proof = tree.prove(index).path
                consent = record.authorization(self.node, epoch)
                self.ledger.apply_spent(self.node, epoch, record.units, index, proof, consent)
                log.info("spent credits applied", epoch=epoch, client=record.account, units=record.units)

    def _report_file(self, epoch: int) -> Path:
        return self.reports_dir / f"epoch-{epoch}.json"

    def _ipfs(self) -> Any:
        from zoo.registry.ipfs import IpfsClient

        if not self.ipfs_api:
            raise RuntimeError("no IPFS API is configured: reports cannot be published")
        return IpfsClient(self.ipfs_api)
