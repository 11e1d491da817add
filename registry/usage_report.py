"""A node's usage report for one epoch: what it posts to the UsageLedger (the RFC 9162 root of its records)
and to IPFS (this content, canonical JSON), and how anyone checks the one against the other.

Records are (kind, account, units): EARNED units for each author whose `provenance.author` is an Ethereum
address, SPENT credits for each signed client that paid with them. A SPENT record carries, beside its leaf
(not in it), the client's signed consent that lets the ledger apply it: `authorized` (the units its
SpendAuthorization for this node and epoch allows, at least `units`) and `signature`; a spend without one
is left out (it could never be applied). Authors that are not addresses (a job's
"job:…" author, a name) cannot claim anything: their units are listed apart, outside the tree. When the
earned units exceed the ledger's per-report cap, every author's units are scaled down by the same factor
(floored) so the report stays postable; `earned_before_cap` says so. The leaves are in the order of
`records`, sorted by kind then account, so a report's bytes and root follow from its content alone.

Format 2 adds `receipts`: the CID, RFC 9162 root and size of the epoch's metered receipts (the node's
signed receipt of every answer it metered, each with what it credited: node/credits/receipt_log.py), so
the root a node posts commits, through the report's CID, to the evidence behind every record. Format 1
reports (no receipts) still read and check as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from eth_utils import is_address, to_checksum_address
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo.registry.chain.ledger import EARNED, SPENT, UsageReport, record_leaf
from zoo.registry.errors import ZooError
from zoo.registry.ipfs import IpfsClient
from zoo.registry.merkle import MerkleTree
from zoo.registry.spend import SpendAuthorization

FORMAT = "zoo.usage-report/2"
FORMAT_V1 = "zoo.usage-report/1"  # without receipts (what nodes before them posted)
KIND_NAMES = {EARNED: "earned", SPENT: "spent"}
_KINDS = {name: kind for kind, name in KIND_NAMES.items()}
MAX_RECORDS = 100_000


class ReportError(ZooError, ValueError):
    """Report content that is malformed or does not match what the ledger holds."""


@dataclass(frozen=True, order=True)
class Record:
    kind: int
    account: str  # checksummed
    units: int
    authorized: int = 0  # SPENT: what the client's spend authorization allows (not part of the leaf)
    signature: bytes = b""  # SPENT: the client's signature of that authorization

    @property
    def leaf(self) -> bytes:
        return record_leaf(self.kind, self.account, self.units)

    def authorization(self, node: str, epoch: int) -> SpendAuthorization:
        """A SPENT record's consent, as the ledger's applySpent takes it."""
        return SpendAuthorization(self.account, node, epoch, self.authorized, self.signature)


class _RecordModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kind: str = Field(pattern="^(earned|spent)$")
    account: str = Field(pattern="^0x[0-9a-fA-F]{40}$")
    units: int = Field(gt=0, lt=2**256)
    authorized: int | None = Field(default=None, gt=0, lt=2**256)
    signature: str | None = Field(default=None, pattern="^0x[0-9a-fA-F]{130}$")


class _ReceiptsModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    cid: str = Field(min_length=1, max_length=128, pattern="^[A-Za-z0-9]+$")
    root: str = Field(pattern="^0x[0-9a-f]{64}$")
    size: int = Field(ge=0, lt=2**63)


class _ReportModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    format: str = Field(pattern=f"^({FORMAT}|{FORMAT_V1})$")
    node: str = Field(pattern="^0x[0-9a-fA-F]{40}$")
    epoch: int = Field(ge=0)
    epoch_length: int = Field(gt=0)
    records: list[_RecordModel] = Field(max_length=MAX_RECORDS)
    unclaimable: dict[str, int] = Field(default_factory=dict, max_length=MAX_RECORDS)
    earned_before_cap: int | None = None
    receipts: _ReceiptsModel | None = None


@dataclass(frozen=True)
class ReceiptsRef:
    """Where an epoch's metered receipts are (an IPFS CID) and the RFC 9162 root and size of their tree."""

    cid: str
    root: bytes
    size: int


@dataclass(frozen=True)
class Report:
    node: str
    epoch: int
    epoch_length: int
    records: tuple[Record, ...]
    unclaimable: Mapping[str, int]  # authors that are not addresses -> units (not in the tree)
    earned_before_cap: int | None = None  # the earned total before scaling to the cap, when it was scaled
    receipts: ReceiptsRef | None = None  # None: a format 1 report, made before receipts were kept

    @property
    def earned_units(self) -> int:
        return sum(r.units for r in self.records if r.kind == EARNED)

    def tree(self) -> MerkleTree:
        return MerkleTree.from_leaves([r.leaf for r in self.records])

    def find(self, kind: int, account: str) -> tuple[int, Record] | None:
        """(leaf index, record) of `account`'s record of `kind`, or None."""
        wanted = to_checksum_address(account)
        for i, r in enumerate(self.records):
            if r.kind == kind and r.account == wanted:
                return i, r
        return None

    def encode(self) -> bytes:
        """Canonical JSON: sorted keys, no spaces, ASCII (format 1 when it holds no receipts reference)."""
        body: dict[str, object] = {
            "format": FORMAT if self.receipts is not None else FORMAT_V1,
            "node": self.node,
            "epoch": self.epoch,
            "epoch_length": self.epoch_length,
            "records": [_record_json(r) for r in self.records],
            "unclaimable": dict(sorted(self.unclaimable.items())),
        }
        if self.earned_before_cap is not None:
            body["earned_before_cap"] = self.earned_before_cap
        if self.receipts is not None:
            r = self.receipts
            body["receipts"] = {"cid": r.cid, "root": "0x" + r.root.hex(), "size": r.size}
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Report:
        """A report from its bytes (untrusted: fetched from IPFS); ReportError says what is wrong."""
        try:
            model = _ReportModel.model_validate_json(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "content"
            raise ReportError(f"not a usage report: {where}: {first['msg']}") from None
        if (model.format == FORMAT) != (model.receipts is not None):
            raise ReportError(f"not a usage report: receipts are in format {FORMAT} and only there")
        for i, r in enumerate(model.records):
            spent = r.kind == KIND_NAMES[SPENT]
            if spent and (r.authorized is None or r.signature is None):
                raise ReportError(
                    f"not a usage report: records.{i}: a spent record carries authorized and signature"
                )
            if spent and r.authorized is not None and r.authorized < r.units:
                raise ReportError(
                    f"not a usage report: records.{i}: spends {r.units}, authorized only {r.authorized}"
                )
            if not spent and (r.authorized is not None or r.signature is not None):
                raise ReportError(
                    f"not a usage report: records.{i}: only a spent record carries an authorization"
                )
        records = tuple(
            Record(
                _KINDS[r.kind], to_checksum_address(r.account), r.units, r.authorized or 0,
                bytes.fromhex(r.signature[2:]) if r.signature else b"",
            )
            for r in model.records
        )  # fmt: skip
        if list(records) != sorted(records) or len(set((r.kind, r.account) for r in records)) != len(records):
            raise ReportError("not a usage report: records must be sorted by kind and account, one per pair")
        receipts = None
        if model.receipts is not None:
            m = model.receipts
            receipts = ReceiptsRef(m.cid, bytes.fromhex(m.root[2:]), m.size)
        return cls(
            to_checksum_address(model.node), model.epoch, model.epoch_length, records,
            dict(model.unclaimable), model.earned_before_cap, receipts,
        )  # fmt: skip

    def check_against(self, posted: UsageReport) -> None:
        """Raise ReportError naming the first thing in which this content differs from the report the ledger
        holds."""
        if self.node != posted.node or self.epoch != posted.epoch:
            raise ReportError(
                f"the content is the report of node {self.node}, epoch {self.epoch}, not of node "
                f"{posted.node}, epoch {posted.epoch}"
            )
        if len(self.records) != posted.tree_size:
            raise ReportError(
                f"the content holds {len(self.records)} records; the ledger's root covers {posted.tree_size}"
            )
        got = self.tree().root
        if got != posted.root:
            raise ReportError(
                f"the content's records give root 0x{got.hex()}, not the ledger's 0x{posted.root.hex()}"
            )
        if self.earned_units != posted.earned_units:
            raise ReportError(
                f"the content's records earn {self.earned_units} units; "
                f"the ledger was told {posted.earned_units}"
            )


def _record_json(r: Record) -> dict[str, object]:
    body: dict[str, object] = {"kind": KIND_NAMES[r.kind], "account": r.account, "units": r.units}
    if r.kind == SPENT:
        body |= {"authorized": r.authorized, "signature": "0x" + r.signature.hex()}
    return body


def fetch_report(ipfs: IpfsClient, posted: UsageReport, timeout: float | None = None) -> Report:
    """A posted report's content from IPFS (by its CID), decoded and checked against the ledger's record;
    ReportError when it does not match, IpfsError when it cannot be fetched."""
    report = Report.decode(ipfs.fetch_verified(posted.cid, timeout=timeout))
    report.check_against(posted)
    return report


def build_report(
    node: str,
    epoch: int,
    epoch_length: int,
    earned_by_author: Mapping[str, int],
    spent_by_client: Mapping[str, int],
    cap: int,
    authorizations: Mapping[str, SpendAuthorization] | None = None,
    receipts: ReceiptsRef | None = None,
) -> Report:
    """The report of one epoch's metered usage (see the module docstring for the rules); a client's spend
    goes in with its authorization (by client), capped at what it allows, or not at all without one;
    `receipts` where the epoch's receipts were published (format 2)."""
    authorizations = authorizations or {}
    earned: dict[str, int] = {}
    unclaimable: dict[str, int] = {}
    for author, units in earned_by_author.items():
        if units <= 0:
            continue
        if is_address(author):
            key = to_checksum_address(author)
            earned[key] = earned.get(key, 0) + units
        else:
            unclaimable[author] = unclaimable.get(author, 0) + units
    total = sum(earned.values())
    before_cap = None
    if total > cap:
        before_cap = total
        earned = {a: u * cap // total for a, u in earned.items()}
    records = [Record(EARNED, a, u) for a, u in earned.items() if u > 0]
    for client, units in spent_by_client.items():
        consent = authorizations.get(client)
        if units > 0 and consent is not None:
            units = min(units, consent.units)
            records.append(
                Record(SPENT, to_checksum_address(client), units, consent.units, consent.signature)
            )
    return Report(
        to_checksum_address(node), epoch, epoch_length, tuple(sorted(records)), unclaimable, before_cap,
        receipts,
    )  # fmt: skip
