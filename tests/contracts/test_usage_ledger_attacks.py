"""UsageLedger on anvil, two attacks an adversarial run found, refused beside the honest path:

- re-registration revived frozen reports: deregistering a node made its reports unclaimable, registering the
  same address again made them claimable at once (settlement checked only the current registration). A
  report now counts only under the registration it was posted in.
- a challenge the DAO never resolved locked its bond and froze its report forever. The DAO now has
  `resolutionPeriod` seconds; after that anyone settles the challenge: bond back, report released. A report
  is challenged at most once, so a lapsed challenge cannot be repeated to freeze it again for free.
"""

from __future__ import annotations

import pytest

from tests.contracts.ledger_support import (
    AUTHOR_A,
    CLIENT,
    GOVERNOR,
    KEEPER,
    NODE,
    consent,
    posted,
    sample,
)
from tests.contracts.support import DAY, TOKEN, World, refused
from zoo.registry.chain import deploy_ledger
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account

WINDOW = 2 * DAY
RESOLUTION = DAY  # shorter than the challenge window here, so a second challenge would still be in time
BOND = 10**17


@pytest.fixture(scope="module")
def ledger_address(deployed: World) -> str:
    return deploy_ledger(
        deployed.w3, dev_account(0), governor=deployed.address(GOVERNOR), keeper_token=deployed.token_address,
        epoch_length=DAY, challenge_window=WINDOW, challenge_threshold=TOKEN, challenge_bond=BOND,
        resolution_period=RESOLUTION, artifacts=deployed.artifacts,
    )  # fmt: skip


def test_registering_a_node_again_revives_none_of_its_earlier_reports(
    world: World, ledger_address: str
) -> None:
    """The attack: N's report frozen by a deregistration, N registered again (by a vote, or by a leftover
    proposal), the report claimed at once. Now it stays frozen; what N posts under the new registration is
    claimable."""
    report = sample(world)
    frozen = posted(world, ledger_address, report)
    world.advance(WINDOW)
    node, a, c = world.address(NODE), world.address(AUTHOR_A), world.address(CLIENT)
    gov, author = world.ledger(ledger_address, GOVERNOR), world.ledger(ledger_address, AUTHOR_A)
    stored = author.report(node, frozen)
    assert stored is not None and stored.registration == 1
    gov.deregister_node(node)
    with refused("NodeNotRegistered", node=node):
        author.claim(node, frozen, *report.proof(EARNED, a))
    gov.register_node(node)
    assert author.registration(node).number == 2 and author.registration(node).active
    ended = {"node": node, "epoch": frozen, "reportRegistration": 1, "currentRegistration": 2}
    with refused("ReportOfEndedRegistration", "which a deregistration ended", **ended):
        author.claim(node, frozen, *report.proof(EARNED, a))
    spend = consent(world, ledger_address, CLIENT, frozen, 40)
    with refused("ReportOfEndedRegistration", **ended):
        author.apply_spent(node, frozen, *report.proof(SPENT, c), spend)
    assert author.balance(a) == 0 and author.spent(c) == 0
    # Control: a report of the new registration is claimed and applied.
    fresh = posted(world, ledger_address, report)
    world.advance(WINDOW)
    assert author.report(node, fresh).registration == 2  # type: ignore[union-attr]
    author.claim(node, fresh, *report.proof(EARNED, a))
    author.apply_spent(
        node, fresh, *report.proof(SPENT, c), consent(world, ledger_address, CLIENT, fresh, 40)
    )
    assert author.balance(a) == 700 and author.spent(c) == 40
    # And registering again once more freezes that one too.
    gov.deregister_node(node)
    gov.register_node(node)
    with refused("ReportOfEndedRegistration", reportRegistration=2, currentRegistration=3):
        world.ledger(ledger_address, CLIENT).claim(node, fresh, *report.proof(EARNED, c))


def test_a_challenge_the_dao_leaves_unresolved_lapses_bond_back_report_released(
    world: World, ledger_address: str
) -> None:
    """The attack: a challenge nobody resolved held its bond and froze its report for good. Now, once the
    resolution period has passed, anyone settles it: the bond goes back, the report is claimable."""
    report = sample(world)
    epoch = posted(world, ledger_address, report)
    node, a, keeper_address = world.address(NODE), world.address(AUTHOR_A), world.address(KEEPER)
    keeper, anyone = world.ledger(ledger_address, KEEPER), world.ledger(ledger_address, 9)
    tx = keeper.challenge(node, epoch, "invented usage")
    challenged_at = world.block_time(tx.block_number)
    stored = keeper.report(node, epoch)
    assert stored is not None and stored.challenged_at == challenged_at
    closes = challenged_at + RESOLUTION
    with refused("ChallengeResolutionOpen", node=node, epoch=epoch, closesAt=closes):
        anyone.settle_lapsed_challenge(node, epoch)
    world.advance(closes - world.now())
    # The DAO's time is over: it can no longer resolve, and anyone settles.
    with refused("ChallengeResolutionClosed", node=node, epoch=epoch, closedAt=closes):
        world.ledger(ledger_address, GOVERNOR).resolve_challenge(node, epoch, False)
    anyone.settle_lapsed_challenge(node, epoch)
    settled = anyone.report(node, epoch)
    assert settled is not None and not settled.challenged and not settled.voided
    assert anyone.withdrawable(keeper_address) == BOND and anyone.withdrawable(node) == 0
    with refused("ReportNotChallenged", node=node, epoch=epoch):
        anyone.settle_lapsed_challenge(node, epoch)
    # Still inside the challenge window: the same challenger (or another) cannot freeze it again for free.
    assert world.now() < settled.posted_at + WINDOW
    for again in (KEEPER, 1):
        with refused("ReportAlreadyChallenged", node=node, epoch=epoch, challenger=keeper_address):
            world.ledger(ledger_address, again).challenge(node, epoch, "again")
    world.advance(WINDOW)
    author = world.ledger(ledger_address, AUTHOR_A)
    author.claim(node, epoch, *report.proof(EARNED, a))
    assert author.balance(a) == 700
    keeper.withdraw()
    assert world.w3.eth.get_balance(ledger_address) == 0


def test_the_dao_resolves_in_time_and_a_resolved_report_is_not_challenged_again(
    world: World, ledger_address: str
) -> None:
    """Control: within the resolution period the DAO's answer stands and nothing lapses; a second challenge
    of the dismissed report, still in its window, is refused (no leftover resolution could meet it)."""
    report = sample(world)
    epoch = posted(world, ledger_address, report)
    node, keeper_address = world.address(NODE), world.address(KEEPER)
    keeper = world.ledger(ledger_address, KEEPER)
    closes = world.block_time(keeper.challenge(node, epoch, "invented usage").block_number) + RESOLUTION
    world.advance(RESOLUTION - 10)
    world.ledger(ledger_address, GOVERNOR).resolve_challenge(node, epoch, False)
    assert keeper.withdrawable(node) == BOND and keeper.withdrawable(keeper_address) == 0
    world.advance(closes - world.now())
    with refused("ReportNotChallenged", node=node, epoch=epoch):
        keeper.settle_lapsed_challenge(node, epoch)
    with refused("ReportAlreadyChallenged", challenger=keeper_address):
        world.ledger(ledger_address, 1).challenge(node, epoch, "a second opinion")
