"""Settlement on a real devnet (anvil, IPFS, the deployed UsageLedger) with a real usage meter: an ended
epoch's usage becomes a posted report whose IPFS content matches its root, authors claim from it, the
clients' spends are applied after the challenge window with the consent they signed, and every failure
leaves the meter as it was."""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from tests.devnet import tear_down, zoo
from zoo.devnet.dev_dao import DevDao
from zoo.devnet.dev_ledger import give_credits
from zoo.devnet.info import DevnetInfo, warp
from zoo.devnet.manager import Devnet, DevnetSettings
from zoo.node.credits.meter import Served, UsageMeter, credited_of
from zoo.node.credits.metered_receipt import MeteredReceipt
from zoo.node.credits.receipt_log import ReceiptsDocument, encode_document, receipts_ref
from zoo.node.credits.settlement import Settlement
from zoo.node.lifecycle import State
from zoo.node.provenance.receipts import ZERO32, ZERO_ADDRESS, Receipt, sign
from zoo.registry.chain import ContractRevert, LedgerClient
from zoo.registry.chain.ledger import EARNED, SPENT, UsageReport
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.spend import sign_spend_authorization
from zoo.registry.usage_report import Report, ReportError, build_report, fetch_report

EPOCH, WINDOW = 600, 60
AUTHOR = dev_account(7)


@dataclass
class Clock:
    t: float

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def devnet_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data_dir = tmp_path_factory.mktemp("settlement-devnet")
    try:
        Devnet(data_dir, DevnetSettings(epoch_s=EPOCH, challenge_window_s=WINDOW)).up(die_with_parent=True)
        yield data_dir
    finally:
        tear_down(data_dir)


@pytest.fixture(scope="module")
def devnet(devnet_dir: Path) -> DevnetInfo:
    info = Devnet(devnet_dir).info()
    assert info is not None
    return info


class Node:
    """A node's key, meter and settlement against the devnet, on a clock of its own."""

    def __init__(self, info: DevnetInfo, tmp: Path) -> None:
        self.info = info
        self.w3 = Web3(Web3.HTTPProvider(info.rpc_url))
        self.key = Account.create()
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "node.key").write_text(self.key.key.hex())
        self.clock = Clock(self.chain_now())
        self.meter = UsageMeter(tmp / "usage.sqlite", EPOCH, clock=self.clock)
        self.failures = 0
        self.settlement = Settlement(
            self.meter, rpc_url=info.rpc_url, ledger_address=info.ledger_address, ipfs_api=info.ipfs_api,
            key_file=tmp / "node.key", reports_dir=tmp / "reports", devnet=True, clock=self.clock,
            on_failure=self.failed,
        )  # fmt: skip
        self.ledger = LedgerClient(self.w3, info.ledger_address)

    def failed(self) -> None:
        self.failures += 1

    def chain_now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def meter_usage(
        self, units: int, authors: list[str], client: Any = None, spent: int = 0, authorized: int = 0
    ) -> int:
        """Meter one answer; `client` (an account) spent `spent` credits, having let this node charge it
        up to `authorized` this epoch."""
        served = [Served(f"e{i}-{secrets.token_hex(2)}", a, True) for i, a in enumerate(authors)]
        spend = None
        if spent:
            spend = sign_spend_authorization(
                client, self.w3.eth.chain_id, self.info.ledger_address, self.key.address,
                self.meter.epoch_of(), authorized,
            )  # fmt: skip
        address = client.address if client is not None else ""
        now = self.meter.now()  # the receipt is stamped, and the usage metered, by the meter's clock
        receipt = sign(
            Receipt(self.key.address, "0x" + "11" * 32, ZERO32, ZERO32, "0x" + secrets.token_hex(32),
                    "0x" + "22" * 32, "0x" + "33" * 32, units - 1, 1, int(now), address or ZERO_ADDRESS),
            self.key.key,
        )  # fmt: skip
        leaf = MeteredReceipt.of(receipt, credited_of(served), spent).leaf()
        usage = self.meter.usage_of(units, served, address, spent, spend, self.meter.epoch_of(now), leaf)
        self.meter.submit(usage).result(timeout=10)
        return usage.epoch

    def end_epoch(self, epoch: int) -> None:
        """Move both clocks past the end of `epoch`."""
        end = (epoch + 1) * EPOCH
        self.clock.t = max(self.clock.t, end + 1)
        if self.chain_now() <= end:
            warp(self.w3, end + 1 - self.chain_now())

    def register(self) -> None:
        """Registered by the DAO's vote, which moves the chain on: the node's clock follows it (as a real
        node's and the chain's agree), so what it meters next is after its registration."""
        DevDao.of(self.info).call(
            self.info.ledger_address, self.ledger.governor_call("registerNode", self.key.address)
        )
        self.clock.t = max(self.clock.t, self.chain_now())


@pytest.fixture
def node(devnet: DevnetInfo, tmp_path: Path) -> Iterator[Node]:
    n = Node(devnet, tmp_path)
    yield n
    n.meter.close()


def test_an_ended_epoch_is_reported_claimed_and_its_spends_applied(node: Node, devnet: DevnetInfo) -> None:
    holder = Account.create()
    give_credits(devnet, holder, 1_000)
    node.clock.t = node.chain_now()  # give_credits moved the chain on
    node.settlement.connect()
    # Not registered: nothing is posted, the usage stays, the component says why.
    authors = [AUTHOR.address, "job:tfgrpo-1", AUTHOR.address]
    epoch = node.meter_usage(90, authors, holder, spent=40, authorized=100)
    node.meter_usage(10, [AUTHOR.address])
    node.end_epoch(epoch)
    assert node.settlement.settle_once() is None
    assert node.settlement._state is State.DEGRADED and "propose-node" in node.settlement._detail
    assert node.ledger.report(node.key.address, epoch) is None and epoch not in node.meter.settled_epochs()

    # Registered now: the ledger takes no report for an epoch before the registration (nobody could
    # backdate usage), so that epoch is dropped, logged, and its unsettled spend no longer counted.
    node.register()
    done = node.settlement.settle_once()
    assert done is not None and done.dropped == [epoch] and not done.posted, done
    assert epoch in node.meter.settled_epochs() and node.meter.spent_unsettled(holder.address) == 0
    assert node.ledger.report(node.key.address, epoch) is None

    epoch = node.meter_usage(90, authors, holder, spent=40, authorized=100)
    node.meter_usage(10, [AUTHOR.address])
    node.end_epoch(epoch)
    done = node.settlement.settle_once()
    assert done is not None and done.posted == [epoch], done
    posted = node.ledger.report(node.key.address, epoch)
    assert posted is not None and posted.tree_size == 2  # the author's earnings, the holder's spend
    # Anyone can fetch the content and check it against the root; the job author is listed, unclaimable.
    with IpfsClient(devnet.ipfs_api) as ipfs:
        report = fetch_report(ipfs, posted)
    assert report.node == node.key.address and report.epoch == epoch
    assert report.find(EARNED, AUTHOR.address)[1].units == 70  # type: ignore[index]
    assert report.unclaimable == {"job:tfgrpo-1": 30}
    spend = report.find(SPENT, holder.address)[1]  # type: ignore[index]
    assert spend.units == 40 and spend.authorized == 100 and len(spend.signature) == 65
    assert posted.earned_units == 70
    # A second round in the challenge window neither posts again nor applies anything.
    again = node.settlement.settle_once()
    assert again is not None and again.waiting == [epoch] and not again.posted
    assert node.ledger.spent(holder.address) == 0 and node.meter.spent_unsettled(holder.address) == 40

    warp(node.w3, WINDOW + 1)
    done = node.settlement.settle_once()
    assert done is not None and done.applied == [epoch]
    assert node.ledger.spent(holder.address) == 40 and node.ledger.balance(holder.address) == 960
    assert node.meter.spent_unsettled(holder.address) == 0 and epoch in node.meter.settled_epochs()
    # The author claims with a proof from the published content; once only.
    index, record = report.find(EARNED, AUTHOR.address)  # type: ignore[misc]
    author = LedgerClient(node.w3, devnet.ledger_address, AUTHOR)
    author.claim(node.key.address, epoch, record.units, index, report.tree().prove(index).path)
    assert author.balance(AUTHOR.address) >= 70
    with pytest.raises(ContractRevert) as twice:
        author.claim(node.key.address, epoch, record.units, index, report.tree().prove(index).path)
    assert twice.value.error == "AlreadySettled"
    final = node.settlement.settle_once()
    assert final is not None and final.describe() == "nothing to settle"


def test_an_epoch_with_nothing_claimable_is_settled_without_a_report(node: Node) -> None:
    node.register()
    epoch = node.meter_usage(50, ["job:only-a-job"])
    node.end_epoch(epoch)
    done = node.settlement.settle_once()
    assert done is not None and done.skipped == [epoch] and not done.posted
    assert node.ledger.report(node.key.address, epoch) is None and epoch in node.meter.settled_epochs()


def test_a_report_whose_kept_content_was_altered_is_not_applied(node: Node) -> None:
    node.register()
    account = Account.create()
    client = account.address
    epoch = node.meter_usage(20, [AUTHOR.address], account, spent=5, authorized=10)
    node.end_epoch(epoch)
    assert node.settlement.settle_once().posted == [epoch]  # type: ignore[union-attr]
    kept = node.settlement.reports_dir / f"epoch-{epoch}.json"
    kept.write_bytes(kept.read_bytes().replace(b'"units":5', b'"units":6'))
    warp(node.w3, WINDOW + 1)
    with pytest.raises(ReportError, match="root"):
        node.settlement.settle_once()
    assert epoch not in node.meter.settled_epochs() and node.ledger.spent(client) == 0
    kept.unlink()  # without the kept file, the content comes from IPFS, checked against the root
    assert node.settlement.settle_once().applied == [epoch]  # type: ignore[union-attr]


def test_a_failing_chain_degrades_settlement_and_loses_nothing(node: Node, devnet: DevnetInfo) -> None:
    import asyncio

    broken = Settlement(
        node.meter, rpc_url="http://127.0.0.1:9", ledger_address=devnet.ledger_address, ipfs_api=None,
        key_file=node.settlement.key_file, reports_dir=node.settlement.reports_dir, poll_s=0.05,
        on_failure=node.failed,
    )  # fmt: skip
    epoch = node.meter_usage(10, [AUTHOR.address])

    async def two_rounds() -> tuple[State, str]:
        task = asyncio.create_task(broken.run_forever())
        for _ in range(200):
            await asyncio.sleep(0.05)
            if node.failures >= 2:
                break
        task.cancel()
        return await broken.probe()

    state, detail = asyncio.run(two_rounds())
    assert node.failures >= 2 and state is State.DEGRADED and "Connection" in detail, detail
    assert epoch in node.meter.epochs() and epoch not in node.meter.settled_epochs()


def test_a_spend_without_the_clients_consent_is_neither_metered_nor_reported(node: Node) -> None:
    client = Account.create()
    served = [Served("e", AUTHOR.address, True)]
    with pytest.raises(ValueError, match="authorization"):
        node.meter.usage_of(10, served, client.address, 5)  # no authorization at all
    other = sign_spend_authorization(
        Account.create(), node.w3.eth.chain_id, node.info.ledger_address, node.key.address,
        node.meter.epoch_of(), 100,
    )  # fmt: skip
    with pytest.raises(ValueError, match="authorization"):
        node.meter.usage_of(10, served, client.address, 5, other)  # someone else's
    # A spend metered without an authorization (a meter written before consent existed) stays out.
    report = build_report(node.key.address, 3, EPOCH, {AUTHOR.address: 10}, {client.address: 5}, cap=100)
    assert [r.kind for r in report.records] == [EARNED]


def test_reports_are_canonical_capped_and_refuse_bad_content() -> None:
    a, b, c = (Account.create().address for _ in range(3))
    consent = {b: sign_spend_authorization(Account.create(), 1, a, a, 7, 12)}
    consent[b] = dataclasses.replace(consent[b], client=b)
    report = build_report(a, 7, EPOCH, {b: 600, c: 300, "job:x": 5, a.lower(): 100}, {b: 9}, 500, consent)
    # Scaled to the cap by one factor; an address in any case is one author; a job author earns nothing.
    assert report.earned_before_cap == 1000 and report.unclaimable == {"job:x": 5}
    assert {r.account: r.units for r in report.records if r.kind == EARNED} == {b: 300, c: 150, a: 50}
    assert [(r.kind, r.account) for r in report.records] == sorted(
        (r.kind, r.account) for r in report.records
    )
    again = Report.decode(report.encode())
    assert again == report and again.encode() == report.encode()
    assert again.tree().root == report.tree().root
    for bad, match in [
        (b"{}", "format"),
        (report.encode().replace(b'"epoch":7', b'"epoch":-1'), "epoch"),
        (report.encode().replace(b'"kind":"spent"', b'"kind":"stolen"'), "kind"),
        (report.encode().replace(b'"authorized":12', b'"authorized":8'), "authorized only 8"),
        (report.encode().replace(b'"authorized":12,', b""), "carries authorized and signature"),
        (report.encode().replace(b'"format"', b'"extra":1,"format"'), "extra"),
        (b"not json", "usage report"),
    ]:
        with pytest.raises(ReportError, match=match):
            Report.decode(bad)
    root, size, earned = report.tree().root, len(report.records), report.earned_units
    with pytest.raises(ReportError, match="node"):
        report.check_against(UsageReport(b, 7, root, size, 1, False, False, earned, 0, "cid"))
    with pytest.raises(ReportError, match="earn"):
        report.check_against(UsageReport(a, 7, root, size, 1, False, False, earned + 1, 0, "cid"))


def test_credits_show_and_claim_from_the_cli(
    node: Node, devnet: DevnetInfo, devnet_dir: Path, tmp_path: Path
) -> None:
    author = Account.create()
    node.w3.eth.send_transaction({"from": dev_account(0).address, "to": author.address, "value": 10**17})
    env = {"AUTHOR_KEY": author.key.hex()}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return zoo("credits", *args, "--data-dir", str(devnet_dir), env=env)

    node.register()
    epoch = node.meter_usage(40, [author.address])
    node.end_epoch(epoch)
    assert node.settlement.settle_once().posted == [epoch]  # type: ignore[union-attr]
    shown = cli("show", author.address)
    assert shown.returncode == 0, shown.stderr
    assert "waiting" in shown.stdout and "challenge window" in shown.stdout, shown.stdout
    early = cli("claim", "--key", "env:AUTHOR_KEY")
    assert early.returncode == 0 and "claimed 0 now" in early.stdout and "not yet" in early.stdout, (
        early.stdout
    )
    warp(node.w3, WINDOW + 1)
    claimed = cli("claim", "--key", "env:AUTHOR_KEY")
    assert claimed.returncode == 0, claimed.stderr
    assert f"claimed 40 credits from node {node.key.address}, epoch {epoch}" in claimed.stdout, claimed.stdout
    assert node.ledger.balance(author.address) == 40
    again = cli("claim", "--key", "env:AUTHOR_KEY")
    assert again.returncode == 0 and "claimed 0 now; balance 40" in again.stdout, again.stdout
    listed = cli("show", author.address, "--json")
    doc = json.loads(listed.stdout)
    assert doc["balance"] == 40 and [r["status"] for r in doc["records"]] == ["claimed"], doc

    # A node posts a root that its CID's content does not give: shown as such, never claimed from.
    liar = Node(devnet, tmp_path / "liar")
    try:
        liar.settlement.connect()
        liar.register()
        lie_epoch = liar.chain_now() // EPOCH  # its registration's epoch, once it has ended
        liar.end_epoch(lie_epoch)
        honest = build_report(liar.key.address, lie_epoch, EPOCH, {author.address: 5}, {}, cap=10**6)
        with IpfsClient(devnet.ipfs_api) as ipfs:
            cid = ipfs.add(honest.encode())
        inflated = build_report(liar.key.address, lie_epoch, EPOCH, {author.address: 500}, {}, cap=10**6)
        liar.settlement.ledger.post_report(
            lie_epoch, inflated.tree().root, tree_size=1, earned_units=5, cid=cid
        )
    finally:
        liar.meter.close()
    warp(node.w3, WINDOW + 1)
    bad = cli("show", author.address, "--node", liar.key.address)
    assert bad.returncode == 1 and "content mismatch" in bad.stdout and "not the" in bad.stdout, bad.stdout
    refused = cli("claim", "--key", "env:AUTHOR_KEY", "--node", liar.key.address)
    assert refused.returncode == 1 and "content mismatch" in refused.stderr, refused.stderr
    assert node.ledger.balance(author.address) == 40
    assert cli("show", "0x1234").returncode == 2  # bad input is a usage error


def test_a_posted_report_is_audited_against_its_receipts_from_the_cli(
    node: Node, devnet: DevnetInfo, devnet_dir: Path, tmp_path: Path
) -> None:
    author, client = Account.create(), Account.create()
    give_credits(devnet, client, 1_000)
    node.clock.t = node.chain_now()

    def audit(who: Node, epoch: int, *more: str) -> subprocess.CompletedProcess[str]:
        return zoo("credits", "audit", who.key.address, str(epoch), *more, "--data-dir", str(devnet_dir))

    node.register()
    epoch = node.meter_usage(40, [author.address])
    node.meter_usage(30, [author.address, AUTHOR.address], client, spent=30, authorized=50)
    node.end_epoch(epoch)
    assert node.settlement.settle_once().posted == [epoch]  # type: ignore[union-attr]
    posted = node.ledger.report(node.key.address, epoch)
    assert posted is not None
    with IpfsClient(devnet.ipfs_api) as ipfs:
        report = fetch_report(ipfs, posted)
        assert report.receipts is not None and report.receipts.size == 2
        published = ipfs.fetch_verified(report.receipts.cid)
    kept = node.settlement.reports_dir / f"epoch-{epoch}.receipts.json"
    assert (
        published
        == kept.read_bytes()
        == encode_document(node.key.address, epoch, node.meter.receipt_leaves(epoch))
    )
    assert [m.spent for m in ReceiptsDocument.decode(published).receipts] == [0, 30]
    ok = audit(node, epoch, "--account", author.address)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "every record follows from its 2 signed receipts" in ok.stdout, ok.stdout
    doc = json.loads(audit(node, epoch, "--account", author.address, "--json").stdout)
    assert doc["problems"] == [] and [(r["index"], r["units"]) for r in doc["behind"]] == [
        (0, 40),
        (1, 15),
    ], doc
    spends = json.loads(audit(node, epoch, "--account", client.address, "--json").stdout)["behind"]
    assert [(r["record"], r["units"]) for r in spends] == [("spent", 30)], spends

    # A node whose posted records (and root) earn an author more than its published receipts give: the
    # chain's root matches the content, so only the receipts show the lie.
    liar = Node(devnet, tmp_path / "liar")
    try:
        liar.settlement.connect()
        liar.register()
        lie_epoch = liar.meter_usage(5, [author.address])
        liar.end_epoch(lie_epoch)
        leaves = liar.meter.receipt_leaves(lie_epoch)
        with IpfsClient(devnet.ipfs_api) as ipfs:
            ref = receipts_ref(ipfs.add(encode_document(liar.key.address, lie_epoch, leaves)), leaves)
            inflated = build_report(
                liar.key.address, lie_epoch, EPOCH, {author.address: 500}, {}, 10**6, {}, ref
            )
            cid = ipfs.add(inflated.encode())
        liar.settlement.ledger.post_report(
            lie_epoch, inflated.tree().root, tree_size=1, earned_units=500, cid=cid
        )
    finally:
        liar.meter.close()
    # Challenged (within the window), the DAO's review of the resolution shows the same evidence.
    dao = ("--data-dir", str(devnet_dir))
    challenged = zoo("credits", "challenge", liar.key.address, str(lie_epoch), "--reason", "inflated",
                     "--key", "dev1", *dao)  # fmt: skip
    assert challenged.returncode == 0, challenged.stderr
    proposed = zoo("dao", "propose-resolve", liar.key.address, str(lie_epoch), "--uphold", *dao)
    assert proposed.returncode == 0, proposed.stderr
    pid = re.search(r"proposed (0x[0-9a-f]{64})", proposed.stdout)
    assert pid is not None, proposed.stdout
    reviewed = zoo("dao", "review", pid.group(1), *dao)
    assert reviewed.returncode == 0, reviewed.stderr
    assert "the challenged report is not borne out by its 1 receipts" in reviewed.stdout, reviewed.stdout
    assert "reports 500; its receipts give 5" in reviewed.stdout, reviewed.stdout
    caught = audit(liar, lie_epoch)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert f"earned record of {author.address}: reports 500; its receipts give 5" in caught.stderr, (
        caught.stderr
    )
    missing = audit(node, epoch + 50)
    assert missing.returncode == 2 and "posted no report" in missing.stderr, missing.stderr
