"""The receipts behind a usage report (node.credits.receipt_log) with a real meter (SQLite on disk) and
real signatures: an epoch's receipts are committed with its usage, the report built from the meter is
borne out by them, and each way a report or its receipts can lie is named by the audit."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account

from tests.node.provenance.test_receipts import node_key, receipt_of
from zoo.node.credits.meter import Served, UsageMeter, credited_of
from zoo.node.credits.metered_receipt import MeteredReceipt
from zoo.node.credits.receipt_log import (
    FORMAT,
    ReceiptsDocument,
    audit,
    behind,
    encode_document,
    receipts_ref,
)
from zoo.node.provenance.receipts import ZERO_ADDRESS, sign
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.errors import ValidationError
from zoo.registry.spend import SpendAuthorization
from zoo.registry.usage_report import Report, ReportError, build_report

EPOCH_S = 600
T0 = 1_790_000_000 // EPOCH_S * EPOCH_S  # the start of an epoch
A, B = Account.create().address, Account.create().address


@dataclass
class Clock:
    t: float

    def __call__(self) -> float:
        return self.t


class Metered:
    """A node's key and meter: `answer` meters one answer as the node's metering does (its receipt signed,
    stamped by the meter's clock, committed with its usage)."""

    def __init__(self, tmp: Path) -> None:
        self.secret, self.node = node_key()
        self.clock = Clock(T0 + 5)
        self.meter = UsageMeter(tmp / "usage.sqlite", EPOCH_S, clock=self.clock)

    def answer(self, tokens: int, served: list[Served], client: str = "", spent: int = 0) -> MeteredReceipt:
        now = self.meter.now()
        epoch = self.meter.epoch_of(now)
        spend = None
        if spent:  # what the client signed (its signature is not what this test is about)
            spend = SpendAuthorization(client, self.node, epoch, 1_000, b"\x01" * 65)
        receipt = sign(
            receipt_of(self.node, prompt_tokens=tokens - 2, completion_tokens=2, timestamp=int(now),
                       client=client or ZERO_ADDRESS),
            self.secret,
        )  # fmt: skip
        metered = MeteredReceipt.of(receipt, credited_of(served), spent)
        usage = self.meter.usage_of(tokens, served, client, spent, spend, epoch, metered.leaf())
        self.meter.submit(usage).result(timeout=10)
        self.clock.t += 7
        return metered

    def report(
        self, epoch: int, cap: int = 10**9, cid: str = "bafkreiexample"
    ) -> tuple[Report, ReceiptsDocument]:
        """The report settlement builds from the meter, naming the receipts as published under `cid`."""
        leaves = self.meter.receipt_leaves(epoch)
        report = build_report(
            self.node, epoch, EPOCH_S, {a.author: a.units for a in self.meter.by_author(epoch)},
            self.meter.spent_by_client(epoch), cap, self.meter.authorizations(epoch, self.node),
            receipts_ref(cid, leaves),
        )  # fmt: skip
        return report, ReceiptsDocument.decode(encode_document(self.node, epoch, leaves))


@pytest.fixture
def metered(tmp_path: Path):
    m = Metered(tmp_path)
    yield m
    m.meter.close()


def served(*pairs: tuple[str, str, bool]) -> list[Served]:
    return [Served(i, a, c) for i, a, c in pairs]


def test_the_report_a_meter_gives_is_borne_out_by_its_receipts(metered: Metered) -> None:
    epoch = T0 // EPOCH_S
    client = Account.create().address
    first = metered.answer(31, served(("e1", A, True), ("e2", B, False)))  # cited e1 only: A earns all 31
    metered.answer(20, served(("e1", A, False), ("e2", B, False)), client, spent=20)  # none cited: 10 each
    metered.answer(9, served(("e3", "job:tfgrpo-1", True)))  # an author that is no address
    report, document = metered.report(epoch)
    assert [r.leaf() for r in document.receipts] == metered.meter.receipt_leaves(epoch)
    assert document.receipts[0] == first and report.receipts is not None and report.receipts.size == 3
    assert audit(report, document, cap=10**9) == []
    assert {(r.kind, r.account): r.units for r in report.records} == {
        (EARNED, A): 41,
        (EARNED, B): 10,
        (SPENT, client): 20,
    }
    # The receipts behind each record, with what each gave it.
    assert [(i, u) for i, _, u in behind(document.receipts, EARNED, A)] == [(0, 31), (1, 10)]
    assert [(i, u) for i, _, u in behind(document.receipts, EARNED, B.lower())] == [(1, 10)]
    assert [(i, u) for i, _, u in behind(document.receipts, SPENT, client)] == [(1, 20)]
    # The report's bytes carry the reference (format 2) and read back as they were.
    again = Report.decode(report.encode())
    assert again == report and json.loads(report.encode())["format"] == "zoo.usage-report/2"
    # Capped reports are recomputed under the same cap.
    capped, document = metered.report(epoch, cap=17)
    assert capped.earned_before_cap == 51 and audit(capped, document, cap=17) == []


def test_an_epoch_whose_answers_cross_its_end_keeps_each_receipt_in_its_own(metered: Metered) -> None:
    epoch = T0 // EPOCH_S
    metered.answer(10, served(("e1", A, True)))
    metered.clock.t = T0 + EPOCH_S - 0.5  # the last half second of the epoch, then the next
    metered.answer(10, served(("e1", A, True)))
    metered.clock.t = T0 + EPOCH_S
    metered.answer(10, served(("e1", A, True)))
    assert len(metered.meter.receipt_leaves(epoch)) == 2 and len(metered.meter.receipt_leaves(epoch + 1)) == 1
    for e in (epoch, epoch + 1):
        assert audit(*metered.report(e), cap=10**9) == []


def test_each_way_a_report_or_its_receipts_can_lie_is_named(metered: Metered) -> None:
    epoch = T0 // EPOCH_S
    client = Account.create().address
    metered.answer(30, served(("e1", A, True)))
    metered.answer(12, served(("e2", B, True)), client, spent=12)
    report, document = metered.report(epoch)

    # Records inflated beyond their receipts (the root posted on chain matches these records).
    inflated = build_report(
        report.node, epoch, EPOCH_S, {A: 300, B: 12}, {client: 12}, 10**9,
        {client: report.records[-1].authorization(report.node, epoch)}, report.receipts,
    )  # fmt: skip
    assert audit(inflated, document, 10**9) == [f"earned record of {A}: reports 300; its receipts give 30"]
    # An author left out (under-reporting is named too). A client's spend left out is not: without its
    # consent, which only the report carries, it could never be applied (it is the client's gain).
    dropped = build_report(report.node, epoch, EPOCH_S, {A: 30}, {}, 10**9, {}, report.receipts)
    assert audit(dropped, document, 10**9) == [f"earned record of {B}: missing; its receipts give 12 units"]
    # A receipt altered after signing: its signature no longer recovers to the node, and the root moves.
    altered = dataclasses.replace(
        document.receipts[0], receipt=dataclasses.replace(document.receipts[0].receipt, prompt_tokens=280)
    )
    forged = ReceiptsDocument(document.node, epoch, (altered, document.receipts[1]))
    problems = audit(report, forged, 10**9)
    assert any("receipt 0:" in p and "forged or altered" in p for p in problems), problems
    assert any("the receipts give root" in p for p in problems), problems
    assert any(f"earned record of {A}: reports 30; its receipts give 282" in p for p in problems), problems
    # Receipts another node signed, passed off as this node's.
    other_secret, other = node_key()
    theirs = sign(dataclasses.replace(document.receipts[0].receipt, node=other, signature=""), other_secret)
    first = dataclasses.replace(document.receipts[0], receipt=theirs)
    borrowed = ReceiptsDocument(document.node, epoch, (first, document.receipts[1]))
    assert any("is node" in p and "not the reporting node's" in p for p in audit(report, borrowed, 10**9))
    # A receipt stamped outside the epoch (answers of another epoch counted in this one).
    late = sign(dataclasses.replace(document.receipts[0].receipt, timestamp=T0 + EPOCH_S, signature=""),
                metered.secret)  # fmt: skip
    moved = ReceiptsDocument(document.node, epoch, (dataclasses.replace(document.receipts[0], receipt=late),
                                                      document.receipts[1]))  # fmt: skip
    assert any("outside epoch" in p for p in audit(report, moved, 10**9))
    # A receipt twice in the log counts twice (identical receipts can be two honest answers: the same
    # anonymous request, the same answer, the same second), so a report that counts it once is named.
    replayed = ReceiptsDocument(document.node, epoch, (*document.receipts, document.receipts[0]))
    problems = audit(report, replayed, 10**9)
    assert f"earned record of {A}: reports 30; its receipts give 60" in problems, problems
    # Another epoch's receipts named by this report.
    elsewhen = ReceiptsDocument(document.node, epoch + 1, document.receipts)
    assert any("not node" in p for p in audit(report, elsewhen, 10**9))
    # A format 1 report names none.
    assert audit(dataclasses.replace(report, receipts=None), document, 10**9) == [
        "the report is in format 1: it names no receipts"
    ]


def test_format_1_reports_still_read_and_format_2_requires_its_receipts(metered: Metered) -> None:
    metered.answer(10, served(("e1", A, True)))
    report, _ = metered.report(T0 // EPOCH_S)
    v1 = dataclasses.replace(report, receipts=None)
    assert b"zoo.usage-report/1" in v1.encode() and Report.decode(v1.encode()) == v1
    assert Report.decode(v1.encode()).tree().root == report.tree().root  # the chain's root is the records'
    text = report.encode()
    for bad, match in [
        (text.replace(b"zoo.usage-report/2", b"zoo.usage-report/1"), "receipts are in format"),
        (v1.encode().replace(b"zoo.usage-report/1", b"zoo.usage-report/2"), "receipts are in format"),
        (text.replace(b'"size":1', b'"size":-1'), "size"),
        (text.replace(b'"root":"0x', b'"root":"0xzz'), "root"),
    ]:
        with pytest.raises(ReportError, match=match):
            Report.decode(bad)


def test_a_receipts_document_that_is_malformed_is_refused_saying_where(metered: Metered) -> None:
    client = Account.create().address
    metered.answer(10, served(("e1", A, True)), client, spent=10)
    leaves = metered.meter.receipt_leaves(T0 // EPOCH_S)
    good = encode_document(metered.node, T0 // EPOCH_S, leaves)
    assert ReceiptsDocument.decode(good).encode() == good
    item = json.loads(leaves[0])
    cases = [
        (b"not json", "not JSON"),
        (b"[]", "must be an object"),
        (good.replace(FORMAT.encode(), b"zoo.usage-receipts/9"), "receipts.format"),
        (good.replace(b'"epoch":', b'"epoch":-'), "receipts.epoch"),
        (good.replace(b'"spent":10', b'"spent":-1'), r"receipts\[0\].spent"),
        (good.replace(b'"credited":[[', b'"credited":[["",'), r"credited\[0\]"),
        (good.replace(b'"prompt_tokens":', b'"prompt_tokens":"'), "receipt"),
        (json.dumps(json.loads(good), indent=1).encode(), "canonical"),
    ]
    anonymous = {**item, "receipt": {**item["receipt"], "client": ZERO_ADDRESS}}
    cases.append((encode_document(metered.node, T0 // EPOCH_S, [json.dumps(anonymous, sort_keys=True,
                  separators=(",", ":")).encode()]), "anonymous answer spends no credits"))  # fmt: skip
    unsorted = {**item, "credited": [["e2", A], ["e1", A]]}
    cases.append((encode_document(metered.node, T0 // EPOCH_S, [json.dumps(unsorted, sort_keys=True,
                  separators=(",", ":")).encode()]), "sorted"))  # fmt: skip
    for bad, match in cases:
        with pytest.raises(ValidationError, match=match):
            ReceiptsDocument.decode(bad)


def test_receipts_survive_the_meter_closing_and_reopening(tmp_path: Path) -> None:
    m = Metered(tmp_path)
    leaves = [m.answer(10, served(("e1", A, True))).leaf() for _ in range(3)]
    m.meter.close()
    reopened = UsageMeter(tmp_path / "usage.sqlite", EPOCH_S, read_only=True)
    try:
        assert reopened.receipt_leaves(T0 // EPOCH_S) == leaves
        assert reopened.answered(T0 // EPOCH_S) == (3, 30)
    finally:
        reopened.close()
