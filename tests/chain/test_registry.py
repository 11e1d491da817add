"""ExperienceRegistry on a real anvil chain: lifecycle, every refusal, quadratic weights, Merkle proofs."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from eth_abi import encode as abi_encode
from hypothesis import example, given, settings
from hypothesis import strategies as st
from web3 import Web3

from tests.chain.support import (
    BELOW_THRESHOLD,
    EMPTY,
    EXECUTION_DELAY,
    PROPOSAL_THRESHOLD,
    QUORUM,
    UNDELEGATED,
    VOTING_PERIOD,
    WEIGHTS,
    W,
    World,
    units_for_weight,
)
from zoo.registry import merkle
from zoo.registry.chain import (
    ContractRevert,
    Proposal,
    ProposalState,
    RegistryClient,
    deploy_contract,
    deploy_registry,
    describe_revert,
)

ZERO = bytes(32)
CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


def root_of(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


@contextmanager
def refused(error: str, match: str | None = None) -> Iterator[None]:
    """The block must raise ContractRevert for custom error `error` (and a message containing `match`)."""
    with pytest.raises(ContractRevert) as info:
        yield
    assert info.value.error == error, str(info.value)
    if match is not None:
        assert match in str(info.value), str(info.value)


def open_proposal(
    world: World, label: str, parent: bytes | None = None, proposer: int = 0, cid: str = CID
) -> Proposal:
    """Propose root_of(label) and move one second on, into the voting window."""
    reg = world.registry(proposer)
    reg.propose(root_of(label), cid, parent)
    world.advance(1)
    proposal = reg.proposal(root_of(label))
    assert proposal is not None
    return proposal


def to_executable(world: World, proposal: Proposal) -> None:
    world.advance(proposal.vote_end + EXECUTION_DELAY - world.now())


def test_initial_state_is_empty_version_zero(world: World) -> None:
    reg = world.registry()
    current = reg.current()
    assert (current.version, current.root, current.cid) == (0, ZERO, "")
    assert reg.current_root() == ZERO and reg.current_version() == 0 and reg.current_cid() == ""
    assert reg.history() == []
    assert [v.version for v in reg.history(include_genesis=True)] == [0]
    with refused("UnknownVersion", "library version 1 does not exist"):
        reg.version_at(1)
    params = reg.params()
    assert (params.voting_period, params.execution_delay) == (VOTING_PERIOD, EXECUTION_DELAY)
    assert (params.proposal_threshold, params.quorum, params.voter_registry) == (
        PROPOSAL_THRESHOLD,
        QUORUM,
        None,
    )
    assert world.gated().params().voter_registry == world.allowlist_address


def test_full_lifecycle_two_versions(world: World) -> None:
    reg = world.registry(0)
    first = root_of("v1")
    result = reg.propose(first, CID, ZERO)
    created_at = world.block_time(result.block_number)
    [created] = reg.proposal_created_events(result.block_number, result.block_number)
    assert created.root == first and created.proposer == world.address(0) and created.parent_root == ZERO
    assert created.cid == CID
    assert (created.snapshot, created.vote_start, created.vote_end) == (
        created_at - 1,
        created_at + 1,
        created_at + 1 + VOTING_PERIOD,
    )
    world.advance(1)
    assert reg.state(first) is ProposalState.ACTIVE

    for voter, support in ((1, True), (3, True), (2, False)):
        res = world.registry(voter).vote(first, support)
        [event] = world.registry().contract.events.VoteCast().process_receipt(res.receipt)
        assert event["args"]["voter"] == world.address(voter)
        assert event["args"]["weight"] == WEIGHTS[voter] * W
        assert reg.has_voted(first, world.address(voter))
    tallies = reg.tallies(first)
    assert (tallies.for_weight, tallies.against_weight) == ((200 + 201) * W, 100 * W)
    assert not reg.has_voted(first, world.address(0))

    proposal = reg.proposal(first)
    assert proposal is not None
    world.advance(proposal.vote_end - world.now())
    assert reg.state(first) is ProposalState.QUEUED
    to_executable(world, proposal)
    assert reg.state(first) is ProposalState.SUCCEEDED
    executed = world.registry(6).execute(first)  # anyone may execute
    [update] = reg.library_updated_events(executed.block_number, executed.block_number)
    assert (update.version, update.root, update.cid) == (1, first, CID)
    assert reg.state(first) is ProposalState.EXECUTED
    current = reg.current()
    assert (current.version, current.root, current.cid) == (1, first, CID)
    assert current.timestamp == world.block_time(executed.block_number)

    second = root_of("v2")
    with refused("WrongParent"):
        reg.propose(second, "bafy-v2", ZERO)
    p2 = open_proposal(world, "v2", parent=first, cid="bafy-v2")
    assert p2.parent_root == first
    for voter in (1, 3):
        world.registry(voter).vote(second, True)
    to_executable(world, p2)
    reg.execute(second)

    assert reg.current_version() == 2 and reg.current_root() == second and reg.current_cid() == "bafy-v2"
    history = reg.history()
    assert [(v.version, v.root, v.cid) for v in history] == [(1, first, CID), (2, second, "bafy-v2")]
    assert history[0].timestamp < history[1].timestamp
    events = reg.library_updated_events(world.deploy_block)
    assert [(e.version, e.root) for e in events] == [(1, first), (2, second)]
    # Indexed fields are real topics: filtering by version on the node returns just that event.
    by_version = reg.contract.events.LibraryUpdated().get_logs(
        argument_filters={"version": 2}, from_block=world.deploy_block
    )
    assert [e["args"]["root"] for e in by_version] == [second]


def test_voting_twice_is_refused(world: World) -> None:
    root = root_of("twice")
    open_proposal(world, "twice")
    voter = world.registry(1)
    voter.vote(root, True)
    before = voter.tallies(root)
    for support in (True, False):
        with refused("AlreadyVoted", f"already voted on this proposal (voter {world.address(1)})"):
            voter.vote(root, support)
    assert voter.tallies(root) == before


def test_tokens_moved_after_the_proposal_do_not_vote_again(world: World) -> None:
    root = root_of("moved")
    open_proposal(world, "moved")
    sender, receiver = world.registry(1), world.registry(EMPTY)
    sender.vote(root, True)
    world.token(1).transfer(world.address(EMPTY), world.token(1).balance(world.address(1)))
    world.token(EMPTY).delegate()
    assert world.token().get_votes(world.address(EMPTY)) == units_for_weight(WEIGHTS[1])
    with refused("NoVotingPower"):
        receiver.vote(root, True)
    assert not sender.has_voted(root, world.address(EMPTY))
    assert sender.tallies(root).for_weight == WEIGHTS[1] * W

    # A receiver that already had weight keeps exactly its pre-proposal weight, none of the moved tokens.
    world.token(3).transfer(world.address(2), world.token(3).balance(world.address(3)))
    assert sender.voting_weight(root, world.address(2)) == WEIGHTS[2] * W
    world.registry(2).vote(root, True)
    assert sender.tallies(root).for_weight == (WEIGHTS[1] + WEIGHTS[2]) * W


def test_tokens_bought_after_the_proposal_do_not_count(world: World) -> None:
    root = root_of("bought")
    open_proposal(world, "bought")
    world.token(3).transfer(world.address(EMPTY), units_for_weight(150))  # the "purchase"
    world.token(EMPTY).delegate()
    with refused("NoVotingPower", "had no votes at its snapshot"):
        world.registry(EMPTY).vote(root, True)
    # The same tokens do count for a proposal made in a later second than their arrival.
    world.advance(1)
    later = open_proposal(world, "bought-later")
    assert world.registry().voting_weight(later.root, world.address(EMPTY)) == 150 * W
    world.registry(EMPTY).vote(later.root, True)
    assert world.registry().tallies(later.root).for_weight == 150 * W


def test_tokens_received_in_the_proposal_second_do_not_count(world: World) -> None:
    # A same-second (flash-loan style) top-up lands at the snapshot's second + 1 and is not counted.
    ts = world.now() + 5
    world.pin_next_block(ts)
    world.token(3).transfer(world.address(1), units_for_weight(100))
    world.pin_next_block(ts)
    world.registry(1).propose(root_of("flash"), CID)
    world.advance(1)
    assert world.registry().voting_weight(root_of("flash"), world.address(1)) == WEIGHTS[1] * W
    world.registry(1).vote(root_of("flash"), True)
    assert world.registry().tallies(root_of("flash")).for_weight == WEIGHTS[1] * W


def test_voting_in_the_proposal_second_is_refused(world: World) -> None:
    # Voting opens the second after the proposal; anvil lets us mine blocks within the proposal's second.
    reg = world.registry(1)
    root = root_of("early")
    result = world.registry(0).propose(root, CID)
    created_at = world.block_time(result.block_number)
    world.pin_next_block(created_at)
    assert reg.state(root) is ProposalState.PENDING
    with refused("VotingNotStarted", "has not started yet"):
        reg.vote(root, True)
    world.rpc("evm_mine")
    assert world.now() == created_at
    assert not reg.has_voted(root, world.address(1)) and reg.tallies(root).cast == 0
    world.pin_next_block(created_at + 1)
    reg.vote(root, True)
    assert reg.tallies(root).for_weight == WEIGHTS[1] * W


def test_voting_window_end_is_exclusive(world: World) -> None:
    proposal = open_proposal(world, "window")
    world.pin_next_block(proposal.vote_end - 1)
    world.registry(1).vote(proposal.root, True)  # last second of the window
    world.pin_next_block(proposal.vote_end)
    with refused("VotingClosed", "is closed"):
        world.registry(3).vote(proposal.root, True)
    world.rpc("evm_mine")
    assert world.registry().tallies(proposal.root).for_weight == WEIGHTS[1] * W
    assert not world.registry().has_voted(proposal.root, world.address(3))
    world.advance(30 * 24 * 3600)
    with refused("VotingClosed"):
        world.registry(2).vote(proposal.root, False)


def test_execute_too_early_then_exactly_on_time_then_twice(world: World) -> None:
    reg = world.registry()
    proposal = open_proposal(world, "timing")
    for voter in (1, 3):
        world.registry(voter).vote(proposal.root, True)
    with refused("ExecutionTooEarly", "cannot be executed before"):
        reg.execute(proposal.root)  # voting still open
    executable_at = proposal.vote_end + EXECUTION_DELAY
    world.pin_next_block(executable_at - 1)
    with refused("ExecutionTooEarly"):
        reg.execute(proposal.root)
    world.rpc("evm_mine")
    assert reg.state(proposal.root) is ProposalState.QUEUED
    assert reg.current_version() == 0
    world.pin_next_block(executable_at)
    reg.execute(proposal.root)
    assert reg.current_version() == 1
    with refused("ProposalAlreadyExecuted", "was already executed"):
        reg.execute(proposal.root)
    assert reg.current_version() == 1 and len(reg.library_updated_events(world.deploy_block)) == 1


@pytest.mark.parametrize(("extra_voter", "passes"), [(9, False), (7, True)])
def test_quorum_is_inclusive(world: World, extra_voter: int, passes: bool) -> None:
    # 200 + 49 = 249 W < quorum 250 W; 200 + 50 = 250 W reaches it.
    reg = world.registry()
    proposal = open_proposal(world, f"quorum-{extra_voter}")
    world.registry(1).vote(proposal.root, True)
    world.registry(extra_voter).vote(proposal.root, True)
    to_executable(world, proposal)
    cast = (WEIGHTS[1] + WEIGHTS[extra_voter]) * W
    if passes:
        reg.execute(proposal.root)
        assert reg.current_root() == proposal.root
    else:
        assert reg.state(proposal.root) is ProposalState.DEFEATED
        with refused("QuorumNotReached", f"{cast} weight for, {QUORUM} needed"):
            reg.execute(proposal.root)
        assert reg.current_root() == ZERO and reg.current_version() == 0


def test_below_quorum_with_only_one_voter(world: World) -> None:
    proposal = open_proposal(world, "lonely")
    world.registry(1).vote(proposal.root, True)
    to_executable(world, proposal)
    with refused("QuorumNotReached"):
        world.registry().execute(proposal.root)


@pytest.mark.parametrize(("for_voter", "passes"), [(1, False), (3, True)])
def test_two_thirds_supermajority_is_strict(world: World, for_voter: int, passes: bool) -> None:
    # Against: dev0 and dev7, 150 W. For: dev2 (100 W) and dev1 (200 W): exactly 2 x against, fails; or
    # dev2 and dev3 (201 W): 301 W passes. Both reach the quorum of 250 W with for votes alone.
    reg = world.registry()
    proposal = open_proposal(world, f"majority-{for_voter}")
    for voter in (for_voter, 2):
        world.registry(voter).vote(proposal.root, True)
    for voter in (0, 7):
        world.registry(voter).vote(proposal.root, False)
    tallies = reg.tallies(proposal.root)
    for_weight = (WEIGHTS[for_voter] + 100) * W
    assert tallies.against_weight == 150 * W and tallies.for_weight == for_weight
    assert tallies.supermajority is passes and tallies.quorum_reached(QUORUM)
    to_executable(world, proposal)
    if passes:
        assert reg.state(proposal.root) is ProposalState.SUCCEEDED
        reg.execute(proposal.root)
        assert reg.current_root() == proposal.root and reg.current_version() == 1
    else:
        assert reg.state(proposal.root) is ProposalState.DEFEATED
        with refused("ProposalDefeated", f"{300 * W} for and {150 * W} against"):
            reg.execute(proposal.root)
        assert reg.current_root() == ZERO and reg.current_version() == 0


def test_against_votes_never_count_toward_quorum(world: World) -> None:
    """Issue 15, item 4: 249 W for and 20 W against used to make 269 W "cast", over the 250 W quorum, so an
    opponent's vote lifted the proposal over quorum and it executed. Only support counts now."""
    reg = world.registry()
    proposal = open_proposal(world, "against-lifts-quorum")
    for voter in (1, 9):  # 200 + 49 = 249 W for
        world.registry(voter).vote(proposal.root, True)
    world.registry(6).vote(proposal.root, False)  # 20 W against
    tallies = reg.tallies(proposal.root)
    assert tallies.cast >= QUORUM and tallies.supermajority and not tallies.quorum_reached(QUORUM)
    to_executable(world, proposal)
    assert reg.state(proposal.root) is ProposalState.DEFEATED
    with refused("QuorumNotReached", f"{249 * W} weight for, {QUORUM} needed"):
        reg.execute(proposal.root)
    assert reg.current_root() == ZERO and reg.current_version() == 0


def test_proposal_refusals(world: World) -> None:
    reg = world.registry(0)
    existing = root_of("existing")
    reg.propose(existing, CID, ZERO)
    cases = [
        (
            BELOW_THRESHOLD,
            root_of("poor"),
            CID,
            ZERO,
            "InsufficientProposerVotes",
            "below the proposal threshold",
        ),
        (UNDELEGATED, root_of("undelegated"), CID, ZERO, "InsufficientProposerVotes", "had 0 votes"),
        (0, ZERO, CID, ZERO, "ZeroRoot", "must not be zero"),
        (0, root_of("no-cid"), "", ZERO, "EmptyCID", "must not be empty"),
        (0, root_of("long-cid"), "b" * 257, ZERO, "CIDTooLong", "257 bytes long"),
        (0, existing, "bafy-other", ZERO, "ProposalAlreadyExists", "already exists"),
        (0, root_of("orphan"), CID, root_of("nowhere"), "WrongParent", "is not the current library root"),
    ]
    for proposer, root, cid, parent, error, words in cases:
        with refused(error, words):
            world.registry(proposer).propose(root, cid, parent)
        if root not in (existing, ZERO):
            assert reg.proposal(root) is None and reg.state(root) is ProposalState.UNKNOWN
    kept = reg.proposal(existing)
    assert kept is not None and kept.cid == CID
    assert len(reg.proposal_created_events(world.deploy_block)) == 1
    reg.propose(root_of("max-cid"), "b" * 256, ZERO)  # the longest CID is accepted


def test_undelegated_balance_cannot_vote(world: World) -> None:
    proposal = open_proposal(world, "undelegated")
    assert world.token().balance(world.address(UNDELEGATED)) > 0
    with refused("NoVotingPower"):
        world.registry(UNDELEGATED).vote(proposal.root, True)


def test_unknown_proposal(world: World) -> None:
    reg = world.registry(1)
    ghost = root_of("ghost")
    assert reg.state(ghost) is ProposalState.UNKNOWN and reg.proposal(ghost) is None
    with refused("ProposalNotFound", "there is no proposal"):
        reg.vote(ghost, True)
    with refused("ProposalNotFound"):
        reg.execute(ghost)


def test_competing_proposal_becomes_stale(world: World) -> None:
    reg = world.registry()
    a = open_proposal(world, "competitor-a")
    b = open_proposal(world, "competitor-b")
    for root in (a.root, b.root):
        for voter in (1, 3):
            world.registry(voter).vote(root, True)
    world.advance(3 * 24 * 3600)
    late = open_proposal(world, "competitor-late")  # still voting when `a` executes
    to_executable(world, b)
    assert reg.state(a.root) is ProposalState.SUCCEEDED and reg.state(b.root) is ProposalState.SUCCEEDED
    reg.execute(a.root)
    assert reg.state(b.root) is ProposalState.STALE
    with refused("ProposalStale", f"its parent 0x{ZERO.hex()} is no longer the current library root"):
        reg.execute(b.root)
    assert reg.current_root() == a.root and reg.current_version() == 1
    assert reg.state(late.root) is ProposalState.STALE
    with refused("ProposalStale"):
        world.registry(2).vote(late.root, True)
    with refused("WrongParent"):
        reg.propose(root_of("competitor-c"), CID, ZERO)


def test_voter_registry_refuses_unregistered_voters(world: World) -> None:
    gated, allowlist = world.gated(), world.allowlist(0)
    root = root_of("gated")
    gated.propose(root, CID, ZERO)
    world.advance(1)
    assert not allowlist.is_registered(world.address(7))
    with refused("VoterNotRegistered", f"voter {world.address(7)} is not in the voter registry"):
        world.gated(7).vote(root, True)
    world.gated(1).vote(root, True)
    assert gated.tallies(root).for_weight == WEIGHTS[1] * W
    with refused("OwnableUnauthorizedAccount", f"{world.address(7)} is not the owner"):
        world.allowlist(7).set_registered([world.address(7)])
    allowlist.set_registered([world.address(7)])
    world.gated(7).vote(root, True)
    assert gated.tallies(root).for_weight == (WEIGHTS[1] + WEIGHTS[7]) * W
    allowlist.set_registered([world.address(3)], registered=False)
    with refused("VoterNotRegistered"):
        world.gated(3).vote(root, True)
    # The open registry of the same token takes dev7's vote without any registration.
    other = open_proposal(world, "open")
    world.registry(7).vote(other.root, True)


def test_constructor_validation(world: World) -> None:
    deployer = world.account(0)
    eoa = world.address(9)
    with refused("InvalidToken"):
        deploy_registry(world.w3, deployer, eoa, artifacts=world.artifacts)
    with refused("InvalidVotingPeriod"):
        deploy_registry(world.w3, deployer, world.token_address, voting_period=0, artifacts=world.artifacts)
    with refused("InvalidVoterRegistry"):
        deploy_registry(
            world.w3, deployer, world.token_address, voter_registry=eoa, artifacts=world.artifacts
        )
    with refused("KeeperTokenLengthMismatch", "1 holders but 0 amounts"):
        deploy_contract(world.w3, deployer, "KeeperToken", [eoa], [], artifacts=world.artifacts)


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


def test_verify_inclusion_in_version(world: World) -> None:
    leaves = _leaves(13)
    tree = merkle.MerkleTree.from_leaves(leaves)
    reg = world.registry()
    reg.propose(tree.root, CID, ZERO)
    world.advance(1)
    for voter in (1, 3):
        world.registry(voter).vote(tree.root, True)
    proposal = reg.proposal(tree.root)
    assert proposal is not None
    to_executable(world, proposal)
    reg.execute(tree.root)
    proof = tree.prove(7)
    leaf = merkle.leaf_hash(leaves[7])
    assert reg.verify_inclusion_in_version(1, leaf, 7, 13, proof.path)
    assert not reg.verify_inclusion_in_version(1, merkle.leaf_hash(b"forged"), 7, 13, proof.path)
    assert not reg.verify_inclusion_in_version(0, leaf, 7, 13, proof.path)  # the empty genesis holds nothing
    with refused("UnknownVersion"):
        reg.verify_inclusion_in_version(2, leaf, 7, 13, proof.path)


def test_event_fields_are_indexed(artifacts_abi: dict[str, list[bool]]) -> None:
    assert artifacts_abi == {
        "ProposalCreated": [True, True, False, False, False, False, False],
        "VoteCast": [True, True, False, False],
        "LibraryUpdated": [True, True, False],
        "ProposalExecuted": [True],
    }


@pytest.fixture
def artifacts_abi(deployed: World) -> dict[str, list[bool]]:
    abi = deployed.artifacts.get("ExperienceRegistry").abi
    return {e["name"]: [i["indexed"] for i in e["inputs"]] for e in abi if e["type"] == "event"}


def test_client_without_account_reads_but_cannot_send(world: World) -> None:
    reader = RegistryClient(world.w3, world.registry_address, artifacts=world.artifacts)
    assert reader.current_version() == 0
    with pytest.raises(Exception, match="no signing account"):
        reader.propose(root_of("x"), CID)
    assert Web3.is_checksum_address(reader.address)


# --------------------------------------------------------------------------------------------- reverts


def test_revert_mined_after_a_passing_estimate_is_decoded(world: World) -> None:
    # The estimate runs while voting is open; the block that includes the vote is pinned to voteEnd, so the
    # transaction reverts on chain. The client must still name the error (by replaying in that block).
    proposal = open_proposal(world, "race")
    outcome: dict[str, BaseException | None] = {}

    def vote() -> None:
        try:
            world.registry(1).vote(proposal.root, True)
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
    assert not world.registry().has_voted(proposal.root, world.address(1))


def test_describe_revert_in_words() -> None:
    voter = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    root = bytes(range(32))
    selector = Web3.keccak(text="AlreadyVoted(bytes32,address)")[:4]
    data = selector + abi_encode(["bytes32", "address"], [root, voter])
    message, name, args = describe_revert("0x" + data.hex())
    assert message == f"already voted on this proposal (voter {voter})"
    assert name == "AlreadyVoted" and args == {"root": root, "voter": voter}

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

PROPOSE_SELECTOR = Web3.keccak(text="propose(bytes32,string,bytes32)")[:4]


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
        reg.propose(root, cid, ZERO)
        assert reg.proposal(root).cid == cid
    else:
        with refused("InvalidCID", "not a CIDv0 or a multibase CIDv1 string"):
            reg.propose(root, cid, ZERO)


def test_a_cid_that_is_not_utf8_is_refused_on_chain(world: World) -> None:
    """Bytes that are not UTF-8 made every client's listing raise, for good (the event stays)."""
    reg = world.registry(0)
    calldata = PROPOSE_SELECTOR + abi_encode(
        ["bytes32", "bytes", "bytes32"], [root_of("raw"), b"b\xff\xfe", ZERO]
    )
    with refused("InvalidCID", "character 1 breaks the rule"):
        reg._sender.send(reg.address, calldata)
    assert reg.proposal(root_of("raw")) is None


def _log_emitter(topics: list[bytes], data: bytes) -> bytes:
    """Runtime bytecode that emits one LOG3 of `data` with `topics` on any call, then stops."""
    size = len(data).to_bytes(2, "big")
    body = b"".join(b"\x7f" + t for t in reversed(topics))  # PUSH32 topic2, topic1, topic0
    prefix_len = 3 + 3 + 2 + 1 + len(body) + 3 + 2 + 1 + 1
    code = (
        b"\x61" + size + b"\x61" + prefix_len.to_bytes(2, "big") + b"\x60\x00" + b"\x39"  # CODECOPY to 0
        + body + b"\x61" + size + b"\x60\x00" + b"\xa3" + b"\x00"  # LOG3(0, size, t0, t1, t2); STOP
    )  # fmt: skip
    assert len(code) == prefix_len
    return code + data


def test_a_crafted_event_with_a_non_utf8_cid_does_not_break_the_client(world: World) -> None:
    """An old deployment's history may hold such an event: listings show it as invalid instead of raising,
    and nothing would hand its CID to IPFS."""
    from zoo.registry.chain import cid_problem, shown_cid

    topic0 = Web3.keccak(text="ProposalCreated(bytes32,address,bytes32,string,uint48,uint48,uint48)")
    proposer = bytes(12) + bytes.fromhex(world.address(1)[2:])
    data = abi_encode(["bytes32", "bytes", "uint48", "uint48", "uint48"], [ZERO, b"Qm\xff\xfe", 1, 2, 3])
    emitter = Web3.to_checksum_address("0x" + "ee" * 20)
    world.rpc(
        "anvil_setCode", emitter, "0x" + _log_emitter([topic0, root_of("crafted"), proposer], data).hex()
    )
    tx = world.w3.eth.send_transaction({"from": world.address(0), "to": emitter, "gas": 200_000})
    assert world.w3.eth.wait_for_transaction_receipt(tx)["status"] == 1
    events = RegistryClient(world.w3, emitter).proposal_created_events(world.deploy_block)
    assert len(events) == 1
    event = events[0]
    assert event.root == root_of("crafted") and event.proposer == world.address(1)
    assert (event.snapshot, event.vote_start, event.vote_end) == (1, 2, 3)
    assert cid_problem(event.cid) is not None
    assert shown_cid(event.cid) == "<invalid CID Qm\\udcff\\udcfe>"
