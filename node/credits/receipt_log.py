"""The receipts behind a usage report: every answer a node metered, as its signed receipt and what it
credited, published beside the report so anyone can check the report's records against them.

Each answer the meter commits carries a *metered receipt* (credits/metered_receipt.py: the node's
signed receipt of the answer, what it credited and what it cost its client). An epoch's metered receipts,
in the order the meter committed them, are one document (`zoo.usage-receipts/1`, canonical JSON) that
settlement adds to IPFS; each one's canonical JSON is a leaf of an RFC 9162 tree whose root and size,
with the document's CID, the report holds (registry/usage_report.py, format 2). The root the node posts
on chain covers the report's bytes by their CID, so it commits to these receipts too.

`audit` is what a challenger, or the DAO resolving a challenge, runs: the document must give the report's
root and size, every receipt must be signed by the reporting node and stamped inside the epoch, and the
records recomputed from the receipts by the rules that made them (meter.shares_of per answer, the ledger's
cap, each client's consent in the report) must be the posted records. What it cannot show: that the
answers were asked for (a node can sign receipts of answers to itself; docs/security.md, "Receipts").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from eth_utils import is_address, to_checksum_address

from zoo.node.credits.metered_receipt import MeteredReceipt, canonical_json
from zoo.node.credits.signing import SignatureError
from zoo.node.provenance.receipts import check
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.errors import ValidationError
from zoo.registry.merkle import MerkleTree
from zoo.registry.usage_report import KIND_NAMES, ReceiptsRef, Record, Report, build_report

FORMAT = "zoo.usage-receipts/1"
MAX_RECEIPTS = 2_000_000  # a day of 23 answers a second
MAX_DOCUMENT_BYTES = 2 * 1024**3  # what a reader fetches at most (about 1 KB a receipt)


def encode_document(node: str, epoch: int, leaves: Sequence[bytes]) -> bytes:
    """The epoch's receipts document from its leaves (each a metered receipt's canonical JSON), in order."""
    head = canonical_json(
        {"epoch": epoch, "format": FORMAT, "node": to_checksum_address(node), "receipts": []}
    )
    return head[: -len(b"]}")] + b",".join(leaves) + b"]}"


@dataclass(frozen=True)
class ReceiptsDocument:
    """An epoch's metered receipts as published."""

    node: str
    epoch: int
    receipts: tuple[MeteredReceipt, ...]

    @cached_property
    def leaves(self) -> tuple[bytes, ...]:
        """Each receipt's leaf, encoded once (decode's canonical check, the tree and encode share them)."""
        return tuple(r.leaf() for r in self.receipts)

    def tree(self) -> MerkleTree:
        return MerkleTree.from_leaves(list(self.leaves))

    def encode(self) -> bytes:
        return encode_document(self.node, self.epoch, self.leaves)

    @classmethod
    def decode(cls, data: bytes) -> ReceiptsDocument:
        """From its bytes (untrusted); ValidationError naming what is wrong, also for bytes that are not
        the document's canonical form (its tree would not be the one they name)."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValidationError("receipts", f"not JSON: {e}") from None
        if not isinstance(doc, dict) or set(doc) != {"format", "node", "epoch", "receipts"}:
            raise ValidationError("receipts", "must be an object with format, node, epoch and receipts")
        if doc["format"] != FORMAT:
            raise ValidationError("receipts.format", f"must be {FORMAT}, got {str(doc['format'])[:40]!r}")
        if not isinstance(doc["node"], str) or not is_address(doc["node"]):
            raise ValidationError("receipts.node", "must be an address")
        if type(doc["epoch"]) is not int or doc["epoch"] < 0:
            raise ValidationError("receipts.epoch", "must be a non-negative integer")
        items = doc["receipts"]
        if not isinstance(items, list) or len(items) > MAX_RECEIPTS:
            raise ValidationError("receipts.receipts", f"must be a list of at most {MAX_RECEIPTS}")
        receipts = tuple(MeteredReceipt.parse(r, f"receipts[{i}]") for i, r in enumerate(items))
        out = cls(to_checksum_address(doc["node"]), doc["epoch"], receipts)
        if out.encode() != data:
            raise ValidationError("receipts", "is not in canonical form (sorted keys, no spaces, ASCII)")
        return out


def behind(
    receipts: Sequence[MeteredReceipt], kind: int, account: str
) -> list[tuple[int, MeteredReceipt, int]]:
    """(leaf index, receipt, units) of the receipts that give `account` units of `kind`: an author's share
    of an answer that credited it (EARNED), a client's spend (SPENT)."""
    wanted = to_checksum_address(account) if is_address(account) else account
    found = []
    for i, m in enumerate(receipts):
        if kind == EARNED:
            units = sum(
                u for a, u in m.shares().items() if (to_checksum_address(a) if is_address(a) else a) == wanted
            )
        else:
            units = m.spent if m.receipt.client == wanted else 0
        if units > 0:
            found.append((i, m, units))
    return found


def audit(report: Report, document: ReceiptsDocument, cap: int) -> list[str]:
    """What in `report` its receipts do not bear out (empty: every record follows from them); `cap` is the
    ledger's max_units_per_report. See the module docstring for the checks."""
    ref = report.receipts
    if ref is None:
        return ["the report is in format 1: it names no receipts"]
    problems: list[str] = []
    tree = document.tree()
    if (document.node, document.epoch) != (report.node, report.epoch):
        problems.append(
            f"the receipts are node {document.node}'s of epoch {document.epoch}, not node {report.node}'s "
            f"of epoch {report.epoch}"
        )
    if tree.size != ref.size or tree.root != ref.root:
        problems.append(
            f"the receipts give root 0x{tree.root.hex()} over {tree.size}; the report names "
            f"0x{ref.root.hex()} over {ref.size}"
        )
    start, end = report.epoch * report.epoch_length, (report.epoch + 1) * report.epoch_length
    earned: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    # Two identical receipts are not told apart from two answers: the same anonymous request answered the
    # same way within one second signs the same receipt (and the node could sign a fresh one instead).
    for i, m in enumerate(document.receipts):
        r = m.receipt
        try:
            check(r)
        except SignatureError as e:
            problems.append(f"receipt {i}: {e}")
        if r.node != report.node:
            problems.append(f"receipt {i}: is node {r.node}'s, not the reporting node's")
        if not start <= r.timestamp < end:
            problems.append(
                f"receipt {i}: stamped {r.timestamp}, outside epoch {report.epoch} [{start}, {end})"
            )
        earned.update(m.shares())
        if m.spent:
            spent[r.client] += m.spent
    consents = {
        r.account: r.authorization(report.node, report.epoch) for r in report.records if r.kind == SPENT
    }
    expected = build_report(report.node, report.epoch, report.epoch_length, earned, spent, cap, consents, ref)
    problems += _record_differences(report.records, expected.records)
    if dict(expected.unclaimable) != dict(report.unclaimable):
        problems.append("the unclaimable units differ from what the receipts give")
    return problems


def _record_differences(posted: Sequence[Record], expected: Sequence[Record]) -> list[str]:
    units = {(r.kind, r.account): r.units for r in expected}
    problems = []
    for r in posted:
        want = units.pop((r.kind, r.account), 0)
        if r.units != want:
            name = KIND_NAMES[r.kind]
            problems.append(f"{name} record of {r.account}: reports {r.units}; its receipts give {want}")
    for (kind, account), want in sorted(units.items()):
        problems.append(f"{KIND_NAMES[kind]} record of {account}: missing; its receipts give {want} units")
    return problems


def receipts_ref(cid: str, leaves: Sequence[bytes]) -> ReceiptsRef:
    """The reference a report holds to an epoch's receipts published as `cid`."""
    tree = MerkleTree.from_leaves(list(leaves))
    return ReceiptsRef(cid, tree.root, tree.size)
