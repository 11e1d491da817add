"""UsageLedger on anvil, an attack an adversarial run found, refused beside the honest path:

- re-registration revived frozen reports: deregistering a node made its reports unclaimable, registering the
  same address again made them claimable at once (settlement checked only the current registration). A
  report now counts only under the registration it was posted in.
"""

from __future__ import annotations

import pytest

from tests.chain.ledger_support import (
    AUTHOR_A,
    CLIENT,
    GOVERNOR,
    NODE,
    consent,
    posted,
    sample,
)
from tests.chain.support import DAY, TOKEN, World, refused
from zoo.registry.chain import deploy_ledger
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account

WINDOW = 2 * DAY


@pytest.fixture(scope="module")
def ledger_address(deployed: World) -> str:
    return deploy_ledger(
        deployed.w3, dev_account(0), governor=deployed.address(GOVERNOR), keeper_token=deployed.token_address,
        epoch_length=DAY, challenge_window=WINDOW, challenge_threshold=TOKEN, artifacts=deployed.artifacts,
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
