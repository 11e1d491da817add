"""UsageLedger on anvil: DAO-registered nodes post per-epoch usage reports (a Merkle root of earned and spent
records plus a CID), KEEPER holders challenge within a window, authors claim with proofs once, spending
lowers balances only with the client's signed consent; every refusal is a decoded custom error with its
values. Each attack an adversarial review found is here, refused, beside the honest path that still works."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from tests.contracts.ledger_support import (
    AUTHOR_A,
    AUTHOR_B,
    CID,
    CLIENT,
    GOVERNOR,
    KEEPER,
    NODE,
    NOT_A_KEEPER,
    OTHER_NODE,
    Report,
    consent,
    posted,
    sample,
)
from tests.contracts.support import DAY, TOKEN, World, refused
from zoo.registry.chain import (
    SpendAuthorization,
    deploy_ledger,
    record_leaf,
    sign_spend_authorization,
    spend_authorization_digest,
)
from zoo.registry.chain.ledger import EARNED, SPENT
from zoo.registry.keys import dev_account
from zoo.registry.spend import typed_spend_authorization

WINDOW = 2 * DAY
CAP = 10_000
REPORT_WINDOW = 3 * DAY
BOND = 10**17


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
        report_window=REPORT_WINDOW,
        challenge_bond=BOND,
        artifacts=deployed.artifacts,
    )


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
    # The client earned 50 and spent 40 here, having allowed this node 45 this epoch: anyone applies the
    # spend with that consent, its balance goes down.
    client = world.ledger(ledger_address, CLIENT)
    client.claim(node, epoch, *report.proof(EARNED, c))
    allowed = consent(world, ledger_address, CLIENT, epoch, 45)
    world.ledger(ledger_address, AUTHOR_B).apply_spent(node, epoch, *report.proof(SPENT, c), allowed)
    assert client.balance(c) == 10 and client.earned(c) == 50 and client.spent(c) == 40
    with refused("AlreadySettled", kind=SPENT):
        client.apply_spent(node, epoch, *report.proof(SPENT, c), allowed)
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
    with refused("NodeNotRegistered", node=world.address(NODE)):
        node.post_report(world.now() // DAY - 1, report.tree.root, tree_size=4, earned_units=1, cid=CID)
    world.ledger(ledger_address, GOVERNOR).register_node(world.address(NODE))
    world.advance(DAY)  # the registration's epoch (epoch - 1 below) has ended
    epoch = world.now() // DAY
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


def test_backdated_reports_are_refused_and_the_cap_bounds_units_per_epoch(
    world: World, ledger_address: str
) -> None:
    """The attack: a node registered today posted, in one block, a full-cap report for every past epoch
    since 1970 and claimed them all. Now only epochs from its registration on, within the report window."""
    report = sample(world)
    node = world.ledger(ledger_address, NODE)
    registered_in = world.now() // DAY
    world.ledger(ledger_address, GOVERNOR).register_node(world.address(NODE))
    assert node.first_epoch(world.address(NODE)) == registered_in
    world.advance(DAY)
    for past in (0, 1, registered_in - 365, registered_in - 1):
        with refused("EpochBeforeRegistration", epoch=past, firstEpoch=registered_in):
            node.post_report(past, report.tree.root, tree_size=4, earned_units=CAP, cid=CID)
    node.post_report(registered_in, report.tree.root, tree_size=4, earned_units=CAP, cid=CID)  # control
    # An epoch left unreported past its window stays unreported; one still inside it is accepted.
    world.advance(DAY + REPORT_WINDOW)
    late = registered_in + 1  # ended more than REPORT_WINDOW seconds ago
    with refused("ReportTooLate", epoch=late, deadline=(late + 1) * DAY + REPORT_WINDOW):
        node.post_report(late, report.tree.root, tree_size=4, earned_units=CAP, cid=CID)
    recent = world.now() // DAY - 1
    node.post_report(recent, report.tree.root, tree_size=4, earned_units=CAP, cid=CID)
    # Registering again (after a deregistration) starts from the new registration's epoch.
    gov = world.ledger(ledger_address, GOVERNOR)
    gov.deregister_node(world.address(NODE))
    world.advance(DAY)
    gov.register_node(world.address(NODE))
    again = world.now() // DAY
    with refused("EpochBeforeRegistration", epoch=again - 1, firstEpoch=again):
        node.post_report(again - 1, report.tree.root, tree_size=4, earned_units=CAP, cid=CID)


def test_a_node_cannot_spend_credits_a_client_never_allowed(world: World, ledger_address: str) -> None:
    """The attack: a report whose only record is SPENT(victim, 2**255), 0 earned; once the window passed,
    anyone applied it and the victim's balance was gone. Now a spend needs the victim's signature."""
    victim = world.address(CLIENT)
    earned = posted(world, ledger_address, sample(world))  # the victim earns 50 honestly
    world.advance(WINDOW)
    world.ledger(ledger_address, CLIENT).claim(
        world.address(NODE), earned, *sample(world).proof(EARNED, victim)
    )
    assert world.ledger(ledger_address, CLIENT).balance(victim) == 50
    theft = Report([(SPENT, victim, 2**255)])
    epoch = posted(world, ledger_address, theft, earned=0)
    world.advance(WINDOW)
    node, anyone = world.address(NODE), world.ledger(ledger_address, AUTHOR_A)
    units, index, proof = theft.proof(SPENT, victim)
    forged = sign_spend_authorization(  # the node signs "the victim allows 2**255" with its own key
        dev_account(NODE), world.w3.eth.chain_id, ledger_address, node, epoch, 2**255
    )
    as_victim = SpendAuthorization(victim, forged.node, epoch, 2**255, forged.signature)
    with refused("InvalidSpendAuthorization", client=victim, authorized=2**255):
        anyone.apply_spent(node, epoch, units, index, proof, as_victim)
    # The victim's real consent, but for little, for another node, for another epoch: none covers it.
    small = consent(world, ledger_address, CLIENT, epoch, 10)
    with refused("SpendOverAuthorization", client=victim, units=2**255, authorized=10):
        anyone.apply_spent(node, epoch, units, index, proof, small)
    for other in (consent(world, ledger_address, CLIENT, epoch, 2**255, node=OTHER_NODE),
                  consent(world, ledger_address, CLIENT, epoch - 1, 2**255)):  # fmt: skip
        moved = SpendAuthorization(victim, other.node, other.epoch, other.units, other.signature)
        with refused("InvalidSpendAuthorization", node=node, epoch=epoch, client=victim):
            anyone.apply_spent(node, epoch, units, index, proof, moved)
    with refused("InvalidSpendAuthorization"):  # no signature at all
        anyone.apply_spent(
            node, epoch, units, index, proof, SpendAuthorization(victim, node, epoch, 2**255, b"")
        )
    assert anyone.balance(victim) == 50 and anyone.spent(victim) == 0
    # Control: what the victim did allow is applied (and lowers its balance to zero, never below).
    anyone.apply_spent(
        node, epoch, units, index, proof, consent(world, ledger_address, CLIENT, epoch, 2**255)
    )
    assert anyone.balance(victim) == 0


def test_the_spend_digest_is_the_contracts(world: World, ledger_address: str) -> None:
    client = world.ledger(ledger_address, AUTHOR_A)
    chain = world.w3.eth.chain_id
    payer, node = world.address(CLIENT), world.address(NODE)
    for epoch, units in ((0, 0), (20_000, 45), (2**256 - 1, 2**256 - 1)):
        assert client.spend_digest(payer, node, epoch, units) == spend_authorization_digest(
            chain, ledger_address, payer, node, epoch, units
        )
    # The client is part of it: the same consent for another account is another digest.
    assert client.spend_digest(node, node, 1, 1) != client.spend_digest(payer, node, 1, 1)
    # What a wallet signs (eth_account's typed-data walk) is that digest, also for a client not the key's own.
    signed = sign_spend_authorization(dev_account(CLIENT), chain, ledger_address, node, 5, 9, client=node)
    document = typed_spend_authorization(chain, ledger_address, node, node, 5, 9)
    assert signed.client == node
    message = encode_typed_data(full_message=document)
    assert Account.recover_message(message, signature=signed.signature) == payer
    digest = spend_authorization_digest(chain, ledger_address, node, node, 5, 9)
    assert Account._recover_hash(digest, signature=signed.signature) == payer


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
    assert keeper.report(node, epoch).challenger == world.address(KEEPER)  # type: ignore[union-attr]
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
    # The frivolous challenger's bond went to the node it froze.
    assert keeper.withdrawable(node) == BOND and keeper.withdrawable(world.address(KEEPER)) == 0
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


def test_a_challenge_costs_a_bond_an_honest_challenger_gets_back(world: World, ledger_address: str) -> None:
    """The attack: any holder of the threshold challenged every report for the price of gas, each needing
    a DAO vote to resolve. Now each challenge stakes a bond, lost when the DAO dismisses it."""
    report = sample(world)
    first = posted(world, ledger_address, report)
    second = posted(world, ledger_address, report)
    node, keeper_address = world.address(NODE), world.address(KEEPER)
    keeper = world.ledger(ledger_address, KEEPER)
    call = keeper.contract.encode_abi("challenge", args=[node, first, "free"])
    for sent in (0, BOND - 1, BOND + 1):
        with refused("WrongChallengeBond", sent=sent, bond=BOND):
            keeper._sender.send(keeper.address, call, sent)
    before = world.w3.eth.get_balance(keeper_address)
    tx = keeper.challenge(node, first, "invented usage")
    cost = tx.gas_used * int(tx.receipt["effectiveGasPrice"])
    assert world.w3.eth.get_balance(keeper_address) == before - BOND - cost
    assert world.w3.eth.get_balance(ledger_address) == BOND
    keeper.challenge(node, second, "also invented")
    gov = world.ledger(ledger_address, GOVERNOR)
    gov.resolve_challenge(node, first, True)  # upheld: the bond back to the challenger
    gov.resolve_challenge(node, second, False)  # dismissed: the bond to the node
    assert keeper.withdrawable(keeper_address) == BOND and keeper.withdrawable(node) == BOND
    before = world.w3.eth.get_balance(keeper_address)
    tx = keeper.withdraw()
    cost = tx.gas_used * int(tx.receipt["effectiveGasPrice"])
    assert world.w3.eth.get_balance(keeper_address) == before + BOND - cost
    with refused("NothingToWithdraw", account=keeper_address):
        keeper.withdraw()
    world.ledger(ledger_address, NODE).withdraw()
    assert world.w3.eth.get_balance(ledger_address) == 0


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
        and params.report_window == REPORT_WINDOW
        and params.challenge_bond == BOND
        and params.resolution_period == 28 * DAY  # deploy_ledger's default
    )


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"epoch_length": 0}, "epochLength"),
        ({"challenge_window": 0}, "challengeWindow"),
        ({"max_units_per_report": 0}, "maxUnitsPerReport"),
        ({"challenge_threshold": 0}, "challengeThreshold"),
        ({"report_window": 0}, "reportWindow"),
        ({"report_window": 366 * DAY}, "reportWindow"),
        ({"challenge_bond": 0}, "challengeBond"),
        ({"resolution_period": 0}, "resolutionPeriod"),
        ({"resolution_period": 366 * DAY}, "resolutionPeriod"),
        ({"governor": "0x" + "00" * 20}, "governor"),
        ({"keeper_token": "0x" + "00" * 19 + "01"}, "keeperToken"),
    ],
)
def test_bad_constructor_arguments_are_refused_by_name(world: World, override: dict, name: str) -> None:
    kwargs: dict = {"governor": world.address(GOVERNOR), "keeper_token": world.token_address}
    kwargs.update(override)
    with refused("InvalidParameter", name=name):
        deploy_ledger(world.w3, dev_account(0), artifacts=world.artifacts, **kwargs)
