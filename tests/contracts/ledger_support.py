"""Shared pieces of the UsageLedger tests: the roles (dev account indexes), a report's records with their
tree and proofs, posting one, and a client's signed consent to spend."""

from __future__ import annotations

from tests.contracts.support import DAY, World
from zoo.registry.chain import SpendAuthorization, record_leaf, sign_spend_authorization
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account
from zoo.registry.merkle import MerkleTree

GOVERNOR, NODE, OTHER_NODE = 4, 6, 7
AUTHOR_A, AUTHOR_B, CLIENT = 1, 2, 3
KEEPER, NOT_A_KEEPER = 0, 4
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def consent(
    world: World, ledger_address: str, client: int, epoch: int, units: int, node: int = NODE
) -> SpendAuthorization:
    """Client `client` lets `node` charge it up to `units` credits in `epoch` (signed with its own key)."""
    return sign_spend_authorization(
        dev_account(client), world.w3.eth.chain_id, ledger_address, world.address(node), epoch, units
    )


class Report:
    """Records of one report, their tree and proofs."""

    def __init__(self, records: list[tuple[int, str, int]]) -> None:
        self.records = records
        self.tree = MerkleTree.from_leaves([record_leaf(*r) for r in records])

    def proof(self, kind: int, account: str) -> tuple[int, int, list[bytes]]:
        i = next(i for i, (k, a, _) in enumerate(self.records) if k == kind and a == account)
        return self.records[i][2], i, self.tree.prove(i).path

    @property
    def earned(self) -> int:
        return sum(u for k, _, u in self.records if k == EARNED)


def posted(
    world: World, ledger_address: str, report: Report, *, node: int = NODE, earned: int | None = None
) -> int:
    """Register `node` (if needed), let an epoch end, post `report` for it; returns the epoch."""
    gov = world.ledger(ledger_address, GOVERNOR)
    if not gov.is_registered(world.address(node)):
        gov.register_node(world.address(node))
    epoch = world.now() // DAY
    world.advance(DAY)
    world.ledger(ledger_address, node).post_report(
        epoch, report.tree.root, tree_size=len(report.records),
        earned_units=report.earned if earned is None else earned, cid=CID,
    )  # fmt: skip
    return epoch


def sample(world: World) -> Report:
    """Two authors' earned units and a client that earned 50 and spent 40."""
    a, b, c = world.address(AUTHOR_A), world.address(AUTHOR_B), world.address(CLIENT)
    return Report([(EARNED, a, 700), (EARNED, b, 300), (EARNED, c, 50), (SPENT, c, 40)])
