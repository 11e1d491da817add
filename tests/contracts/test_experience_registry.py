"""ExperienceRegistry on a real anvil chain: lifecycle, every refusal, quadratic weights, Merkle proofs."""

from __future__ import annotations

import hashlib
import itertools
import math
import threading
import time
from collections.abc import Sequence

import pytest
from eth_abi import encode as abi_encode
from hypothesis import example, given, settings
from hypothesis import strategies as st
from web3 import Web3
from web3.logs import DISCARD

from tests.contracts.support import (
    BELOW_THRESHOLD,
    EMPTY,
    EXECUTION_DELAY,
    GRACE_PERIOD,
    PROPOSAL_THRESHOLD,
    QUORUM,
    UNDELEGATED,
    VOTING_PERIOD,
    WEIGHTS,
    W,
    World,
    refused,
    units_for_weight,
)
from zoo.registry import merkle
from zoo.registry.chain import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_QUORUM,
    ContractRevert,
    Proposal,
    ProposalState,
    RegistryClient,
    deploy_contract,
    deploy_registry,
    describe_revert,
    format_proposal_id,
    proposal_id,
)

ZERO = bytes(32)
CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
OTHER_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
SALT = b"\x5a" * 32


def root_of(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def open_proposal(
    world: World,
    label: str,
    *,
    parent_version: int | None = None,
    proposer: int = 0,
    cid: str = CID,
    tree_size: int = 1,
    salt: bytes | None = None,
    gated: bool = False,
) -> Proposal:
    """Propose root_of(label) and move one second on, into the voting window; returns the stored proposal."""
    reg = world.gated(proposer) if gated else world.registry(proposer)
    tx = reg.propose(root_of(label), cid, tree_size=tree_size, parent_version=parent_version, salt=salt)
    world.advance(1)
    proposal = reg.proposal(tx.proposal_id)
    assert proposal is not None and proposal.id == tx.proposal_id and proposal.root == root_of(label)
    return proposal


def to_executable(world: World, proposal: Proposal) -> None:
    world.advance(proposal.vote_end + EXECUTION_DELAY - world.now())


def enact(world: World, proposal: Proposal, voters: Sequence[int] = (1, 3)) -> int:
    """Vote `proposal` through (on the open registry), execute it, and return the new version number."""
    for voter in voters:
        world.registry(voter).vote(proposal.id, True)
    to_executable(world, proposal)
    world.registry().execute(proposal.id)
    return world.registry().current_version()


def test_initial_state_is_empty_version_zero(world: World) -> None:
    reg = world.registry()
    current = reg.current()
    assert (current.version, current.root, current.tree_size, current.cid) == (0, ZERO, 0, "")
    assert reg.current_root() == ZERO and reg.current_version() == 0 and reg.current_cid() == ""
    assert reg.history() == []
    assert [v.version for v in reg.history(include_genesis=True)] == [0]
    with refused("UnknownVersion", "library version 1 does not exist"):
        reg.version_at(1)
    params = reg.params()
    assert (params.voting_period, params.execution_delay, params.grace_period) == (
        VOTING_PERIOD,
        EXECUTION_DELAY,
        GRACE_PERIOD,
    )
    assert (params.proposal_threshold, params.quorum, params.voter_registry) == (
        PROPOSAL_THRESHOLD,
        QUORUM,
        None,
    )
    assert world.gated().params().voter_registry == world.allowlist_address


def test_full_lifecycle_two_versions(world: World) -> None:
    reg = world.registry(0)
    first = root_of("v1")
    result = reg.propose(first, CID, tree_size=3, salt=SALT)
    pid = result.proposal_id
    assert pid == proposal_id(first, 3, CID, 0, world.address(0), SALT)
    created_at = world.block_time(result.block_number)
    [created] = reg.proposal_created_events(result.block_number, result.block_number)
    assert (created.proposal_id, created.root, created.proposer, created.parent_version) == (
        pid,
        first,
        world.address(0),
        0,
    )
    assert (created.tree_size, created.cid, created.salt) == (3, CID, SALT)
    assert (created.snapshot, created.vote_start, created.vote_end) == (
        created_at - 1,
        created_at + 1,
        created_at + 1 + VOTING_PERIOD,
    )
    world.advance(1)
    assert reg.state(pid) is ProposalState.ACTIVE
    assert reg.state(format_proposal_id(pid)) is ProposalState.ACTIVE  # 0x-hex ids work as well

    for voter, support in ((1, True), (3, True), (2, False)):
        res = world.registry(voter).vote(pid, support)
        [event] = world.registry().contract.events.VoteCast().process_receipt(res.receipt)
        assert event["args"]["proposalId"] == pid and event["args"]["voter"] == world.address(voter)
        assert event["args"]["weight"] == WEIGHTS[voter] * W
        assert reg.has_voted(pid, world.address(voter))
    tallies = reg.tallies(pid)
    assert (tallies.for_weight, tallies.against_weight) == ((200 + 201) * W, 100 * W)
    assert not reg.has_voted(pid, world.address(0))

    proposal = reg.proposal(pid)
    assert proposal is not None
    assert (proposal.id, proposal.root, proposal.tree_size, proposal.parent_version) == (pid, first, 3, 0)
    world.advance(proposal.vote_end - world.now())
    assert reg.state(pid) is ProposalState.QUEUED
    to_executable(world, proposal)
    assert reg.state(pid) is ProposalState.SUCCEEDED
    executed = world.registry(6).execute(pid)  # anyone may execute
    [done] = reg.contract.events.ProposalExecuted().process_receipt(executed.receipt, errors=DISCARD)
    assert (done["args"]["proposalId"], done["args"]["version"]) == (pid, 1)
    [update] = reg.library_updated_events(executed.block_number, executed.block_number)
    assert (update.version, update.root, update.tree_size, update.cid) == (1, first, 3, CID)
    assert reg.state(pid) is ProposalState.EXECUTED
    current = reg.current()
    assert (current.version, current.root, current.tree_size, current.cid) == (1, first, 3, CID)
    assert current.timestamp == world.block_time(executed.block_number)

    second = root_of("v2")
    with refused("WrongParent", "version 0 is not the current library version 1"):
        reg.propose(second, "bafy-v2", tree_size=5, parent_version=0)
    p2 = open_proposal(world, "v2", parent_version=1, cid="bafy-v2", tree_size=5)
    assert p2.parent_version == 1 and p2.tree_size == 5
    assert enact(world, p2) == 2

    assert reg.current_version() == 2 and reg.current_root() == second and reg.current_cid() == "bafy-v2"
    history = reg.history()
    assert [(v.version, v.root, v.tree_size, v.cid) for v in history] == [
        (1, first, 3, CID),
        (2, second, 5, "bafy-v2"),
    ]
    assert history[0].timestamp < history[1].timestamp
    events = reg.library_updated_events(world.deploy_block)
    assert [(e.version, e.root, e.tree_size) for e in events] == [(1, first, 3), (2, second, 5)]
    # Indexed fields are real topics: filtering on the node returns just the matching event.
    by_version = reg.contract.events.LibraryUpdated().get_logs(
        argument_filters={"version": 2}, from_block=world.deploy_block
    )
    assert [e["args"]["root"] for e in by_version] == [second]
    by_id = reg.contract.events.ProposalCreated().get_logs(
        argument_filters={"proposalId": p2.id}, from_block=world.deploy_block
    )
    assert [e["args"]["root"] for e in by_id] == [second]
    by_root = reg.contract.events.ProposalCreated().get_logs(
        argument_filters={"root": first}, from_block=world.deploy_block
    )
    assert [e["args"]["proposalId"] for e in by_root] == [pid]


def test_voting_twice_is_refused(world: World) -> None:
    proposal = open_proposal(world, "twice")
    voter = world.registry(1)
    voter.vote(proposal.id, True)
    before = voter.tallies(proposal.id)
    for support in (True, False):
        with refused("AlreadyVoted", f"already voted on this proposal (voter {world.address(1)})"):
            voter.vote(proposal.id, support)
    assert voter.tallies(proposal.id) == before


def test_tokens_moved_after_the_proposal_do_not_vote_again(world: World) -> None:
    pid = open_proposal(world, "moved").id
    sender, receiver = world.registry(1), world.registry(EMPTY)
    sender.vote(pid, True)
    world.token(1).transfer(world.address(EMPTY), world.token(1).balance(world.address(1)))
    world.token(EMPTY).delegate()
    assert world.token().get_votes(world.address(EMPTY)) == units_for_weight(WEIGHTS[1])
    with refused("NoVotingPower"):
        receiver.vote(pid, True)
    assert not sender.has_voted(pid, world.address(EMPTY))
    assert sender.tallies(pid).for_weight == WEIGHTS[1] * W

    # A receiver that already had weight keeps exactly its pre-proposal weight, none of the moved tokens.
    world.token(3).transfer(world.address(2), world.token(3).balance(world.address(3)))
    assert sender.voting_weight(pid, world.address(2)) == WEIGHTS[2] * W
    world.registry(2).vote(pid, True)
    assert sender.tallies(pid).for_weight == (WEIGHTS[1] + WEIGHTS[2]) * W


def test_tokens_bought_after_the_proposal_do_not_count(world: World) -> None:
    pid = open_proposal(world, "bought").id
    world.token(3).transfer(world.address(EMPTY), units_for_weight(150))  # the "purchase"
    world.token(EMPTY).delegate()
    with refused("NoVotingPower", "had no votes at its snapshot"):
        world.registry(EMPTY).vote(pid, True)
    # The same tokens do count for a proposal made in a later second than their arrival.
    world.advance(1)
    later = open_proposal(world, "bought-later")
    assert world.registry().voting_weight(later.id, world.address(EMPTY)) == 150 * W
    world.registry(EMPTY).vote(later.id, True)
    assert world.registry().tallies(later.id).for_weight == 150 * W


def test_tokens_received_in_the_proposal_second_do_not_count(world: World) -> None:
    # A same-second (flash-loan style) top-up lands at the snapshot's second + 1 and is not counted.
    ts = world.now() + 5
    world.pin_next_block(ts)
    world.token(3).transfer(world.address(1), units_for_weight(100))
    world.pin_next_block(ts)
    pid = world.registry(1).propose(root_of("flash"), CID, tree_size=1).proposal_id
    world.advance(1)
    assert world.registry().voting_weight(pid, world.address(1)) == WEIGHTS[1] * W
    world.registry(1).vote(pid, True)
    assert world.registry().tallies(pid).for_weight == WEIGHTS[1] * W


def test_voting_in_the_proposal_second_is_refused(world: World) -> None:
    # Voting opens the second after the proposal; anvil lets us mine blocks within the proposal's second.
    reg = world.registry(1)
    result = world.registry(0).propose(root_of("early"), CID, tree_size=1)
    pid = result.proposal_id
    created_at = world.block_time(result.block_number)
    world.pin_next_block(created_at)
    assert reg.state(pid) is ProposalState.PENDING
    with refused("VotingNotStarted", "has not started yet"):
        reg.vote(pid, True)
    world.rpc("evm_mine")
    assert world.now() == created_at
    assert not reg.has_voted(pid, world.address(1)) and reg.tallies(pid).cast == 0
    world.pin_next_block(created_at + 1)
    reg.vote(pid, True)
    assert reg.tallies(pid).for_weight == WEIGHTS[1] * W


def test_voting_window_end_is_exclusive(world: World) -> None:
    proposal = open_proposal(world, "window")
    world.pin_next_block(proposal.vote_end - 1)
    world.registry(1).vote(proposal.id, True)  # last second of the window
    world.pin_next_block(proposal.vote_end)
    with refused("VotingClosed", "is closed"):
        world.registry(3).vote(proposal.id, True)
    world.rpc("evm_mine")
    assert world.registry().tallies(proposal.id).for_weight == WEIGHTS[1] * W
    assert not world.registry().has_voted(proposal.id, world.address(3))
    world.advance(30 * 24 * 3600)
    with refused("VotingClosed"):
        world.registry(2).vote(proposal.id, False)


def test_execute_too_early_then_exactly_on_time_then_twice(world: World) -> None:
    reg = world.registry()
    proposal = open_proposal(world, "timing")
    for voter in (1, 3):
        world.registry(voter).vote(proposal.id, True)
    with refused("ExecutionTooEarly", "cannot be executed before"):
        reg.execute(proposal.id)  # voting still open
    executable_at = proposal.vote_end + EXECUTION_DELAY
    world.pin_next_block(executable_at - 1)
    with refused("ExecutionTooEarly"):
        reg.execute(proposal.id)
    world.rpc("evm_mine")
    assert reg.state(proposal.id) is ProposalState.QUEUED
    assert reg.current_version() == 0
    world.pin_next_block(executable_at)
    reg.execute(proposal.id)
    assert reg.current_version() == 1
    with refused("ProposalAlreadyExecuted", "was already executed"):
        reg.execute(proposal.id)
    assert reg.current_version() == 1 and len(reg.library_updated_events(world.deploy_block)) == 1


def test_passed_proposal_expires_after_the_grace_period(world: World) -> None:
    reg = world.registry()
    proposal = open_proposal(world, "expiry")
    for voter in (1, 3):
        world.registry(voter).vote(proposal.id, True)
    expires_at = proposal.vote_end + EXECUTION_DELAY + GRACE_PERIOD
    world.pin_next_block(expires_at - 1)
    world.rpc("evm_mine")
    assert reg.state(proposal.id) is ProposalState.SUCCEEDED
    inner = world.rpc("evm_snapshot")
    world.pin_next_block(expires_at - 1)
    reg.execute(proposal.id)  # the last second of the grace period still executes
    assert reg.current_version() == 1
    assert world.rpc("evm_revert", inner) is True
    assert reg.current_version() == 0
    world.pin_next_block(expires_at)
    with refused("ProposalExpired", f"passed but expired unexecuted at {expires_at} ("):
        reg.execute(proposal.id)
    world.rpc("evm_mine")
    assert world.now() == expires_at
    assert reg.state(proposal.id) is ProposalState.EXPIRED
    world.advance(30 * 24 * 3600)
    assert reg.state(proposal.id) is ProposalState.EXPIRED
    with refused("ProposalExpired"):
        reg.execute(proposal.id)
    assert reg.current_version() == 0 and reg.current_root() == ZERO


@pytest.mark.parametrize(("extra_voter", "passes"), [(9, False), (7, True)])
def test_quorum_is_inclusive(world: World, extra_voter: int, passes: bool) -> None:
    # 200 + 49 = 249 W < quorum 250 W; 200 + 50 = 250 W reaches it.
    reg = world.registry()
    proposal = open_proposal(world, f"quorum-{extra_voter}")
    world.registry(1).vote(proposal.id, True)
    world.registry(extra_voter).vote(proposal.id, True)
    to_executable(world, proposal)
    cast = (WEIGHTS[1] + WEIGHTS[extra_voter]) * W
    if passes:
        reg.execute(proposal.id)
        assert reg.current_root() == proposal.root
    else:
        assert reg.state(proposal.id) is ProposalState.DEFEATED
        with refused("QuorumNotReached", f"{cast} weight for, {QUORUM} needed"):
            reg.execute(proposal.id)
        assert reg.current_root() == ZERO and reg.current_version() == 0


def test_below_quorum_with_only_one_voter(world: World) -> None:
    proposal = open_proposal(world, "lonely")
    world.registry(1).vote(proposal.id, True)
    to_executable(world, proposal)
    with refused("QuorumNotReached"):
        world.registry().execute(proposal.id)


@pytest.mark.parametrize(("for_voter", "passes"), [(1, False), (3, True)])
def test_two_thirds_supermajority_is_strict(world: World, for_voter: int, passes: bool) -> None:
    # Against: dev0 and dev7, 150 W. For: dev2 (100 W) and dev1 (200 W): exactly 2 x against, fails; or
    # dev2 and dev3 (201 W): 301 W passes. Both reach the quorum of 250 W with for votes alone.
    reg = world.registry()
    proposal = open_proposal(world, f"majority-{for_voter}")
    for voter in (for_voter, 2):
        world.registry(voter).vote(proposal.id, True)
    for voter in (0, 7):
        world.registry(voter).vote(proposal.id, False)
    tallies = reg.tallies(proposal.id)
    for_weight = (WEIGHTS[for_voter] + 100) * W
    assert tallies.against_weight == 150 * W and tallies.for_weight == for_weight
    assert tallies.supermajority is passes and tallies.quorum_reached(QUORUM)
    to_executable(world, proposal)
    if passes:
        assert reg.state(proposal.id) is ProposalState.SUCCEEDED
        reg.execute(proposal.id)
        assert reg.current_root() == proposal.root and reg.current_version() == 1
    else:
        assert reg.state(proposal.id) is ProposalState.DEFEATED
        with refused("ProposalDefeated", f"{300 * W} for and {150 * W} against"):
            reg.execute(proposal.id)
        assert reg.current_root() == ZERO and reg.current_version() == 0


def test_against_votes_never_count_toward_quorum(world: World) -> None:
    """Issue 15, item 4: 249 W for and 20 W against used to make 269 W "cast", over the 250 W quorum, so an
    opponent's vote lifted the proposal over quorum and it executed. Only support counts now."""
    reg = world.registry()
    proposal = open_proposal(world, "against-lifts-quorum")
    for voter in (1, 9):  # 200 + 49 = 249 W for
        world.registry(voter).vote(proposal.id, True)
    world.registry(6).vote(proposal.id, False)  # 20 W against
    tallies = reg.tallies(proposal.id)
    assert tallies.cast >= QUORUM and tallies.supermajority and not tallies.quorum_reached(QUORUM)
    to_executable(world, proposal)
    assert reg.state(proposal.id) is ProposalState.DEFEATED
    with refused("QuorumNotReached", f"{249 * W} weight for, {QUORUM} needed"):
        reg.execute(proposal.id)
    assert reg.current_root() == ZERO and reg.current_version() == 0


def test_proposal_refusals(world: World) -> None:
    reg = world.registry(0)
    existing = root_of("existing")
    existing_id = reg.propose(existing, CID, tree_size=1, salt=SALT).proposal_id
    cases = [
        (
            BELOW_THRESHOLD,
            root_of("poor"),
            1,
            CID,
            0,
            "InsufficientProposerVotes",
            "below the proposal threshold",
        ),
        (UNDELEGATED, root_of("undelegated"), 1, CID, 0, "InsufficientProposerVotes", "had 0 votes"),
        (0, ZERO, 1, CID, 0, "ZeroRoot", "must not be zero"),
        (0, root_of("empty-tree"), 0, CID, 0, "EmptyTree", "the tree size must not be zero"),
        (0, root_of("no-cid"), 1, "", 0, "EmptyCID", "must not be empty"),
        (0, root_of("long-cid"), 1, "b" * 257, 0, "CIDTooLong", "257 bytes long"),
        (
            0,
            existing,
            1,
            CID,
            0,
            "ProposalAlreadyExists",
            f"proposal {format_proposal_id(existing_id)} already",
        ),
        (0, root_of("orphan"), 1, CID, 3, "WrongParent", "version 3 is not the current library version 0"),
    ]
    for proposer, root, size, cid, parent, error, words in cases:
        with refused(error, words):
            world.registry(proposer).propose(root, cid, tree_size=size, parent_version=parent, salt=SALT)
        pid = proposal_id(root, size, cid, parent, world.address(proposer), SALT)
        if error != "ProposalAlreadyExists":
            assert reg.proposal(pid) is None and reg.state(pid) is ProposalState.UNKNOWN
    kept = reg.proposal(existing_id)
    assert kept is not None and kept.cid == CID
    assert len(reg.proposal_created_events(world.deploy_block)) == 1
    reg.propose(root_of("max-cid"), "b" * 256, tree_size=1)  # the longest CID is accepted


def test_undelegated_balance_cannot_vote(world: World) -> None:
    proposal = open_proposal(world, "undelegated")
    assert world.token().balance(world.address(UNDELEGATED)) > 0
    with refused("NoVotingPower"):
        world.registry(UNDELEGATED).vote(proposal.id, True)


def test_unknown_proposal(world: World) -> None:
    reg = world.registry(1)
    ghost = proposal_id(root_of("ghost"), 1, CID, 0, world.address(1), SALT)
    assert reg.state(ghost) is ProposalState.UNKNOWN and reg.proposal(ghost) is None
    with refused("ProposalNotFound", f"there is no proposal {format_proposal_id(ghost)}"):
        reg.vote(ghost, True)
    with refused("ProposalNotFound"):
        reg.execute(ghost)
    with refused("ProposalNotFound"):
        reg.voting_weight(ghost, world.address(1))


def test_competing_proposal_becomes_stale(world: World) -> None:
    reg = world.registry()
    a = open_proposal(world, "competitor-a")
    b = open_proposal(world, "competitor-b")
    for pid in (a.id, b.id):
        for voter in (1, 3):
            world.registry(voter).vote(pid, True)
    world.advance(3 * 24 * 3600)
    late = open_proposal(world, "competitor-late")  # still voting when `a` executes
    to_executable(world, b)
    assert reg.state(a.id) is ProposalState.SUCCEEDED and reg.state(b.id) is ProposalState.SUCCEEDED
    reg.execute(a.id)
    assert reg.state(b.id) is ProposalState.STALE
    with refused("ProposalStale", "its parent version 0 is no longer the current library version 1"):
        reg.execute(b.id)
    assert reg.current_root() == a.root and reg.current_version() == 1
    assert reg.state(late.id) is ProposalState.STALE
    with refused("ProposalStale"):
        world.registry(2).vote(late.id, True)
    with refused("WrongParent"):
        reg.propose(root_of("competitor-c"), CID, tree_size=1, parent_version=0)


def test_front_running_a_proposal_cannot_squat_it(world: World) -> None:
    """Proposals were keyed by root: whoever saw a proposal in the mempool could propose the same root with a
    wrong CID first, and the honest proposal reverted (ProposalAlreadyExists) for good. Now the id includes
    the proposer, so the copy is only a second, competing proposal."""
    reg = world.registry()
    root = root_of("squatted")

    def send_propose(index: int, cid: str, tip_gwei: int) -> bytes:
        return world.w3.eth.send_transaction(
            {
                "from": world.address(index),
                "to": reg.address,
                "data": reg.contract.encode_abi("propose", args=[root, 1, cid, 0, SALT]),
                "gas": 500_000,
                "maxFeePerGas": Web3.to_wei(100, "gwei"),
                "maxPriorityFeePerGas": Web3.to_wei(tip_gwei, "gwei"),
            }
        )

    world.rpc("evm_setAutomine", False)
    try:
        squat_tx = send_propose(3, OTHER_CID, 5)  # copies root and salt from the mempool, mined first
        honest_tx = send_propose(0, CID, 1)
        world.rpc("evm_mine")
    finally:
        world.rpc("evm_setAutomine", True)
    honest_receipt = world.w3.eth.get_transaction_receipt(honest_tx)
    squat_receipt = world.w3.eth.get_transaction_receipt(squat_tx)
    assert honest_receipt["status"] == 1 and squat_receipt["status"] == 1
    assert honest_receipt["blockNumber"] == squat_receipt["blockNumber"]
    assert squat_receipt["transactionIndex"] < honest_receipt["transactionIndex"]

    honest_id = proposal_id(root, 1, CID, 0, world.address(0), SALT)
    squat_id = proposal_id(root, 1, OTHER_CID, 0, world.address(3), SALT)
    assert honest_id != squat_id
    events = reg.proposal_created_events(honest_receipt["blockNumber"], honest_receipt["blockNumber"])
    assert [(e.proposal_id, e.proposer, e.cid) for e in events] == [
        (squat_id, world.address(3), OTHER_CID),
        (honest_id, world.address(0), CID),
    ]
    honest, squat = reg.proposal(honest_id), reg.proposal(squat_id)
    assert honest is not None and squat is not None
    assert (honest.root, honest.cid, honest.proposer) == (root, CID, world.address(0))
    assert (squat.root, squat.cid, squat.proposer) == (root, OTHER_CID, world.address(3))

    world.advance(1)
    assert enact(world, honest, voters=(1, 2)) == 1
    assert reg.current() == reg.version_at(1)
    assert (reg.current_root(), reg.current_cid()) == (root, CID)
    assert reg.state(squat_id) is ProposalState.STALE


def test_a_defeated_root_can_be_proposed_again_with_a_new_salt(world: World) -> None:
    """A root used to be proposable once: after one failed vote it could never become a version."""
    reg = world.registry()
    first = open_proposal(world, "retry", salt=SALT)
    world.registry(1).vote(first.id, True)  # 200 W, below quorum
    to_executable(world, first)
    assert reg.state(first.id) is ProposalState.DEFEATED
    with refused("ProposalAlreadyExists", f"proposal {format_proposal_id(first.id)} already exists"):
        reg.propose(first.root, CID, tree_size=1, parent_version=0, salt=SALT)
    second = open_proposal(world, "retry", salt=b"\x01" * 32)
    assert second.id != first.id and second.root == first.root
    assert reg.state(second.id) is ProposalState.ACTIVE
    assert enact(world, second) == 1
    assert reg.current_root() == first.root
    assert reg.state(second.id) is ProposalState.EXECUTED and reg.state(first.id) is ProposalState.STALE


def test_rollback_to_an_earlier_root_and_stale_proposals_stay_stale(world: World) -> None:
    reg = world.registry()
    r1 = open_proposal(world, "R1", tree_size=2)
    assert enact(world, r1) == 1
    r2 = open_proposal(world, "R2", parent_version=1, tree_size=3)
    # A competitor on version 1 that passes its vote, but loses the race to r2.
    rival = open_proposal(world, "rival", parent_version=1, proposer=2)
    world.advance(3 * 24 * 3600)
    late = open_proposal(world, "late-rival", parent_version=1, proposer=2)  # still voting when r2 executes
    for voter in (1, 3):
        world.registry(voter).vote(rival.id, True)
    assert enact(world, r2) == 2
    assert reg.state(rival.id) is ProposalState.STALE and reg.state(late.id) is ProposalState.STALE
    with refused("ProposalStale", "its parent version 1 is no longer the current library version 2"):
        world.registry(1).vote(late.id, True)

    # Version 3 returns to R1's root (a rollback); the rival's parent was a version with that same root.
    r3 = open_proposal(world, "R1", parent_version=2, tree_size=2)
    assert r3.id != r1.id
    assert enact(world, r3) == 3
    assert [(v.version, v.root, v.tree_size) for v in reg.history()] == [
        (1, root_of("R1"), 2),
        (2, root_of("R2"), 3),
        (3, root_of("R1"), 2),
    ]
    assert reg.current_root() == root_of("R1")
    for stale in (rival, late):
        assert reg.state(stale.id) is ProposalState.STALE
        with refused("ProposalStale", "its parent version 1 is no longer the current library version 3"):
            reg.execute(stale.id)
    assert reg.current_version() == 3


def test_voter_registry_is_read_at_the_proposal_snapshot(world: World) -> None:
    """The registry used to be read at vote time: its owner could add or remove voters mid-vote, or move a
    person's registration to a second address that votes again."""
    gated, allowlist = world.gated(), world.allowlist(0)
    proposal = open_proposal(world, "gated", gated=True)
    assert not allowlist.is_registered(world.address(7))
    words = f"voter {world.address(7)} was not in the voter registry at the proposal's snapshot"
    with refused("VoterNotRegistered", f"{words} {proposal.snapshot} ("):
        world.gated(7).vote(proposal.id, True)
    world.gated(1).vote(proposal.id, True)
    with refused("OwnableUnauthorizedAccount", f"{world.address(7)} is not the owner"):
        world.allowlist(7).set_registered([world.address(7)])

    allowlist.set_registered([world.address(7)])  # registered mid-vote: too late for this proposal
    assert allowlist.is_registered(world.address(7))
    with refused("VoterNotRegistered"):
        world.gated(7).vote(proposal.id, True)
    # dev1 already voted; its registration moves to dev6, which must not vote a second time.
    allowlist.set_registered([world.address(1)], registered=False)
    allowlist.set_registered([world.address(6)])
    with refused("VoterNotRegistered"):
        world.gated(6).vote(proposal.id, True)
    changed = allowlist.set_registered([world.address(3)], registered=False)
    world.gated(3).vote(proposal.id, True)  # deregistered mid-vote: still registered at the snapshot
    assert gated.tallies(proposal.id).for_weight == (WEIGHTS[1] + WEIGHTS[3]) * W

    changed_at = world.block_time(changed.block_number)
    world.advance(1)
    for voter, before, after in ((1, True, False), (3, True, False), (6, False, True), (7, False, True)):
        assert allowlist.is_registered_at(world.address(voter), proposal.snapshot) is before, voter
        assert allowlist.is_registered_at(world.address(voter), changed_at) is after, voter
    assert allowlist.is_registered_at(world.address(3), changed_at - 1)
    future = world.now() + 3600
    with refused("RegistryFutureLookup", f"cannot read registrations at {future} ("):
        allowlist.is_registered_at(world.address(1), future)

    # A proposal made after the changes sees the new membership.
    later = open_proposal(world, "gated-later", gated=True)
    for voter in (6, 7):
        world.gated(voter).vote(later.id, True)
    for voter in (1, 3):
        with refused("VoterNotRegistered"):
            world.gated(voter).vote(later.id, True)
    assert gated.tallies(later.id).for_weight == (WEIGHTS[6] + WEIGHTS[7]) * W
    # The open registry of the same token takes dev9's vote without any registration.
    other = open_proposal(world, "open")
    world.registry(9).vote(other.id, True)
    assert world.registry().tallies(other.id).for_weight == WEIGHTS[9] * W


def test_constructor_validation(world: World) -> None:
    deployer = world.account(0)
    token = world.token_address
    eoa = world.address(9)
    with refused("InvalidToken"):
        deploy_registry(world.w3, deployer, eoa, artifacts=world.artifacts)
    with refused("InvalidVotingPeriod"):
        deploy_registry(world.w3, deployer, token, voting_period=0, artifacts=world.artifacts)
    with refused("InvalidGracePeriod", "the grace period must not be zero"):
        deploy_registry(world.w3, deployer, token, grace_period=0, artifacts=world.artifacts)
    with refused("InvalidQuorum", "the quorum must not be zero"):
        deploy_registry(world.w3, deployer, token, quorum=0, artifacts=world.artifacts)
    with refused("InvalidVoterRegistry", f"the voter registry {eoa} is not a contract"):
        deploy_registry(world.w3, deployer, token, voter_registry=eoa, artifacts=world.artifacts)
    # A contract whose clock() is not the block timestamp (this one answers 1 to every call).
    one_clock = Web3.to_checksum_address("0x" + "c1" * 20)
    world.rpc("anvil_setCode", one_clock, "0x600160005260206000f3")
    with refused("InvalidVoterRegistry"):
        deploy_registry(world.w3, deployer, token, voter_registry=one_clock, artifacts=world.artifacts)
    # Contracts passed by mistake: the token has a timestamp clock but no isRegisteredAt, a registry has
    # neither; with either, every vote would revert.
    for mistake in (token, world.registry_address):
        with refused("InvalidVoterRegistry"):
            deploy_registry(world.w3, deployer, token, voter_registry=mistake, artifacts=world.artifacts)
    with refused("KeeperTokenLengthMismatch", "1 holders but 0 amounts"):
        deploy_contract(world.w3, deployer, "KeeperToken", [eoa], [], artifacts=world.artifacts)
    # The defaults deploy: a non-zero quorum and the two-week grace period.
    address = deploy_registry(world.w3, deployer, token, artifacts=world.artifacts)
    params = RegistryClient(world.w3, address, artifacts=world.artifacts).params()
    assert (params.quorum, params.grace_period) == (DEFAULT_QUORUM, DEFAULT_GRACE_PERIOD)
    assert DEFAULT_QUORUM > 0


def test_proposal_ids_agree_and_resolve_from_prefixes(world: World) -> None:
    reg = world.registry(0)
    me = world.address(0)
    root = root_of("ids")
    tx = reg.propose(root, CID, tree_size=9, salt=SALT)
    local = proposal_id(root, 9, CID, 0, me, SALT)
    assert tx.proposal_id == local == reg.hash_proposal(root, 9, CID, 0, me, SALT)
    [event] = reg.proposal_created_events(tx.block_number, tx.block_number)
    assert (event.proposal_id, event.salt, event.tree_size) == (local, SALT, 9)
    # Every field enters the id, and the contract agrees on each variant.
    variants = [
        (root_of("ids2"), 9, CID, 0, me, SALT),
        (root, 10, CID, 0, me, SALT),
        (root, 9, OTHER_CID, 0, me, SALT),
        (root, 9, CID, 1, me, SALT),
        (root, 9, CID, 0, world.address(1), SALT),
        (root, 9, CID, 0, me, b"\x01" * 32),
    ]
    ids = [proposal_id(*v) for v in variants]
    assert len({local, *ids}) == len(variants) + 1
    assert ids == [reg.hash_proposal(*v) for v in variants]

    # Two more proposals whose ids share their first four hex digits.
    seen: dict[str, bytes] = {}
    for n in itertools.count(1):
        salt = n.to_bytes(32, "big")
        prefix = format_proposal_id(proposal_id(root, 9, CID, 0, me, salt))[:6]
        if prefix in seen:
            pair = (seen[prefix], salt)
            break
        seen[prefix] = salt
    twins = [reg.propose(root, CID, tree_size=9, salt=s).proposal_id for s in pair]
    shared = format_proposal_id(twins[0])[:6]
    assert format_proposal_id(twins[1]).startswith(shared)

    full = format_proposal_id(local)
    assert reg.resolve_proposal(full) == local
    assert reg.resolve_proposal(full[:10]) == local
    assert reg.resolve_proposal(" " + full[:12].upper() + " ") == local
    assert reg.resolve_proposal(format_proposal_id(twins[1])[:20]) == twins[1]
    with pytest.raises(ValueError, match=f"{shared[2:]} is ambiguous: 2 proposals match"):
        reg.resolve_proposal(shared)
    taken = {format_proposal_id(p)[2:6] for p in (local, *twins)}
    unknown = next(f"{n:04x}" for n in range(2**16) if f"{n:04x}" not in taken)
    with pytest.raises(ValueError, match=f"no proposal id starts with 0x{unknown}"):
        reg.resolve_proposal("0x" + unknown)
    with pytest.raises(ValueError, match="too short: give at least 4 hex digits"):
        reg.resolve_proposal(full[:5])
    with pytest.raises(ValueError, match="not a proposal id or id prefix"):
        reg.resolve_proposal("0xnothex")


def test_token_clock_and_self_delegation(world: World) -> None:
    token = world.token().contract.functions
    assert token.CLOCK_MODE().call() == "mode=timestamp"
    block = world.w3.eth.block_number
    assert token.clock().call(block_identifier=block) == world.block_time(block)
    assert world.token().delegates(world.address(1)) == world.address(1)
    assert world.token().delegates(world.address(UNDELEGATED)) is None
    assert world.token().get_votes(world.address(UNDELEGATED)) == 0


# ------------------------------------------------------------------------------------- quadratic weight

_UINT256_MAX = 2**256 - 1
_square_edges = st.integers(min_value=1, max_value=2**128 - 1).flatmap(
    lambda r: st.sampled_from([r * r - 1, r * r, r * r + 1])
)


@settings(max_examples=200, deadline=None)
@given(votes=st.one_of(st.integers(min_value=0, max_value=_UINT256_MAX), _square_edges))
@example(votes=0)
@example(votes=1)
@example(votes=_UINT256_MAX)
@example(votes=(2**128 - 1) ** 2)
def test_quadratic_weight_is_isqrt(deployed: World, votes: int) -> None:
    assert deployed.registry().quadratic_weight(votes) == math.isqrt(votes)


_VOTERS = sorted(WEIGHTS)


@settings(max_examples=12, deadline=None)
@given(ballots=st.dictionaries(st.sampled_from(_VOTERS), st.booleans(), min_size=1))
def test_tallies_and_outcome_follow_from_the_ballots(deployed: World, ballots: dict[int, bool]) -> None:
    """Invariant: the tallies are the sums of isqrt(votes at the snapshot) of the distinct voters on each
    side, a second vote changes nothing, and the outcome is exactly quorum-of-for and for > 2 x against."""
    snapshot = deployed.rpc("evm_snapshot")
    try:
        proposal = open_proposal(deployed, f"ballots-{sorted(ballots.items())}")
        for voter, support in ballots.items():
            deployed.registry(voter).vote(proposal.id, support)
        with refused("AlreadyVoted"):
            deployed.registry(next(iter(ballots))).vote(proposal.id, True)
        for_weight = sum(WEIGHTS[v] * W for v, s in ballots.items() if s)
        against_weight = sum(WEIGHTS[v] * W for v, s in ballots.items() if not s)
        tallies = deployed.registry().tallies(proposal.id)
        assert (tallies.for_weight, tallies.against_weight) == (for_weight, against_weight)
        deployed.advance(proposal.vote_end + EXECUTION_DELAY - deployed.now())
        passes = for_weight >= QUORUM and for_weight > 2 * against_weight
        state = deployed.registry().state(proposal.id)
        assert state is (ProposalState.SUCCEEDED if passes else ProposalState.DEFEATED)
    finally:
        deployed.rpc("evm_mine")
        assert deployed.rpc("evm_revert", snapshot) is True


# ----------------------------------------------------------------------------------------- Merkle proofs


def _leaves(n: int) -> list[bytes]:
    return [f"experience-{i}".encode() for i in range(n)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 100])
def test_verify_inclusion_accepts_python_proofs(deployed: World, size: int) -> None:
    reg = deployed.registry()
    leaves = _leaves(size)
    tree = merkle.MerkleTree.from_leaves(leaves)
    indices = range(size) if size <= 13 else [0, 1, 2, 31, 63, 64, 97, 98, 99]
    for index in indices:
        proof = tree.prove(index)
        leaf = merkle.leaf_hash(leaves[index])
        assert merkle.verify_inclusion(leaves[index], proof, tree.root)
        assert reg.verify_inclusion(leaf, proof.leaf_index, proof.tree_size, proof.path, tree.root)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 100])
def test_verify_inclusion_rejects_tampering(deployed: World, size: int) -> None:
    reg = deployed.registry()
    leaves = _leaves(size)
    tree = merkle.MerkleTree.from_leaves(leaves)
    index = size // 2
    proof = tree.prove(index)
    leaf = merkle.leaf_hash(leaves[index])

    def ok(leaf_hash: bytes, i: int, n: int, path: list[bytes], root: bytes = tree.root) -> bool:
        return reg.verify_inclusion(leaf_hash, i, n, path, root)

    assert ok(leaf, index, size, proof.path)
    assert not ok(merkle.leaf_hash(leaves[index] + b"!"), index, size, proof.path)
    assert not ok(hashlib.sha256(leaves[index]).digest(), index, size, proof.path)  # unprefixed hash
    assert not ok(leaf, index, size, proof.path, root_of("other root"))
    assert not ok(leaf, size, size, proof.path)  # index == tree size
    assert not ok(leaf, 2**256 - 1, size, proof.path)
    assert not ok(leaf, index, 0, proof.path)
    for other in range(size):
        if other != index:
            assert not ok(leaf, other, size, proof.path)
    for i in range(len(proof.path)):
        flipped = list(proof.path)
        flipped[i] = bytes([flipped[i][0] ^ 1]) + flipped[i][1:]
        assert not ok(leaf, index, size, flipped)
    if proof.path:
        assert not ok(leaf, index, size, proof.path[:-1])
    if len(proof.path) >= 2:
        assert not ok(leaf, index, size, list(reversed(proof.path)))
    assert not ok(leaf, index, size, [*proof.path, root_of("extra")])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 100])
def test_verify_inclusion_tree_size_is_checked(deployed: World, size: int) -> None:
    # RFC 9162 binds the size through the path's shape: a claimed size that changes the sequence of
    # left/right steps or the path length fails; one whose shape is identical (e.g. index 0 in 3 vs 4 leaves)
    # recomputes the same root and passes, in the RFC's algorithm as here. The chain must agree with the
    # Python verifier on every size, and refuse all sizes whose proofs have another length.
    reg = deployed.registry()
    leaves = _leaves(size)
    tree = merkle.MerkleTree.from_leaves(leaves)
    index = size - 1
    proof = tree.prove(index)
    leaf = merkle.leaf_hash(leaves[index])
    rejected = 0
    for claimed in range(1, 2 * size + 3):
        if claimed == size:
            continue
        forged = merkle.InclusionProof(index, claimed, proof.path)
        expected = merkle.verify_inclusion_hash(leaf, forged, tree.root)
        assert reg.verify_inclusion(leaf, index, claimed, proof.path, tree.root) is expected, claimed
        if index < claimed and len(merkle.MerkleTree.from_leaves(_leaves(claimed)).prove(index).path) != len(
            proof.path
        ):
            assert not expected, claimed
        rejected += not expected
    assert rejected > 0


def test_verify_inclusion_in_version_hashes_the_leaf_and_uses_the_stored_size(world: World) -> None:
    """The caller used to pass a leaf hash and a tree size: an interior node passed off as a leaf, or a real
    leaf at a wrong index of a smaller claimed tree, verified against a real version's root."""
    reg = world.registry()
    leaves = _leaves(5)
    tree = merkle.MerkleTree.from_leaves(leaves)
    tx = reg.propose(tree.root, CID, tree_size=5)
    world.advance(1)
    stored = reg.proposal(tx.proposal_id)
    assert stored is not None
    assert enact(world, stored) == 1
    assert reg.version_at(1).tree_size == 5
    for index in range(5):
        path = tree.prove(index).path
        assert reg.verify_inclusion_in_version(1, leaves[index], index, path)
        for other in range(7):
            if other != index:
                assert not reg.verify_inclusion_in_version(1, leaves[index], other, path), (index, other)
        assert not reg.verify_inclusion_in_version(1, merkle.leaf_hash(leaves[index]), index, path)
    assert not reg.verify_inclusion_in_version(1, b"forged", 2, tree.prove(2).path)

    # Leaf 4's path (one hash: the root of leaves 0-3) also proves it at index 1 of a 2-leaf tree.
    path4 = tree.prove(4).path
    assert reg.verify_inclusion(merkle.leaf_hash(leaves[4]), 1, 2, path4, tree.root)
    assert not reg.verify_inclusion_in_version(1, leaves[4], 1, path4)
    # The node over leaves 0 and 1 is "leaf 0" of a 3-leaf tree with the same root.
    h0, h1 = merkle.leaf_hash(leaves[0]), merkle.leaf_hash(leaves[1])
    node, node_path = merkle.node_hash(h0, h1), tree.prove(0).path[1:]
    assert reg.verify_inclusion(node, 0, 3, node_path, tree.root)
    for forged in (node, h0 + h1, b"\x01" + h0 + h1):
        for index in range(5):
            assert not reg.verify_inclusion_in_version(1, forged, index, node_path)

    path0 = tree.prove(0).path
    assert not reg.verify_inclusion_in_version(0, leaves[0], 0, path0)  # the empty genesis holds nothing
    assert not reg.verify_inclusion_in_version(0, b"", 0, [])
    with refused("UnknownVersion", "library version 2 does not exist (the current version is 1)"):
        reg.verify_inclusion_in_version(2, leaves[0], 0, path0)


def test_event_signatures_and_indexed_fields(artifacts_abi: dict[str, str]) -> None:
    assert artifacts_abi == {
        "ProposalCreated": (
            "uint256 indexed proposalId,bytes32 indexed root,address indexed proposer,uint256 treeSize,"
            "string cid,uint256 parentVersion,bytes32 salt,uint48 snapshot,uint48 voteStart,uint48 voteEnd"
        ),
        "VoteCast": "uint256 indexed proposalId,address indexed voter,bool support,uint256 weight",
        "LibraryUpdated": "uint256 indexed version,bytes32 indexed root,uint256 treeSize,string cid",
        "ProposalExecuted": "uint256 indexed proposalId,uint256 indexed version",
        "CallProposed": (
            "uint256 indexed proposalId,address indexed target,address indexed proposer,bytes data,"
            "bytes32 salt,uint48 snapshot,uint48 voteStart,uint48 voteEnd"
        ),
        "CallExecuted": "uint256 indexed proposalId,address indexed target",
        "ProposalCanceled": "uint256 indexed proposalId,address indexed by",
        "BaseModelSet": "bytes32 indexed modelHash,bool approved",
    }


@pytest.fixture
def artifacts_abi(deployed: World) -> dict[str, str]:
    abi = deployed.artifacts.get("ExperienceRegistry").abi
    return {
        e["name"]: ",".join(
            f"{i['type']}{' indexed' if i['indexed'] else ''} {i['name']}" for i in e["inputs"]
        )
        for e in abi
        if e["type"] == "event"
    }


def test_client_without_account_reads_but_cannot_send(world: World) -> None:
    reader = RegistryClient(world.w3, world.registry_address, artifacts=world.artifacts)
    assert reader.current_version() == 0
    with pytest.raises(Exception, match="no signing account"):
        reader.propose(root_of("x"), CID, tree_size=1)
    assert Web3.is_checksum_address(reader.address)


# --------------------------------------------------------------------------------------------- reverts


def test_revert_mined_after_a_passing_estimate_is_decoded(world: World) -> None:
    # The estimate runs while voting is open; the block that includes the vote is pinned to voteEnd, so the
    # transaction reverts on chain. The client must still name the error (by replaying in that block).
    proposal = open_proposal(world, "race")
    outcome: dict[str, BaseException | None] = {}

    def vote() -> None:
        try:
            world.registry(1).vote(proposal.id, True)
            outcome["error"] = None
        except BaseException as exc:  # handed to the main thread
            outcome["error"] = exc

    world.rpc("evm_setAutomine", False)
    try:
        voter = threading.Thread(target=vote)
        voter.start()
        deadline = time.monotonic() + 10
        while int(world.rpc("txpool_status")["pending"], 16) == 0:
            assert time.monotonic() < deadline and voter.is_alive(), outcome
            time.sleep(0.01)
        world.pin_next_block(proposal.vote_end)
        world.rpc("evm_mine")
        voter.join(10)
    finally:
        world.rpc("evm_setAutomine", True)
    error = outcome["error"]
    assert isinstance(error, ContractRevert), error
    assert error.error == "VotingClosed" and error.tx_hash is not None
    assert f"(transaction {error.tx_hash})" in str(error)
    receipt = world.w3.eth.get_transaction_receipt(error.tx_hash)
    assert receipt["status"] == 0
    assert not world.registry().has_voted(proposal.id, world.address(1))


def test_describe_revert_in_words() -> None:
    voter = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    pid = int.from_bytes(bytes(range(32)), "big")
    selector = Web3.keccak(text="AlreadyVoted(uint256,address)")[:4]
    data = selector + abi_encode(["uint256", "address"], [pid, voter])
    message, name, args = describe_revert("0x" + data.hex())
    assert message == f"already voted on this proposal (voter {voter})"
    assert name == "AlreadyVoted" and args == {"proposalId": pid, "voter": voter}
    not_found = Web3.keccak(text="ProposalNotFound(uint256)")[:4] + abi_encode(["uint256"], [5])
    assert describe_revert(not_found)[0] == "there is no proposal 0x" + "0" * 63 + "5"

    reason = Web3.keccak(text="Error(string)")[:4] + abi_encode(["string"], ["nope"])
    assert describe_revert(reason)[0] == "reverted: nope"
    panic = Web3.keccak(text="Panic(uint256)")[:4] + abi_encode(["uint256"], [0x11])
    assert describe_revert(panic)[0] == "contract panicked: arithmetic overflow or underflow (code 0x11)"
    message, name, _ = describe_revert("0xdeadbeef0102")
    assert name is None and message == "reverted with unknown error 0xdeadbeef (data 0xdeadbeef0102)"
    assert describe_revert("0x")[0] == "the transaction reverted without a reason"
    # A known selector with undecodable arguments falls back to hex instead of raising.
    assert "unknown error 0x" + selector.hex() in describe_revert(selector + b"\x01")[0]


# ---- issue 15, item 5: hostile CIDs ----------------------------------------------------------------

PROPOSE_SELECTOR = Web3.keccak(text="propose(bytes32,uint256,string,uint256,bytes32)")[:4]


@pytest.mark.parametrize(
    ("cid", "accepted"),
    [
        (CID, True),
        ("QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG", True),  # CIDv0
        ("zdj7WWeQ43G6JJvLWQWZpyHuAMq6uYWRjkBXFad11vE2LHhQ7", True),  # base58btc CIDv1
        ("uAXASIAfH5aTAbPJWnO8_tR-hN2-GKAN8l3Dr", True),  # base64url CIDv1
        ("Qm123", False),  # CIDv0 of the wrong length
        ("QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbd0", False),  # 0 is not base58
        ("xafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqab", False),  # no such multibase prefix
        ("bafy beig", False),
        ("bafy\nbeig", False),
        ("bafyé", False),  # UTF-8, but not a multibase character
        ("b", False),
    ],
)
def test_cids_the_registry_accepts_are_exactly_what_the_client_calls_valid(
    world: World, cid: str, accepted: bool
) -> None:
    from zoo.registry.chain import cid_problem

    assert (cid_problem(cid) is None) is accepted
    reg = world.registry(0)
    root = root_of(f"cid-{cid}")
    if accepted:
        pid = reg.propose(root, cid, tree_size=1).proposal_id
        assert reg.proposal(pid).cid == cid
    else:
        with refused("InvalidCID", "not a CIDv0 or a multibase CIDv1 string"):
            reg.propose(root, cid, tree_size=1)


def test_a_cid_that_is_not_utf8_is_refused_on_chain(world: World) -> None:
    """Bytes that are not UTF-8 made every client's listing raise, for good (the event stays)."""
    reg = world.registry(0)

    def calldata(cid: bytes) -> bytes:
        return PROPOSE_SELECTOR + abi_encode(
            ["bytes32", "uint256", "bytes", "uint256", "bytes32"], [root_of("raw"), 1, cid, 0, ZERO]
        )

    with refused("InvalidCID", "character 1 breaks the rule"):
        reg._sender.send(reg.address, calldata(b"b\xff\xfe"))
    assert reg.proposal_created_events(world.deploy_block) == []
    reg._sender.send(reg.address, calldata(CID.encode()))  # the same encoding with valid bytes is accepted
    [event] = reg.proposal_created_events(world.deploy_block)
    assert event.proposal_id == proposal_id(root_of("raw"), 1, CID, 0, world.address(0), ZERO)


def _log_emitter(topics: list[bytes], data: bytes) -> bytes:
    """Runtime bytecode that emits one LOG0-LOG4 of `data` with `topics` on any call, then stops."""
    assert len(topics) <= 4
    size = len(data).to_bytes(2, "big")
    body = b"".join(b"\x7f" + t for t in reversed(topics))  # PUSH32 the last topic first, topic0 on top
    prefix_len = 3 + 3 + 2 + 1 + len(body) + 3 + 2 + 1 + 1
    log = bytes([0xA0 + len(topics)])
    code = (
        b"\x61" + size + b"\x61" + prefix_len.to_bytes(2, "big") + b"\x60\x00" + b"\x39"  # CODECOPY to 0
        + body + b"\x61" + size + b"\x60\x00" + log + b"\x00"  # LOGn(0, size, topic0, ...); STOP
    )  # fmt: skip
    assert len(code) == prefix_len
    return code + data


def test_a_crafted_event_with_a_non_utf8_cid_does_not_break_the_client(world: World) -> None:
    """An old deployment's history may hold such an event: listings show it as invalid instead of raising,
    and nothing would hand its CID to IPFS."""
    from zoo.registry.chain import cid_problem, shown_cid

    topic0 = Web3.keccak(
        text="ProposalCreated(uint256,bytes32,address,uint256,string,uint256,bytes32,uint48,uint48,uint48)"
    )
    assert "0x" + topic0.hex() == world.registry().contract.events.ProposalCreated().topic
    pid = (42).to_bytes(32, "big")
    proposer = bytes(12) + bytes.fromhex(world.address(1)[2:])
    data = abi_encode(
        ["uint256", "bytes", "uint256", "bytes32", "uint48", "uint48", "uint48"],
        [7, b"Qm\xff\xfe", 4, SALT, 1, 2, 3],
    )
    emitter = Web3.to_checksum_address("0x" + "ee" * 20)
    code = _log_emitter([topic0, pid, root_of("crafted"), proposer], data)
    world.rpc("anvil_setCode", emitter, "0x" + code.hex())
    tx = world.w3.eth.send_transaction({"from": world.address(0), "to": emitter, "gas": 200_000})
    assert world.w3.eth.wait_for_transaction_receipt(tx)["status"] == 1
    events = RegistryClient(world.w3, emitter).proposal_created_events(world.deploy_block)
    assert len(events) == 1
    event = events[0]
    assert (event.proposal_id, event.root, event.proposer) == (42, root_of("crafted"), world.address(1))
    assert (event.tree_size, event.parent_version, event.salt) == (7, 4, SALT)
    assert (event.snapshot, event.vote_start, event.vote_end) == (1, 2, 3)
    assert cid_problem(event.cid) is not None
    assert shown_cid(event.cid) == "<invalid CID Qm\\udcff\\udcfe>"


def test_proposal_ids_are_read_as_hex_only() -> None:
    from zoo.registry.chain import format_proposal_id, parse_proposal_id

    assert parse_proposal_id("0x1234") == 0x1234 == parse_proposal_id(" 0X1234 ")
    assert parse_proposal_id(format_proposal_id(2**256 - 1)) == 2**256 - 1
    for bad in ("1234", "0x", "0x" + "1" * 65, "0xg1", -1):
        with pytest.raises(ValueError, match="not a proposal id"):
            parse_proposal_id(bad)
