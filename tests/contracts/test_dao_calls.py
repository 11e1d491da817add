"""Call proposals on a real anvil: the DAO (the ExperienceRegistry's quadratic vote) registers and
deregisters UsageLedger nodes and resolves challenges, the ledger refuses everyone else, a failing call
reverts with the target's own decoded error, a call proposal is stale once an identical call was executed
since it was made (so a leftover proposal cannot undo a later decision), and proposals can be canceled by
their proposer while voting is open or by the DAO before they are executed."""

from __future__ import annotations

import hashlib

import pytest
from web3 import Web3
from web3.logs import DISCARD

from tests.contracts.support import (
    DAY,
    EXECUTION_DELAY,
    FOR,
    GRACE_PERIOD,
    World,
    pass_call,
    pass_calls,
    pass_ids,
    refused,
)
from zoo.registry.chain import (
    CallBinding,
    ProposalState,
    call_hash,
    call_proposal_id,
    deploy_ledger,
    format_proposal_id,
)
from zoo.registry.keys import dev_account

NODE, OTHER = 6, 7
SALT = b"\x00" * 32
CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


@pytest.fixture(scope="module")
def ledger_address(deployed: World) -> str:
    """A ledger whose governor is the (open) registry: only a passed call proposal can register nodes."""
    return deploy_ledger(
        deployed.w3,
        dev_account(0),
        governor=deployed.registry_address,
        keeper_token=deployed.token_address,
        epoch_length=DAY,
        challenge_window=DAY,
        artifacts=deployed.artifacts,
    )


def test_the_dao_registers_and_deregisters_a_node_and_nobody_else_can(
    world: World, ledger_address: str
) -> None:
    node = world.address(NODE)
    reader = world.ledger(ledger_address)
    with refused("NotGovernor", caller=world.address(0)):
        world.ledger(ledger_address, 0).register_node(node)  # dev0 is not the governor here
    data = reader.governor_call("registerNode", node)
    assert reader.describe_call(data) == f"registerNode({node})"
    pid = pass_call(world, ledger_address, data)
    reg = world.registry()
    assert reg.state(pid) is ProposalState.SUCCEEDED
    proposal = reg.proposal(pid)
    assert proposal is not None and proposal.is_call and proposal.root == bytes(32)
    assert reg.proposed_call(pid) == (Web3.to_checksum_address(ledger_address), data)
    assert not reader.is_registered(node)
    tx = reg.execute(pid)
    assert reader.is_registered(node)
    assert reg.state(pid) is ProposalState.EXECUTED
    assert reg.current_version() == 0  # a call changes no library version
    receipt = world.w3.eth.get_transaction_receipt(tx.tx_hash)
    executed = reg.contract.events.CallExecuted().process_receipt(receipt, errors=DISCARD)
    assert [(e["args"]["proposalId"], e["args"]["target"]) for e in executed] == [
        (pid, Web3.to_checksum_address(ledger_address))
    ]
    with refused("ProposalAlreadyExecuted"):
        reg.execute(pid)
    # The registered node can post; deregistered (again by a vote), it cannot.
    epoch = world.now() // DAY
    world.advance(DAY)
    root = hashlib.sha256(b"report").digest()
    world.ledger(ledger_address, NODE).post_report(epoch, root, tree_size=1, earned_units=1, cid=CID)
    reg.execute(pass_call(world, ledger_address, reader.governor_call("deregisterNode", node)))
    assert not reader.is_registered(node)
    with refused("NodeNotRegistered", node=node):
        world.ledger(ledger_address, NODE).post_report(epoch + 1, root, tree_size=1, earned_units=1, cid=CID)


def test_a_leftover_identical_call_proposal_is_stale_and_cannot_re_register_a_node(
    world: World, ledger_address: str
) -> None:
    """The attack: two identical registerNode(N) proposals pass; one registers N; the DAO later deregisters
    N; the leftover, still inside its grace period, would register N again without a vote."""
    node = world.address(OTHER)
    reader, reg = world.ledger(ledger_address), world.registry()
    register = reader.governor_call("registerNode", node)
    first, leftover = (reg.propose_call(ledger_address, register).proposal_id for _ in range(2))
    world.advance(30)  # the deregistration is proposed a little later, so it passes while the leftover lives
    deregister = reg.propose_call(ledger_address, reader.governor_call("deregisterNode", node)).proposal_id
    pass_ids(world, first, leftover, deregister)
    key = call_hash(ledger_address, register)
    assert reg.hash_call(ledger_address, register) == key
    assert reg.call_binding(first) == reg.call_binding(leftover) == CallBinding(key, 0, 0)
    assert reg.state(leftover) is ProposalState.SUCCEEDED

    reg.execute(first)
    assert reader.is_registered(node) and reg.call_executions(ledger_address, register) == 1
    assert reg.state(first) is ProposalState.EXECUTED
    binding = reg.call_binding(leftover)
    assert binding == CallBinding(key, 0, 1) and binding.stale
    assert reg.state(leftover) is ProposalState.STALE
    stale = {"proposalId": leftover, "callHash": key, "executionsAtProposal": 0, "executionsNow": 1}
    with refused("CallProposalStale", "an identical call was executed since it was proposed", **stale):
        reg.execute(leftover)

    reg.execute(deregister)
    assert not reader.is_registered(node)
    leftover_proposal = reg.proposal(leftover)
    assert leftover_proposal is not None and not leftover_proposal.executed
    assert world.now() < leftover_proposal.vote_end + EXECUTION_DELAY + GRACE_PERIOD  # not merely expired
    assert reg.state(leftover) is ProposalState.STALE
    with refused("CallProposalStale", **stale):
        world.registry(9).execute(leftover)  # anyone may execute: still nobody can
    assert not reader.is_registered(node)


def test_a_fresh_proposal_of_a_call_made_after_it_was_undone_executes(
    world: World, ledger_address: str
) -> None:
    node = world.address(OTHER)
    reader, reg = world.ledger(ledger_address), world.registry()
    register = reader.governor_call("registerNode", node)
    reg.execute(pass_call(world, ledger_address, register))
    reg.execute(pass_call(world, ledger_address, reader.governor_call("deregisterNode", node)))
    assert not reader.is_registered(node)
    fresh = reg.propose_call(ledger_address, register).proposal_id
    assert reg.call_binding(fresh) == CallBinding(call_hash(ledger_address, register), 1, 1)
    reg.execute(pass_ids(world, fresh)[0])
    assert reader.is_registered(node)
    assert reg.call_executions(ledger_address, register) == 2


def test_a_call_proposal_made_stale_during_its_vote_takes_no_more_votes(
    world: World, ledger_address: str
) -> None:
    reader, reg = world.ledger(ledger_address), world.registry()
    register = reader.governor_call("registerNode", world.address(OTHER))
    passed = pass_call(world, ledger_address, register)
    late = reg.propose_call(ledger_address, register).proposal_id  # same call, still bound to 0 executions
    world.advance(1)
    world.registry(1).vote(late, True)
    assert reg.state(late) is ProposalState.ACTIVE
    reg.execute(passed)
    assert reg.state(late) is ProposalState.STALE
    with refused("CallProposalStale", proposalId=late, executionsAtProposal=0, executionsNow=1):
        world.registry(3).vote(late, True)
    assert not reg.has_voted(late, world.address(3))


def test_different_calls_and_a_library_version_proposed_together_all_execute(
    world: World, ledger_address: str
) -> None:
    """Positive control: the binding is per call, so unrelated calls, and library versions, never interfere
    (a global nonce would let the first execution make all the others stale)."""
    reader, reg = world.ledger(ledger_address), world.registry()
    nodes = [world.address(i) for i in (NODE, OTHER, 9)]
    calls = [reader.governor_call("registerNode", n) for n in nodes]
    ids = [reg.propose_call(ledger_address, data).proposal_id for data in calls]
    library = world.registry(2).propose(hashlib.sha256(b"v1").digest(), CID, tree_size=1).proposal_id
    pass_ids(world, *ids, library)
    reg.execute(ids[0])
    reg.execute(library)
    assert reg.current_version() == 1
    for pid in ids[1:]:
        assert reg.state(pid) is ProposalState.SUCCEEDED
        reg.execute(pid)
    assert all(reader.is_registered(n) for n in nodes)
    assert [reg.call_executions(ledger_address, data) for data in calls] == [1, 1, 1]
    assert {reg.state(pid) for pid in (*ids, library)} == {ProposalState.EXECUTED}


def test_a_failing_call_reverts_with_the_targets_error_and_is_not_counted(
    world: World, ledger_address: str
) -> None:
    """A call that reverts is not made final (an executor could starve it of gas to kill the proposal): the
    proposal stays executable and runs once its call can succeed."""
    node = world.address(OTHER)
    reader, reg = world.ledger(ledger_address), world.registry()
    deregister = reader.governor_call("deregisterNode", node)
    register = reader.governor_call("registerNode", node)
    early, later = pass_calls(world, ledger_address, deregister, register)
    # The ledger's own custom error comes back through the registry, decoded, and nothing is marked.
    with refused("NodeNotRegistered", node=node):
        reg.execute(early)
    assert reg.state(early) is ProposalState.SUCCEEDED
    assert reg.proposal(early).executed is False  # type: ignore[union-attr]
    assert reg.call_executions(ledger_address, deregister) == 0
    reg.execute(later)
    reg.execute(early)
    assert not reader.is_registered(node)
    assert reg.call_executions(ledger_address, deregister) == 1


def canceled_by(world: World, tx_hash: str) -> list[tuple[int, str]]:
    receipt = world.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
    events = world.registry().contract.events.ProposalCanceled().process_receipt(receipt, errors=DISCARD)
    return [(e["args"]["proposalId"], e["args"]["by"]) for e in events]


def test_the_dao_cancels_a_passed_call_proposal(world: World, ledger_address: str) -> None:
    reader, reg = world.ledger(ledger_address), world.registry()
    node = world.address(OTHER)
    registry = Web3.to_checksum_address(world.registry_address)
    unwanted = reg.propose_call(ledger_address, reader.governor_call("registerNode", node)).proposal_id
    cancel = world.registry(2).propose_cancel(unwanted).proposal_id
    assert reg.proposed_call(cancel) == (registry, reg.cancel_call(unwanted))
    pass_ids(world, unwanted, cancel)
    assert reg.state(unwanted) is ProposalState.SUCCEEDED
    tx = reg.execute(cancel)
    assert canceled_by(world, tx.tx_hash) == [(unwanted, registry)]
    assert reg.state(unwanted) is ProposalState.CANCELED
    assert reg.state(cancel) is ProposalState.EXECUTED
    proposal = reg.proposal(unwanted)
    assert proposal is not None and proposal.canceled and not proposal.executed
    with refused("ProposalIsCanceled", "was canceled", proposalId=unwanted):
        world.registry(9).execute(unwanted)
    assert not reader.is_registered(node)


def test_the_dao_cannot_cancel_an_executed_proposal(world: World, ledger_address: str) -> None:
    reader, reg = world.ledger(ledger_address), world.registry()
    node = world.address(OTHER)
    done = reg.propose_call(ledger_address, reader.governor_call("registerNode", node)).proposal_id
    cancel = reg.propose_cancel(done).proposal_id
    pass_ids(world, done, cancel)
    reg.execute(done)
    executed = ProposalState.EXECUTED
    with refused("ProposalNotCancelable", "it is executed", proposalId=done, state=executed):
        reg.cancel(done)  # nor can its proposer
    with refused("ProposalNotCancelable", proposalId=done, state=executed):
        reg.execute(cancel)  # the registry's own error, through the call
    assert reg.state(done) is executed and reader.is_registered(node)
    assert reg.state(cancel) is ProposalState.SUCCEEDED


def test_the_proposer_cancels_its_own_pending_or_active_proposal(world: World, ledger_address: str) -> None:
    reg = world.registry(2)
    # Pending: canceled in the second it was made.
    made = reg.propose(hashlib.sha256(b"pending").digest(), CID, tree_size=1)
    world.pin_next_block(world.block_time(made.block_number))
    assert reg.state(made.proposal_id) is ProposalState.PENDING
    tx = reg.cancel(made.proposal_id)
    assert canceled_by(world, tx.tx_hash) == [(made.proposal_id, world.address(2))]
    assert reg.state(made.proposal_id) is ProposalState.CANCELED
    # Active, with votes cast: a call proposal this time.
    data = world.ledger(ledger_address).governor_call("registerNode", world.address(NODE))
    active = reg.propose_call(ledger_address, data).proposal_id
    world.advance(1)
    world.registry(1).vote(active, True)
    assert reg.state(active) is ProposalState.ACTIVE
    reg.cancel(active)
    assert reg.state(active) is ProposalState.CANCELED
    with refused("ProposalIsCanceled", proposalId=active):
        world.registry(3).vote(active, True)
    canceled = ProposalState.CANCELED
    with refused("ProposalNotCancelable", "it is canceled", proposalId=active, state=canceled):
        reg.cancel(active)
    world.advance(reg.proposal(active).vote_end + EXECUTION_DELAY - world.now())  # type: ignore[union-attr]
    with refused("ProposalIsCanceled", proposalId=active):
        reg.execute(active)  # it had votes for: it would pass, were it not canceled
    with refused("ProposalNotFound"):
        reg.cancel(12345)


def test_only_the_proposer_or_the_dao_may_cancel(world: World, ledger_address: str) -> None:
    data = world.ledger(ledger_address).governor_call("registerNode", world.address(NODE))
    pid = world.registry(0).propose_call(ledger_address, data).proposal_id
    world.advance(1)
    with refused("NotAllowedToCancel", "may not cancel", proposalId=pid, caller=world.address(1)):
        world.registry(1).cancel(pid)
    assert world.registry().state(pid) is ProposalState.ACTIVE


def test_the_proposer_cannot_cancel_once_the_vote_has_ended(world: World, ledger_address: str) -> None:
    reg = world.registry()
    data = world.ledger(ledger_address).governor_call("registerNode", world.address(NODE))
    passed = reg.propose_call(ledger_address, data).proposal_id
    defeated = reg.propose(hashlib.sha256(b"no votes").digest(), CID, tree_size=1).proposal_id
    world.advance(1)
    for voter in FOR:
        world.registry(voter).vote(passed, True)
    world.advance(reg.proposal(defeated).vote_end - world.now())  # type: ignore[union-attr]
    for pid, state in ((passed, ProposalState.QUEUED), (defeated, ProposalState.DEFEATED)):
        with refused("ProposalNotCancelable", proposalId=pid, state=state):
            reg.cancel(pid)
    world.advance(EXECUTION_DELAY)
    with refused("ProposalNotCancelable", proposalId=passed, state=ProposalState.SUCCEEDED):
        reg.cancel(passed)
    reg.execute(passed)


def test_call_proposals_are_refused_like_any_other(world: World, ledger_address: str) -> None:
    reg = world.registry()
    data = world.ledger(ledger_address).governor_call("registerNode", world.address(NODE))
    with refused("InvalidCallTarget", target=world.address(4)):
        reg.propose_call(world.address(4), data)  # an account: no code to call
    # On the registry itself only cancel(id) may be proposed: no other selector, whatever its arguments.
    registry = Web3.to_checksum_address(world.registry_address)
    with refused("InvalidCallTarget", "only cancel(proposal)", target=registry):
        reg.propose_call(world.registry_address, data)
    for function, args in (
        ("execute", [1]),
        ("vote", [1, True]),
        ("proposeCall", [ledger_address, data, SALT]),
    ):
        with refused("InvalidCallTarget", target=registry):
            reg.propose_call(
                world.registry_address, bytes.fromhex(reg.contract.encode_abi(function, args)[2:])
            )
    with refused("EmptyCall"):
        reg.propose_call(world.registry_address, reg.cancel_call(1)[:3])
    assert reg.proposed_call(reg.propose_call(world.registry_address, reg.cancel_call(1)).proposal_id)
    with refused("EmptyCall"):
        reg.propose_call(ledger_address, b"\x01\x02")
    with refused("InsufficientProposerVotes"):
        world.registry(5).propose_call(ledger_address, data)  # one unit below the threshold
    salt = b"\x07" * 32
    tx = reg.propose_call(ledger_address, data, salt=salt)
    with refused("ProposalAlreadyExists"):
        reg.propose_call(ledger_address, data, salt=salt)
    # The id is the contract's, computed locally too, domain-separated from library ids; prefixes resolve.
    assert tx.proposal_id == call_proposal_id(ledger_address, data, world.address(0), salt)
    assert tx.proposal_id == reg._call("hashCallProposal", ledger_address, data, world.address(0), salt)
    prefix = format_proposal_id(tx.proposal_id)[:12]
    assert reg.resolve_proposal(prefix, from_block=world.deploy_block) == tx.proposal_id
    # Without votes it is defeated: quorum counts for votes only.
    world.advance(reg.proposal(tx.proposal_id).vote_end + EXECUTION_DELAY - world.now())  # type: ignore[union-attr]
    assert reg.state(tx.proposal_id) is ProposalState.DEFEATED
    with refused("QuorumNotReached"):
        reg.execute(tx.proposal_id)
    assert reg.proposed_call(12345) is None


def test_the_dao_resolves_a_challenge(world: World, ledger_address: str) -> None:
    reader = world.ledger(ledger_address)
    node = world.address(NODE)
    if not reader.is_registered(node):
        world.registry().execute(pass_call(world, ledger_address, reader.governor_call("registerNode", node)))
    epoch = world.now() // DAY
    world.advance(DAY)
    world.ledger(ledger_address, NODE).post_report(
        epoch, hashlib.sha256(b"inflated").digest(), tree_size=1, earned_units=9, cid=CID
    )
    world.ledger(ledger_address, 1).challenge(node, epoch, "invented usage")
    upheld = reader.governor_call("resolveChallenge", node, epoch, True)
    assert reader.describe_call(upheld) == f"resolveChallenge({node}, {epoch}, True)"
    world.registry().execute(pass_call(world, ledger_address, upheld))
    report = reader.report(node, epoch)
    assert report is not None and report.voided and not report.challenged
