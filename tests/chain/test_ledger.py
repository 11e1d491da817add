"""UsageLedger on anvil: DAO-registered nodes post per-epoch usage reports (a Merkle root of earned and spent
records plus a CID), KEEPER holders challenge within a window, authors claim with proofs once, spending
lowers balances; every refusal is a decoded custom error with its values."""

from __future__ import annotations

import pytest

from tests.chain.support import DAY, TOKEN, World, refused
from zoo.registry.chain import deploy_ledger, record_leaf
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account
from zoo.registry.merkle import MerkleTree

GOVERNOR, NODE, OTHER_NODE = 4, 6, 7
AUTHOR_A, AUTHOR_B, CLIENT = 1, 2, 3
KEEPER, NOT_A_KEEPER = 0, 4
WINDOW = 2 * DAY
CAP = 10_000
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


@pytest.fixture(scope="module")
def ledger_address(deployed: World) -> str:
    return deploy_ledger(
        deployed.w3,
        dev_account(0),
        governor=deployed.address(GOVERNOR),
        keeper_token=deployed.token_address,
        epoch_length=DAY,
        challenge_window=WINDOW,
        max_units_per_report=CAP,
        challenge_threshold=TOKEN,
        artifacts=deployed.artifacts,
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
    a, b, c = world.address(AUTHOR_A), world.address(AUTHOR_B), world.address(CLIENT)
    return Report([(EARNED, a, 700), (EARNED, b, 300), (EARNED, c, 50), (SPENT, c, 40)])


def test_only_the_governor_registers_nodes(world: World, ledger_address: str) -> None:
    node = world.address(NODE)
    with refused("NotGovernor", caller=world.address(NODE)):
        world.ledger(ledger_address, NODE).register_node(node)
    gov = world.ledger(ledger_address, GOVERNOR)
    gov.register_node(node)
    assert gov.is_registered(node)
    with refused("NodeAlreadyRegistered", node=node):
        gov.register_node(node)
    gov.deregister_node(node)
    with refused("NodeNotRegistered", node=node):
        gov.deregister_node(node)


def test_a_report_is_claimed_with_proofs_once_after_the_window(world: World, ledger_address: str) -> None:
    report = sample(world)
    epoch = posted(world, ledger_address, report)
    node, a, c = world.address(NODE), world.address(AUTHOR_A), world.address(CLIENT)
    stored = world.ledger(ledger_address, AUTHOR_A).report(node, epoch)
    assert stored is not None and stored.root == report.tree.root and stored.cid == CID
    assert stored.tree_size == 4 and stored.earned_units == 1050 and not stored.challenged
    units, index, proof = report.proof(EARNED, a)
    author = world.ledger(ledger_address, AUTHOR_A)
    with refused("ChallengeWindowOpen", claimableAt=stored.posted_at + WINDOW):
        author.claim(node, epoch, units, index, proof)
    world.advance(WINDOW)
    receipt = author.claim(node, epoch, units, index, proof)
    assert author.balance(a) == 700 and author.settled(node, epoch, EARNED, a)
    assert receipt.gas_used < 120_000, receipt.gas_used
    with refused("AlreadySettled", account=a):
        author.claim(node, epoch, units, index, proof)
    # A wrong amount, or another author's record claimed by this one, proves nothing.
    with refused("InvalidProof", units=701):
        world.ledger(ledger_address, AUTHOR_B).claim(
            node, epoch, 701, *report.proof(EARNED, world.address(AUTHOR_B))[1:]
        )
    with refused("InvalidProof", account=world.address(AUTHOR_B)):
        world.ledger(ledger_address, AUTHOR_B).claim(node, epoch, units, index, proof)
    # The client earned 50 and spent 40 here: anyone applies the spend, its balance goes down.
    client = world.ledger(ledger_address, CLIENT)
    client.claim(node, epoch, *report.proof(EARNED, c))
    world.ledger(ledger_address, AUTHOR_B).apply_spent(node, epoch, c, *report.proof(SPENT, c))
    assert client.balance(c) == 10 and client.earned(c) == 50 and client.spent(c) == 40
    with refused("AlreadySettled", kind=SPENT):
        client.apply_spent(node, epoch, c, *report.proof(SPENT, c))
    assert world.ledger(ledger_address, CLIENT).report(node, epoch).claimed_units == 750  # type: ignore[union-attr]


def test_claims_never_exceed_what_the_report_declared(world: World, ledger_address: str) -> None:
    report = sample(world)
    epoch = posted(world, ledger_address, report, earned=800)  # the leaves say 1050
    world.advance(WINDOW)
    node = world.address(NODE)
    world.ledger(ledger_address, AUTHOR_A).claim(node, epoch, *report.proof(EARNED, world.address(AUTHOR_A)))
    with refused("ClaimOverCap", claimable=100, units=300):
        world.ledger(ledger_address, AUTHOR_B).claim(
            node, epoch, *report.proof(EARNED, world.address(AUTHOR_B))
        )


def test_bad_reports_are_refused_naming_what(world: World, ledger_address: str) -> None:
    report = sample(world)
    node = world.ledger(ledger_address, NODE)
    epoch = world.now() // DAY
    with refused("NodeNotRegistered", node=world.address(NODE)):
        node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=1, cid=CID)
    world.ledger(ledger_address, GOVERNOR).register_node(world.address(NODE))
    with refused("EpochNotEnded", epoch=epoch, endsAt=(epoch + 1) * DAY):
        node.post_report(epoch, report.tree.root, tree_size=4, earned_units=1, cid=CID)
    with refused("ZeroRoot"):
        node.post_report(epoch - 1, bytes(32), tree_size=4, earned_units=1, cid=CID)
    with refused("EmptyTree"):
        node.post_report(epoch - 1, report.tree.root, tree_size=0, earned_units=1, cid=CID)
    with refused("UnitsOverCap", units=CAP + 1, cap=CAP):
        node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=CAP + 1, cid=CID)
    with refused("InvalidCID", position=4):
        node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=1, cid="bafy gh")
    with refused("EmptyCID"):
        node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=1, cid="")
    receipt = node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=1050, cid=CID)
    assert receipt.gas_used < 200_000, receipt.gas_used  # six slots (the CID is two) and the event
    with refused("ReportExists", node=world.address(NODE), epoch=epoch - 1):
        node.post_report(epoch - 1, report.tree.root, tree_size=4, earned_units=1050, cid=CID)
    with refused("ReportNotFound", node=world.address(OTHER_NODE), epoch=epoch - 1):
        world.ledger(ledger_address, AUTHOR_A).claim(world.address(OTHER_NODE), epoch - 1, 1, 0, [])


def test_a_keeper_challenge_freezes_a_report_until_the_governor_resolves_it(
    world: World, ledger_address: str
) -> None:
    report = sample(world)
    epoch = posted(world, ledger_address, report)
    node, a = world.address(NODE), world.address(AUTHOR_A)
    with refused("InsufficientKeeperVotes", challenger=world.address(NOT_A_KEEPER), votes=0, threshold=TOKEN):
        world.ledger(ledger_address, NOT_A_KEEPER).challenge(node, epoch, "invented usage")
    keeper = world.ledger(ledger_address, KEEPER)
    keeper.challenge(node, epoch, "the CID's content does not hash to the root")
    with refused("ReportUnderChallenge", node=node, epoch=epoch):
        keeper.challenge(node, epoch, "again")
    world.advance(WINDOW)
    author = world.ledger(ledger_address, AUTHOR_A)
    with refused("ReportUnderChallenge", node=node, epoch=epoch):
        author.claim(node, epoch, *report.proof(EARNED, a))
    with refused("NotGovernor", caller=world.address(KEEPER)):
        keeper.resolve_challenge(node, epoch, False)
    world.ledger(ledger_address, GOVERNOR).resolve_challenge(node, epoch, False)  # dismissed
    author.claim(node, epoch, *report.proof(EARNED, a))
    assert author.balance(a) == 700
    with refused("ReportNotChallenged", node=node, epoch=epoch):
        world.ledger(ledger_address, GOVERNOR).resolve_challenge(node, epoch, True)
    with refused("ChallengeWindowClosed"):
        keeper.challenge(node, epoch, "too late")


def test_an_upheld_challenge_voids_a_report_and_deregistration_freezes_claims(
    world: World, ledger_address: str
) -> None:
    report = sample(world)
    epoch = posted(world, ledger_address, report)
    node, a = world.address(NODE), world.address(AUTHOR_A)
    world.ledger(ledger_address, KEEPER).challenge(node, epoch, "invented usage")
    world.ledger(ledger_address, GOVERNOR).resolve_challenge(node, epoch, True)
    world.advance(WINDOW)
    with refused("ReportVoided", node=node, epoch=epoch):
        world.ledger(ledger_address, AUTHOR_A).claim(node, epoch, *report.proof(EARNED, a))
    # A second epoch's report, then the DAO deregisters the node: nothing more is claimable from it.
    later = posted(world, ledger_address, report)
    world.advance(WINDOW)
    world.ledger(ledger_address, GOVERNOR).deregister_node(node)
    with refused("NodeNotRegistered", node=node):
        world.ledger(ledger_address, AUTHOR_A).claim(node, later, *report.proof(EARNED, a))
    assert world.ledger(ledger_address, AUTHOR_A).balance(a) == 0


def test_the_contract_leaf_is_the_python_leaf(world: World, ledger_address: str) -> None:
    client = world.ledger(ledger_address, AUTHOR_A)
    for kind, units in ((EARNED, 0), (SPENT, 2**256 - 1), (EARNED, 12345)):
        assert client.leaf(kind, world.address(CLIENT), units) == record_leaf(
            kind, world.address(CLIENT), units
        )
    params = client.params()
    assert (
        params.epoch_length == DAY
        and params.challenge_window == WINDOW
        and params.max_units_per_report == CAP
    )


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"epoch_length": 0}, "epochLength"),
        ({"challenge_window": 0}, "challengeWindow"),
        ({"max_units_per_report": 0}, "maxUnitsPerReport"),
        ({"challenge_threshold": 0}, "challengeThreshold"),
        ({"governor": "0x" + "00" * 20}, "governor"),
        ({"keeper_token": "0x" + "00" * 19 + "01"}, "keeperToken"),
    ],
)
def test_bad_constructor_arguments_are_refused_by_name(world: World, override: dict, name: str) -> None:
    kwargs: dict = {"governor": world.address(GOVERNOR), "keeper_token": world.token_address}
    kwargs.update(override)
    with refused("InvalidParameter", name=name):
        deploy_ledger(world.w3, dev_account(0), artifacts=world.artifacts, **kwargs)
