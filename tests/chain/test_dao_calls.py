"""Call proposals on a real anvil: the DAO (the ExperienceRegistry's quadratic vote) registers and
deregisters UsageLedger nodes and resolves challenges, the ledger refuses everyone else, a failing call
reverts with the target's own decoded error, and call proposals never go stale."""

from __future__ import annotations

import hashlib

import pytest
from web3 import Web3
from web3.logs import DISCARD

from tests.chain.support import DAY, EXECUTION_DELAY, World, refused
from zoo.registry.chain import (
    ProposalState,
    call_proposal_id,
    deploy_ledger,
    format_proposal_id,
)
from zoo.registry.keys import dev_account

NODE, OTHER = 6, 7
FOR = (1, 3)  # enough quadratic weight for quorum and the supermajority
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


def pass_calls(world: World, target: str, *calls: bytes) -> list[int]:
    """Propose the calls, vote them through, wait until they are executable; returns the proposal ids."""
    ids = [world.registry().propose_call(target, data).proposal_id for data in calls]
    world.advance(1)
    for pid in ids:
        for voter in FOR:
            world.registry(voter).vote(pid, True)
    proposal = world.registry().proposal(ids[-1])
    assert proposal is not None
    world.advance(proposal.vote_end + EXECUTION_DELAY - world.now())
    return ids


def pass_call(world: World, target: str, data: bytes) -> int:
    return pass_calls(world, target, data)[0]


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


def test_a_failing_call_reverts_with_the_targets_error_and_stays_executable(
    world: World, ledger_address: str
) -> None:
    node = world.address(OTHER)
    reader = world.ledger(ledger_address)
    data = reader.governor_call("registerNode", node)
    first, second = pass_calls(world, ledger_address, data, data)
    world.registry().execute(first)
    # The ledger's own custom error comes back through the registry, decoded, and nothing is marked.
    with refused("NodeAlreadyRegistered", node=node):
        world.registry().execute(second)
    assert world.registry().state(second) is ProposalState.SUCCEEDED
    assert world.registry().proposal(second).executed is False  # type: ignore[union-attr]


def test_a_call_proposal_never_goes_stale(world: World, ledger_address: str) -> None:
    reader = world.ledger(ledger_address)
    pid = world.registry().propose_call(
        ledger_address, reader.governor_call("registerNode", world.address(9))
    )
    world.advance(1)
    library = world.registry(2).propose(hashlib.sha256(b"v1").digest(), CID, tree_size=1).proposal_id
    world.advance(1)
    for voter in FOR:
        world.registry(voter).vote(pid.proposal_id, True)
        world.registry(voter).vote(library, True)
    world.advance(world.registry().proposal(library).vote_end + EXECUTION_DELAY - world.now())  # type: ignore[union-attr]
    world.registry().execute(library)
    assert world.registry().current_version() == 1
    assert world.registry().state(pid.proposal_id) is ProposalState.SUCCEEDED
    world.registry().execute(pid.proposal_id)
    assert reader.is_registered(world.address(9))


def test_call_proposals_are_refused_like_any_other(world: World, ledger_address: str) -> None:
    reg = world.registry()
    data = world.ledger(ledger_address).governor_call("registerNode", world.address(NODE))
    with refused("InvalidCallTarget", target=world.address(4)):
        reg.propose_call(world.address(4), data)  # an account: no code to call
    with refused("InvalidCallTarget", target=Web3.to_checksum_address(world.registry_address)):
        reg.propose_call(world.registry_address, data)
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
