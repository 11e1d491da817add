// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IVotes} from "@openzeppelin/contracts/governance/utils/IVotes.sol";
import {IERC6372} from "@openzeppelin/contracts/interfaces/IERC6372.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Time} from "@openzeppelin/contracts/utils/types/Time.sol";
import {CIDs} from "./CIDs.sol";
import {DaoCalls} from "./DaoCalls.sol";
import {IVoterRegistry} from "./IVoterRegistry.sol";
import {RFC9162} from "./RFC9162.sol";

/**
 * @title ExperienceRegistry
 * @notice The on-chain head of the Zoo experience library. A library version is the RFC 9162 Merkle root of
 * its canonical experience records, the number of records (the tree size) and the IPFS CID of its content.
 * Holders of the governance token (an ERC20Votes token on a timestamp clock, such as {KeeperToken}) propose a
 * new version on top of the current version number, vote on it with quadratic weight, and anyone executes it
 * once the vote has passed, which appends a version to the history.
 *
 * Rules:
 * - A proposal is identified by {hashProposal}: the hash of its root, tree size, CID, parent version,
 *   proposer and a proposer-chosen salt (as OpenZeppelin's Governor hashes a description). Nobody can take
 *   another account's proposal id, so front-running a proposal with the same root and a wrong CID only
 *   creates a second, competing proposal; the honest one still goes through. Roots may recur: a root whose
 *   vote failed can be proposed again (with a new salt), and an earlier version's root can be proposed again
 *   to roll back to it.
 * - A proposal's snapshot is the second before the block that created it; proposer threshold, vote weights
 *   and voter-registry membership are read at the snapshot, so tokens acquired (bought, borrowed,
 *   flash-loaned, received from someone who already voted) and registrations changed after the proposal was
 *   made never count.
 * - Voting opens the second after the proposal and lasts `votingPeriod` seconds: open while
 *   `voteStart <= block.timestamp < voteEnd`.
 * - A vote weighs `floor(sqrt(votes at snapshot))`; each address votes once per proposal.
 * - Quorum counts support only: a proposal needs at least `quorum` weight *for* it (as OpenZeppelin's
 *   GovernorCountingSimple, against votes never count toward quorum, so an opponent's vote can never lift a
 *   proposal over it) and a strict two-thirds supermajority of the weight cast (`forWeight > 2 * againstWeight`).
 * - Execution is possible from `voteEnd + executionDelay` on, once, until `gracePeriod` seconds later; a
 *   passed proposal not executed by then is Expired for good.
 * - A proposal builds on a parent version *number*, which must still be current when it is voted on and
 *   executed: of several competing proposals on the same parent, the first executed wins and the others
 *   become Stale. Version numbers only grow, so a stale proposal never revives, even when a later version
 *   happens to have its parent's root.
 *
 * - A call proposal ({proposeCall}) asks the same vote to make one call, `target.call(data)`, as this
 *   contract: how the DAO acts on the contracts it governs (a {UsageLedger} whose governor is this registry
 *   registers and deregisters nodes and resolves challenges only so). It has no parent version, so library
 *   versions executed meanwhile never make it stale; the rest (threshold, snapshot, quorum, supermajority,
 *   delay, grace period, one execution) is a library proposal's.
 * - A call proposal makes only the calls the DAO has: a {UsageLedger} governor's `registerNode`,
 *   `deregisterNode` and `resolveChallenge` ({ILedgerGovernance}) on another contract, `cancel` and
 *   `setBaseModel` (the approved base models, by their weights' SHA-256) on this one,
 *   and its calldata must be the canonical encoding of its call ({DaoCalls}): the target's decoder ignores
 *   appended bytes, so without this one call had many calldatas, and the binding below would not see a
 *   padded `registerNode(N)` as the call it is.
 * - A call proposal is bound to the state it was voted on: it records how often the same call (same target,
 *   same calldata: {hashCall}) had been executed when it was made ({callExecutions}), and it is Stale once
 *   that count has moved. So of several identical call proposals the first executed wins and the others are
 *   Stale for good (counts only grow), while a fresh proposal of the call, made later, is bound to the new
 *   count and can pass. This closes the leftover-proposal attack: without it, two passed `registerNode(N)`
 *   proposals leave one executable after the first ran, and once the DAO deregisters N anyone could execute
 *   the leftover and register N again without a vote. Different calls never interfere.
 * - A call that reverts makes `execute` revert with the target's own error; nothing is recorded, and the
 *   proposal stays executable until its grace period ends. A failed execution is deliberately not made
 *   final: anyone may execute, so an executor could give the inner call too little gas to make it fail and
 *   thereby kill a proposal the DAO passed.
 * - A proposal can be canceled ({cancel}): by its proposer while it is Pending or Active, or by the DAO
 *   itself (a passed call proposal whose target is this registry and whose calldata is `cancel(id)`) at
 *   any time before it is executed, which is how
 *   the DAO withdraws a passed proposal it no longer wants. A canceled proposal can never be voted on or
 *   executed.
 *
 * SECURITY: square-root voting is NOT Sybil-resistant on its own. Whoever splits a balance over k addresses
 * (each delegating to itself) multiplies their weight by sqrt(k): one holder of 100 tokens has weight 10, the
 * same 100 tokens over 100 addresses have weight 100. The quadratic damping only holds when every voter is a
 * distinct person, which the chain cannot tell. The mitigation is the optional voter registry
 * ({IVoterRegistry}, fixed at deployment): when set, only addresses it reports as registered at the
 * proposal's snapshot may vote, so the registry (an allowlist of verified people, a proof-of-personhood
 * attestation) carries the Sybil resistance. Without a registry, treat the weights as no better than "sqrt
 * per address".
 */
contract ExperienceRegistry {
    /// @notice Lifecycle of a proposal, as reported by {state}.
    enum ProposalState {
        // No proposal with this id exists.
        Unknown,
        // Created in the current second; voting opens the next second.
        Pending,
        // Voting is open.
        Active,
        // Voting has ended without quorum or without the two-thirds supermajority.
        Defeated,
        // The vote passed; the execution delay is running.
        Queued,
        // The vote passed and the proposal can be executed now.
        Succeeded,
        // The proposal was executed and its root became a library version.
        Executed,
        // A library proposal whose parent is no longer the current version (another proposal was executed),
        // or a call proposal whose call was executed since it was proposed ({callExecutions}): it can never
        // pass.
        Stale,
        // The vote passed but nobody executed it within the grace period: it can never be executed.
        Expired,
        // Canceled by its proposer before the vote ended, or by the DAO before execution ({cancel}): it can
        // never be voted on or executed.
        Canceled
    }

    /// @notice A proposal, keyed by its id ({hashProposal}).
    struct Proposal {
        // The account that created it.
        address proposer;
        // Timestamp at which token votes and registry membership are read (the second before creation).
        uint48 snapshot;
        // First second in which votes are accepted.
        uint48 voteStart;
        // First second in which votes are no longer accepted.
        uint48 voteEnd;
        // Whether it was executed.
        bool executed;
        // Whether it was canceled ({cancel}).
        bool canceled;
        // The library version number it builds on; it must still be current when executed.
        uint64 parentVersion;
        // Number of experience records (Merkle leaves) of the proposed library; 0 for a call proposal (a
        // library proposal cannot have 0).
        uint64 treeSize;
        // Merkle root of the proposed library.
        bytes32 root;
        // Sum of the quadratic weights voting for.
        uint128 forWeight;
        // Sum of the quadratic weights voting against.
        uint128 againstWeight;
        // IPFS CID of the proposed library's content.
        string cid;
    }

    /// @notice An entry of the library history.
    struct LibraryVersion {
        // Merkle root of the library (zero for version 0, the empty genesis).
        bytes32 root;
        // Block timestamp at which the version became current.
        uint48 timestamp;
        // Number of experience records (Merkle leaves); zero for version 0.
        uint64 treeSize;
        // IPFS CID of the library's content (empty for version 0).
        string cid;
    }

    /// @notice Longest CID accepted, in bytes; bounds what execution copies to storage (CIDv1 base32 is ~60).
    uint256 public constant MAX_CID_LENGTH = 256;

    /// @notice The ERC-5805 voting token (timestamp clock) whose past votes weigh proposals and votes.
    IVotes public immutable token;
    /// @notice Length of the voting window, in seconds.
    uint32 public immutable votingPeriod;
    /// @notice Seconds between the end of voting and the earliest execution.
    uint32 public immutable executionDelay;
    /// @notice Seconds, from the earliest execution on, during which a passed proposal can be executed.
    uint32 public immutable gracePeriod;
    /// @notice Token votes (not quadratic weight) the proposer needs at the snapshot.
    uint256 public immutable proposalThreshold;
    /// @notice Minimum quadratic weight voting *for* a proposal for it to pass (against votes never count).
    uint256 public immutable quorum;
    /// @notice Registry of addresses allowed to vote; the zero address means everyone may vote.
    IVoterRegistry public immutable voterRegistry;

    /// @notice Merkle root of the current library version (zero before the first execution).
    bytes32 public currentRoot;
    /// @notice Number of the current library version (zero before the first execution); only ever increases.
    uint256 public currentVersion;

    mapping(uint256 proposalId => Proposal) private _proposals;
    mapping(uint256 proposalId => mapping(address voter => bool)) private _hasVoted;
    mapping(uint256 version => LibraryVersion) private _versions;
    mapping(uint256 proposalId => ProposedCall) private _calls;

    /// @notice How many times each call ({hashCall}) was executed through a call proposal; only ever increases.
    mapping(bytes32 callHash => uint256) public callExecutions;

    /// @notice Whether the DAO approved the model weights with this SHA-256 as a base model: one a library
    /// (format 4) may name, so that nodes serving those weights put its experiences into their prompts.
    mapping(bytes32 modelHash => bool) public baseModelApproved;
    bytes32[] private _baseModels;
    mapping(bytes32 modelHash => uint256) private _baseModelSlot; // index in _baseModels, plus one

    /// @notice What a call proposal calls ({proposeCall}).
    struct ProposedCall {
        // The contract called.
        address target;
        // {callExecutions} of the call when the proposal was made; the proposal is Stale once it differs.
        // Shares the target's slot: a count grows by one per executed proposal, so it never nears 2**96.
        uint96 executionsAtProposal;
        // {hashCall} of target and data, kept so that votes need not read the calldata.
        bytes32 callHash;
        // The calldata (selector and arguments).
        bytes data;
    }

    /**
     * @notice A proposal was created.
     * @param proposalId The proposal's id ({hashProposal}).
     * @param root The proposed library root.
     * @param proposer The account that created it.
     * @param treeSize Number of experience records of the proposed library.
     * @param cid IPFS CID of the proposed library's content.
     * @param parentVersion The library version number it builds on.
     * @param salt The proposer's salt.
     * @param snapshot Timestamp at which votes are read.
     * @param voteStart First second of voting.
     * @param voteEnd First second after voting.
     */
    event ProposalCreated(
        uint256 indexed proposalId,
        bytes32 indexed root,
        address indexed proposer,
        uint256 treeSize,
        string cid,
        uint256 parentVersion,
        bytes32 salt,
        uint48 snapshot,
        uint48 voteStart,
        uint48 voteEnd
    );

    /**
     * @notice A call proposal was created; votes, execution and states are a library proposal's.
     * @param proposalId The proposal's id ({hashCallProposal}).
     * @param target The contract it calls.
     * @param proposer The account that created it.
     * @param data The calldata.
     * @param salt The proposer's salt.
     * @param snapshot Timestamp at which votes are read.
     * @param voteStart First second of voting.
     * @param voteEnd First second after voting.
     */
    event CallProposed(
        uint256 indexed proposalId,
        address indexed target,
        address indexed proposer,
        bytes data,
        bytes32 salt,
        uint48 snapshot,
        uint48 voteStart,
        uint48 voteEnd
    );

    /**
     * @notice A call proposal was executed: its call returned.
     * @param proposalId The executed proposal.
     * @param target The contract called.
     */
    event CallExecuted(uint256 indexed proposalId, address indexed target);

    /**
     * @notice A proposal was canceled: it can never be voted on or executed.
     * @param proposalId The canceled proposal.
     * @param by Its proposer, or this registry (the DAO, through a passed call proposal).
     */
    event ProposalCanceled(uint256 indexed proposalId, address indexed by);

    /**
     * @notice A vote was cast.
     * @param proposalId The proposal voted on.
     * @param voter The voting account.
     * @param support True for, false against.
     * @param weight The vote's quadratic weight.
     */
    event VoteCast(uint256 indexed proposalId, address indexed voter, bool support, uint256 weight);

    /**
     * @notice A proposal was executed.
     * @param proposalId The executed proposal.
     * @param version The library version it became.
     */
    event ProposalExecuted(uint256 indexed proposalId, uint256 indexed version);

    /**
     * @notice The current library changed.
     * @param version The new version number.
     * @param root The new library root.
     * @param treeSize Number of experience records of the new library.
     * @param cid IPFS CID of the new library's content.
     */
    event LibraryUpdated(uint256 indexed version, bytes32 indexed root, uint256 treeSize, string cid);

    /**
     * @notice The DAO approved (or withdrew) a base model.
     * @param modelHash The SHA-256 of the model's weights (a GGUF file, or a weights directory's manifest).
     * @param approved Whether it is approved now.
     */
    event BaseModelSet(bytes32 indexed modelHash, bool approved);

    /// @notice Only the DAO (this registry, executing a passed call proposal) may call this.
    error OnlyDao(address caller);

    /// @notice The base model is already in the state asked for; nothing would change.
    error BaseModelUnchanged(bytes32 modelHash, bool approved);

    /// @notice A zero hash names no weights.
    error ZeroModelHash();

    /**
     * @notice A call proposal's target has no code (nothing could be called), or is this registry with a
     * calldata other than {cancel}'s.
     * @param target The address given.
     */
    error InvalidCallTarget(address target);

    /**
     * @notice The call proposal's call was executed (through another proposal) since it was proposed, so it
     * can never be voted on or executed; propose the call again if it is still wanted.
     * @param proposalId The proposal.
     * @param callHash Its call ({hashCall}).
     * @param executionsAtProposal {callExecutions} of the call when the proposal was made.
     * @param executionsNow {callExecutions} of the call now.
     */
    error CallProposalStale(
        uint256 proposalId, bytes32 callHash, uint256 executionsAtProposal, uint256 executionsNow
    );

    /**
     * @notice The proposal was canceled ({cancel}).
     * @param proposalId The proposal.
     */
    error ProposalIsCanceled(uint256 proposalId);

    /**
     * @notice The proposal cannot be canceled in its state: the proposer may cancel only while it is Pending
     * or Active, the DAO only before it is executed (and nothing is canceled twice).
     * @param proposalId The proposal.
     * @param state Its state.
     */
    error ProposalNotCancelable(uint256 proposalId, ProposalState state);

    /**
     * @notice Only the proposal's proposer, or the DAO (this registry, through a passed call proposal), may
     * cancel it.
     * @param proposalId The proposal.
     * @param caller The account that tried.
     */
    error NotAllowedToCancel(uint256 proposalId, address caller);

    /**
     * @notice A call proposal's calldata is shorter than a function selector.
     */
    error EmptyCall();

    /**
     * @notice The token address has no code.
     * @param token The address given.
     */
    error InvalidToken(address token);

    /**
     * @notice The token's ERC-6372 clock is not the block timestamp.
     * @param token The token.
     * @param clock The token's clock reading.
     */
    error InvalidTokenClock(address token, uint48 clock);

    /// @notice The voting period is zero.
    error InvalidVotingPeriod();

    /// @notice The grace period is zero (every passed proposal would expire at once).
    error InvalidGracePeriod();

    /// @notice The quorum is zero (a single vote of any weight could pass a proposal).
    error InvalidQuorum();

    /**
     * @notice The voter registry address has no code, or its ERC-6372 clock is not the block timestamp.
     * @param voterRegistry The address given.
     */
    error InvalidVoterRegistry(address voterRegistry);

    /// @notice The proposed root is zero (reserved for the empty genesis).
    error ZeroRoot();

    /// @notice The proposed tree size is zero (a library version holds at least one record).
    error EmptyTree();

    /**
     * @notice This proposer already made this exact proposal (same root, size, CID, parent and salt); a new
     * salt makes a new proposal.
     * @param proposalId The proposal.
     */
    error ProposalAlreadyExists(uint256 proposalId);

    /**
     * @notice The proposal's parent version is not the current version.
     * @param parentVersion The parent given.
     * @param currentVersion The current version.
     */
    error WrongParent(uint256 parentVersion, uint256 currentVersion);

    /**
     * @notice The proposer's votes at the snapshot are below {proposalThreshold}.
     * @param proposer The proposer.
     * @param votes Its votes at the snapshot.
     * @param threshold The votes required.
     */
    error InsufficientProposerVotes(address proposer, uint256 votes, uint256 threshold);

    /**
     * @notice No proposal with this id exists.
     * @param proposalId The id.
     */
    error ProposalNotFound(uint256 proposalId);

    /**
     * @notice Voting on the proposal has not opened yet.
     * @param proposalId The proposal.
     * @param voteStart First second of voting.
     */
    error VotingNotStarted(uint256 proposalId, uint48 voteStart);

    /**
     * @notice Voting on the proposal has closed.
     * @param proposalId The proposal.
     * @param voteEnd First second after voting.
     */
    error VotingClosed(uint256 proposalId, uint48 voteEnd);

    /**
     * @notice The voter already voted on the proposal.
     * @param proposalId The proposal.
     * @param voter The voter.
     */
    error AlreadyVoted(uint256 proposalId, address voter);

    /**
     * @notice The voter had no votes at the proposal's snapshot.
     * @param proposalId The proposal.
     * @param voter The voter.
     */
    error NoVotingPower(uint256 proposalId, address voter);

    /**
     * @notice The voter was not in the voter registry at the proposal's snapshot.
     * @param voter The voter.
     * @param snapshot The proposal's snapshot.
     */
    error VoterNotRegistered(address voter, uint48 snapshot);

    /**
     * @notice The proposal's parent version is no longer the current version, so it can never be executed.
     * @param proposalId The proposal.
     * @param parentVersion Its parent.
     * @param currentVersion The current version.
     */
    error ProposalStale(uint256 proposalId, uint256 parentVersion, uint256 currentVersion);

    /**
     * @notice The proposal cannot be executed before `executableAt`.
     * @param proposalId The proposal.
     * @param executableAt First second of execution (end of voting plus the execution delay).
     */
    error ExecutionTooEarly(uint256 proposalId, uint256 executableAt);

    /**
     * @notice The proposal passed but its execution window closed at `expiredAt`.
     * @param proposalId The proposal.
     * @param expiredAt First second in which it could no longer be executed.
     */
    error ProposalExpired(uint256 proposalId, uint256 expiredAt);

    /**
     * @notice The proposal was already executed.
     * @param proposalId The proposal.
     */
    error ProposalAlreadyExecuted(uint256 proposalId);

    /**
     * @notice Fewer than {quorum} weight units were cast for the proposal (against votes do not count).
     * @param proposalId The proposal.
     * @param support Weight cast for.
     * @param quorum The weight required.
     */
    error QuorumNotReached(uint256 proposalId, uint256 support, uint256 quorum);

    /**
     * @notice The proposal lacks a strict two-thirds supermajority (`forWeight > 2 * againstWeight`).
     * @param proposalId The proposal.
     * @param forWeight Weight for.
     * @param againstWeight Weight against.
     */
    error ProposalDefeated(uint256 proposalId, uint256 forWeight, uint256 againstWeight);

    /**
     * @notice The library version does not exist yet.
     * @param version The version asked for.
     * @param currentVersion The current version.
     */
    error UnknownVersion(uint256 version, uint256 currentVersion);

    /**
     * @notice Creates the registry with an empty library (version 0, root zero).
     * @param token_ The ERC-5805 voting token; its ERC-6372 clock must be the block timestamp.
     * @param votingPeriod_ Length of the voting window, in seconds (non-zero).
     * @param executionDelay_ Seconds between the end of voting and the earliest execution.
     * @param gracePeriod_ Seconds during which a passed proposal can be executed (non-zero).
     * @param proposalThreshold_ Token votes a proposer needs at the snapshot.
     * @param quorum_ Minimum `for` quadratic weight for a proposal to pass (non-zero; against votes never count).
     * @param voterRegistry_ Registry of allowed voters (timestamp clock), or the zero address to let every token
     * holder vote.
     */
    constructor(
        IVotes token_,
        uint32 votingPeriod_,
        uint32 executionDelay_,
        uint32 gracePeriod_,
        uint256 proposalThreshold_,
        uint256 quorum_,
        IVoterRegistry voterRegistry_
    ) {
        if (address(token_).code.length == 0) {
            revert InvalidToken(address(token_));
        }
        // Snapshots are timestamps; a block-number clock would turn every snapshot into a future lookup.
        uint48 tokenClock = IERC6372(address(token_)).clock();
        if (tokenClock != Time.timestamp()) {
            revert InvalidTokenClock(address(token_), tokenClock);
        }
        if (votingPeriod_ == 0) {
            revert InvalidVotingPeriod();
        }
        if (gracePeriod_ == 0) {
            revert InvalidGracePeriod();
        }
        if (quorum_ == 0) {
            revert InvalidQuorum();
        }
        if (address(voterRegistry_) != address(0) && !_isVoterRegistry(voterRegistry_)) {
            revert InvalidVoterRegistry(address(voterRegistry_));
        }
        token = token_;
        votingPeriod = votingPeriod_;
        executionDelay = executionDelay_;
        gracePeriod = gracePeriod_;
        proposalThreshold = proposalThreshold_;
        quorum = quorum_;
        voterRegistry = voterRegistry_;
        _versions[0].timestamp = Time.timestamp();
    }

    /**
     * @notice The id of the proposal `proposer` makes with these arguments and `salt`.
     * @param root Merkle root of the proposed library.
     * @param treeSize Number of experience records.
     * @param cid IPFS CID of its content.
     * @param parentVersion The version number it builds on.
     * @param proposer The proposing account.
     * @param salt Any value the proposer picks; a new salt makes a new proposal of the same content.
     * @return The proposal id.
     */
    function hashProposal(
        bytes32 root,
        uint256 treeSize,
        string calldata cid,
        uint256 parentVersion,
        address proposer,
        bytes32 salt
    ) public pure returns (uint256) {
        return uint256(keccak256(abi.encode(root, treeSize, keccak256(bytes(cid)), parentVersion, proposer, salt)));
    }

    /**
     * @notice Proposes the library with Merkle root `root` over `treeSize` records (content at `cid`) as the
     * version after `parentVersion`.
     * @param root Merkle root of the proposed library (non-zero; it may equal an earlier version's root).
     * @param treeSize Number of experience records (Merkle leaves) of the proposed library (non-zero).
     * @param cid IPFS CID of the proposed library's content (1 to {MAX_CID_LENGTH} bytes, see {InvalidCID}).
     * @param parentVersion The version number it builds on; must equal {currentVersion}.
     * @param salt Any value; this proposer's proposals of the same content need distinct salts.
     * @return proposalId The new proposal's id ({hashProposal} with `msg.sender` as proposer).
     */
    function propose(bytes32 root, uint256 treeSize, string calldata cid, uint256 parentVersion, bytes32 salt)
        external
        returns (uint256 proposalId)
    {
        if (root == bytes32(0)) {
            revert ZeroRoot();
        }
        if (treeSize == 0) {
            revert EmptyTree();
        }
        CIDs.check(bytes(cid), MAX_CID_LENGTH);
        if (parentVersion != currentVersion) {
            revert WrongParent(parentVersion, currentVersion);
        }
        proposalId = hashProposal(root, treeSize, cid, parentVersion, msg.sender, salt);
        Proposal storage p = _open(proposalId);
        // Both fit: the version grows by one per execution, and a tree of 2**64 leaves cannot be built.
        p.parentVersion = uint64(parentVersion);
        p.treeSize = SafeCast.toUint64(treeSize);
        p.root = root;
        p.cid = cid;
        _emitCreated(proposalId, p, salt);
    }

    /**
     * @notice The id of the call proposal by `proposer` to call `target` with `data` and salt `salt`.
     * @param target The contract to call.
     * @param data The calldata.
     * @param proposer The proposing account.
     * @param salt Any value the proposer picks.
     * @return The proposal id (domain-separated from library proposal ids).
     */
    function hashCallProposal(address target, bytes calldata data, address proposer, bytes32 salt)
        public
        pure
        returns (uint256)
    {
        return uint256(keccak256(abi.encode("zoo.call", target, keccak256(data), proposer, salt)));
    }

    /**
     * @notice The key of the call `target.call(data)` in {callExecutions}: identical calls share it (a
     * proposal's calldata is its call's one encoding, {DaoCalls}).
     * @param target The contract called.
     * @param data The calldata.
     * @return `keccak256(abi.encode(target, keccak256(data)))`.
     */
    function hashCall(address target, bytes calldata data) public pure returns (bytes32) {
        return keccak256(abi.encode(target, keccak256(data)));
    }

    /**
     * @notice Proposes that this registry call `target` with `data` once the vote passes. The proposal is
     * bound to the call's current {callExecutions}: it becomes Stale once the same call is executed by
     * another proposal. Only the DAO's calls, each in its one encoding, are accepted ({DaoCalls}), so
     * identical calls have identical calldata.
     * @param target A contract; this registry only with {cancel}'s or {setBaseModel}'s calldata.
     * @param data The calldata: exactly `abi.encodeWithSelector` of an {ILedgerGovernance} function (or, on this
     * registry, `cancel` or `setBaseModel`) and its arguments; {CallNotAllowed} or {NonCanonicalCall} otherwise.
     * @param salt Any value; this proposer's proposals of the same call need distinct salts.
     * @return proposalId The new proposal's id ({hashCallProposal} with `msg.sender` as proposer).
     */
    function proposeCall(address target, bytes calldata data, bytes32 salt) external returns (uint256 proposalId) {
        if (target.code.length == 0) revert InvalidCallTarget(target);
        if (data.length < 4) revert EmptyCall();
        // On itself the DAO may only cancel proposals and keep its base models: anything else would let a vote
        // bypass the rules here.
        if (
            target == address(this) && bytes4(data[:4]) != this.cancel.selector
                && bytes4(data[:4]) != this.setBaseModel.selector
        ) revert InvalidCallTarget(target);
        DaoCalls.requireCanonical(target, data, target == address(this));
        proposalId = hashCallProposal(target, data, msg.sender, salt);
        Proposal storage p = _open(proposalId);
        ProposedCall storage c = _calls[proposalId];
        bytes32 callHash = hashCall(target, data);
        c.target = target;
        c.executionsAtProposal = SafeCast.toUint96(callExecutions[callHash]);
        c.callHash = callHash;
        c.data = data;
        emit CallProposed(proposalId, target, msg.sender, data, salt, p.snapshot, p.voteStart, p.voteEnd);
    }

    /**
     * @notice The call a call proposal makes; a zero target for any other id.
     * @param proposalId The proposal.
     * @return target The contract called.
     * @return data The calldata.
     */
    function proposedCall(uint256 proposalId) external view returns (address target, bytes memory data) {
        ProposedCall storage c = _calls[proposalId];
        return (c.target, c.data);
    }

    /**
     * @notice What a call proposal is bound to: it is Stale when `executionsAtProposal != executionsNow`.
     * @param proposalId The proposal; all zeros for an id that is not a call proposal.
     * @return callHash Its call ({hashCall}).
     * @return executionsAtProposal {callExecutions} of the call when the proposal was made.
     * @return executionsNow {callExecutions} of the call now.
     */
    function callBinding(uint256 proposalId)
        external
        view
        returns (bytes32 callHash, uint256 executionsAtProposal, uint256 executionsNow)
    {
        ProposedCall storage c = _calls[proposalId];
        return (c.callHash, c.executionsAtProposal, callExecutions[c.callHash]);
    }

    /**
     * @notice Cancels proposal `proposalId`, so it can never be voted on or executed. Its proposer may cancel
     * it while it is Pending or Active; the DAO (this registry itself, executing a passed call proposal of
     * `cancel(proposalId)`) may cancel it in any state before it is executed, a passed one included.
     * @param proposalId The proposal.
     */
    function cancel(uint256 proposalId) external {
        Proposal storage p = _proposals[proposalId];
        if (p.voteStart == 0) revert ProposalNotFound(proposalId);
        ProposalState current = state(proposalId);
        if (msg.sender == address(this)) {
            if (current == ProposalState.Executed || current == ProposalState.Canceled) {
                revert ProposalNotCancelable(proposalId, current);
            }
        } else if (msg.sender == p.proposer) {
            if (current != ProposalState.Pending && current != ProposalState.Active) {
                revert ProposalNotCancelable(proposalId, current);
            }
        } else {
            revert NotAllowedToCancel(proposalId, msg.sender);
        }
        p.canceled = true;
        emit ProposalCanceled(proposalId, msg.sender);
    }

    /**
     * @notice Approves the model weights hashed `modelHash` as a base model (or withdraws them): the DAO's
     * list, kept only by passed call proposals ({proposeCall} on this registry).
     * @param modelHash The SHA-256 of the weights; not zero.
     * @param approved True to approve, false to withdraw.
     */
    function setBaseModel(bytes32 modelHash, bool approved) external {
        if (msg.sender != address(this)) revert OnlyDao(msg.sender);
        if (modelHash == bytes32(0)) revert ZeroModelHash();
        if (baseModelApproved[modelHash] == approved) revert BaseModelUnchanged(modelHash, approved);
        baseModelApproved[modelHash] = approved;
        if (approved) {
            _baseModels.push(modelHash);
            _baseModelSlot[modelHash] = _baseModels.length;
        } else {
            uint256 slot = _baseModelSlot[modelHash];
            bytes32 last = _baseModels[_baseModels.length - 1];
            _baseModels[slot - 1] = last;
            _baseModelSlot[last] = slot;
            _baseModels.pop();
            delete _baseModelSlot[modelHash];
        }
        emit BaseModelSet(modelHash, approved);
    }

    /// @notice The approved base models' hashes, in no particular order.
    function baseModels() external view returns (bytes32[] memory) {
        return _baseModels;
    }

    /**
     * @notice Votes on proposal `proposalId` with weight `floor(sqrt(votes at its snapshot))`.
     * @dev The token and registry are read with static calls, so neither can re-enter.
     * @param proposalId The proposal.
     * @param support True to vote for, false to vote against.
     * @return weight The weight counted.
     */
    function vote(uint256 proposalId, bool support) external returns (uint256 weight) {
        Proposal storage p = _proposals[proposalId];
        if (p.voteStart == 0) {
            revert ProposalNotFound(proposalId);
        }
        if (p.canceled) revert ProposalIsCanceled(proposalId);
        uint48 nowTs = Time.timestamp();
        if (nowTs < p.voteStart) {
            revert VotingNotStarted(proposalId, p.voteStart);
        }
        if (nowTs >= p.voteEnd) {
            revert VotingClosed(proposalId, p.voteEnd);
        }
        _requireFresh(proposalId, p);
        if (_hasVoted[proposalId][msg.sender]) {
            revert AlreadyVoted(proposalId, msg.sender);
        }
        if (address(voterRegistry) != address(0) && !voterRegistry.isRegisteredAt(msg.sender, p.snapshot)) {
            revert VoterNotRegistered(msg.sender, p.snapshot);
        }
        weight = Math.sqrt(token.getPastVotes(msg.sender, p.snapshot));
        if (weight == 0) {
            revert NoVotingPower(proposalId, msg.sender);
        }
        _hasVoted[proposalId][msg.sender] = true;
        // sqrt of a uint256 is below 2**128, and ERC20Votes caps votes at 2**208, so weights are below 2**104:
        // the checked uint128 sums cannot overflow in practice.
        if (support) {
            p.forWeight += uint128(weight);
        } else {
            p.againstWeight += uint128(weight);
        }
        emit VoteCast(proposalId, msg.sender, support, weight);
    }

    /**
     * @notice Makes a passed proposal the current library version, or makes a passed call proposal's call.
     * Anyone may call it.
     * @param proposalId The proposal.
     * @return version The new version number (for a call proposal, the current one, unchanged).
     */
    function execute(uint256 proposalId) external returns (uint256 version) {
        Proposal storage p = _proposals[proposalId];
        if (p.voteStart == 0) {
            revert ProposalNotFound(proposalId);
        }
        if (p.executed) {
            revert ProposalAlreadyExecuted(proposalId);
        }
        if (p.canceled) revert ProposalIsCanceled(proposalId);
        _requireFresh(proposalId, p);
        uint256 executableAt = uint256(p.voteEnd) + executionDelay;
        if (block.timestamp < executableAt) {
            revert ExecutionTooEarly(proposalId, executableAt);
        }
        if (p.forWeight < quorum) {
            revert QuorumNotReached(proposalId, p.forWeight, quorum);
        }
        if (!_supermajority(p)) {
            revert ProposalDefeated(proposalId, p.forWeight, p.againstWeight);
        }
        if (block.timestamp >= executableAt + gracePeriod) {
            revert ProposalExpired(proposalId, executableAt + gracePeriod);
        }
        p.executed = true;
        if (p.treeSize == 0) {
            // A call proposal. Marked executed and counted first, so the call cannot re-enter to run it, or an
            // identical proposal, twice; a revert undoes both with everything else.
            ProposedCall storage c = _calls[proposalId];
            ++callExecutions[c.callHash];
            Address.functionCall(c.target, c.data);
            emit CallExecuted(proposalId, c.target);
            return currentVersion;
        }
        bytes32 root = p.root;
        currentRoot = root;
        version = ++currentVersion;
        LibraryVersion storage v = _versions[version];
        v.root = root;
        v.timestamp = Time.timestamp();
        v.treeSize = p.treeSize;
        v.cid = p.cid;
        emit ProposalExecuted(proposalId, version);
        emit LibraryUpdated(version, root, p.treeSize, p.cid);
    }

    /**
     * @notice Proposal `proposalId`; all fields are zero when there is none.
     * @param proposalId The proposal.
     * @return The proposal.
     */
    function proposal(uint256 proposalId) external view returns (Proposal memory) {
        return _proposals[proposalId];
    }

    /**
     * @notice The lifecycle state of proposal `proposalId`.
     * @param proposalId The proposal.
     * @return The state; {execute} succeeds exactly in state Succeeded (when a call proposal's call returns).
     */
    function state(uint256 proposalId) public view returns (ProposalState) {
        Proposal storage p = _proposals[proposalId];
        if (p.voteStart == 0) {
            return ProposalState.Unknown;
        }
        if (p.executed) {
            return ProposalState.Executed;
        }
        if (p.canceled) {
            return ProposalState.Canceled;
        }
        if (_stale(proposalId, p)) {
            return ProposalState.Stale;
        }
        if (block.timestamp < p.voteStart) {
            return ProposalState.Pending;
        }
        if (block.timestamp < p.voteEnd) {
            return ProposalState.Active;
        }
        if (p.forWeight < quorum || !_supermajority(p)) {
            return ProposalState.Defeated;
        }
        uint256 executableAt = uint256(p.voteEnd) + executionDelay;
        if (block.timestamp < executableAt) {
            return ProposalState.Queued;
        }
        if (block.timestamp >= executableAt + gracePeriod) {
            return ProposalState.Expired;
        }
        return ProposalState.Succeeded;
    }

    /**
     * @notice Whether `voter` has voted on proposal `proposalId`.
     * @param proposalId The proposal.
     * @param voter The account.
     * @return True when it has voted.
     */
    function hasVoted(uint256 proposalId, address voter) external view returns (bool) {
        return _hasVoted[proposalId][voter];
    }

    /**
     * @notice The weight `voter` would vote with on proposal `proposalId` (ignoring the voter registry and
     * whether it already voted).
     * @param proposalId The proposal (must exist).
     * @param voter The account.
     * @return `floor(sqrt(votes of voter at the proposal's snapshot))`.
     */
    function votingWeight(uint256 proposalId, address voter) external view returns (uint256) {
        Proposal storage p = _proposals[proposalId];
        if (p.voteStart == 0) {
            revert ProposalNotFound(proposalId);
        }
        return Math.sqrt(token.getPastVotes(voter, p.snapshot));
    }

    /**
     * @notice The CID of the current library version (empty before the first execution).
     * @return The CID.
     */
    function currentCID() external view returns (string memory) {
        return _versions[currentVersion].cid;
    }

    /**
     * @notice The current library version in one read.
     * @return version The version number.
     * @return root Its Merkle root.
     * @return treeSize Its number of experience records.
     * @return cid Its IPFS CID.
     * @return timestamp When it became current.
     */
    function currentLibrary()
        external
        view
        returns (uint256 version, bytes32 root, uint256 treeSize, string memory cid, uint48 timestamp)
    {
        version = currentVersion;
        LibraryVersion storage v = _versions[version];
        return (version, v.root, v.treeSize, v.cid, v.timestamp);
    }

    /**
     * @notice Library version `version` of the history (version 0 is the empty genesis).
     * @param version The version number, at most {currentVersion}.
     * @return root Its Merkle root.
     * @return treeSize Its number of experience records.
     * @return cid Its IPFS CID.
     * @return timestamp When it became current.
     */
    function versionAt(uint256 version)
        external
        view
        returns (bytes32 root, uint256 treeSize, string memory cid, uint48 timestamp)
    {
        if (version > currentVersion) {
            revert UnknownVersion(version, currentVersion);
        }
        LibraryVersion storage v = _versions[version];
        return (v.root, v.treeSize, v.cid, v.timestamp);
    }

    /**
     * @notice The quadratic vote weight of `votes` token votes: the integer square root, rounded down.
     * @param votes A number of token votes.
     * @return `floor(sqrt(votes))`.
     */
    function quadraticWeight(uint256 votes) external pure returns (uint256) {
        return Math.sqrt(votes);
    }

    /**
     * @notice Verifies an RFC 9162 (section 2.1.3.2) SHA-256 inclusion proof.
     * @param leafHash The leaf's hash, SHA-256(0x00 || leaf bytes).
     * @param index The leaf's zero-based position.
     * @param treeSize The number of leaves in the tree.
     * @param proof The audit path, sibling hashes from the leaf upwards.
     * @param root The tree root.
     * @return True when the proof shows `leafHash` at `index` of a `treeSize`-leaf tree with root `root`;
     * false for anything else, including `index >= treeSize`.
     */
    function verifyInclusion(
        bytes32 leafHash,
        uint256 index,
        uint256 treeSize,
        bytes32[] calldata proof,
        bytes32 root
    ) external pure returns (bool) {
        return RFC9162.verify(leafHash, index, treeSize, proof, root);
    }

    /**
     * @notice Verifies that the record `leaf` is the `index`-th leaf of library version `version`.
     * @dev The leaf's bytes are hashed here (SHA-256(0x00 || leaf)) and the tree size is the one stored with
     * the version, so neither an interior node passed off as a leaf nor a real leaf at a wrong index or tree
     * size can verify.
     * @param version A version number, at most {currentVersion}; version 0 (the empty library) holds nothing.
     * @param leaf The record's canonical bytes.
     * @param index The leaf's zero-based position.
     * @param proof The audit path, sibling hashes from the leaf upwards.
     * @return True when the record is part of that version's library at `index`.
     */
    function verifyInclusionInVersion(uint256 version, bytes calldata leaf, uint256 index, bytes32[] calldata proof)
        external
        view
        returns (bool)
    {
        if (version > currentVersion) {
            revert UnknownVersion(version, currentVersion);
        }
        LibraryVersion storage v = _versions[version];
        return v.treeSize != 0 && RFC9162.verify(RFC9162.leafHash(leaf), index, v.treeSize, proof, v.root);
    }

    /// @dev Whether `registry` answers both IVoterRegistry calls the registry makes, on a timestamp clock (a token
    /// or another contract passed by mistake would make every vote revert).
    function _isVoterRegistry(IVoterRegistry registry) private view returns (bool) {
        if (address(registry).code.length == 0) {
            return false;
        }
        try registry.clock() returns (uint48 registryClock) {
            if (registryClock != Time.timestamp()) {
                return false;
            }
        } catch {
            return false;
        }
        try registry.isRegisteredAt(address(0), Time.timestamp() - 1) returns (bool) {
            return true;
        } catch {
            return false;
        }
    }

    /// @dev Its own frame: ten event fields next to propose's locals exceed the EVM's reachable stack.
    function _emitCreated(uint256 proposalId, Proposal storage p, bytes32 salt) private {
        emit ProposalCreated(
            proposalId, p.root, p.proposer, p.treeSize, p.cid, p.parentVersion, salt, p.snapshot, p.voteStart, p.voteEnd
        );
    }

    /// @dev Creates proposal `proposalId` for msg.sender: snapshot, threshold and voting window.
    function _open(uint256 proposalId) private returns (Proposal storage p) {
        p = _proposals[proposalId];
        if (p.voteStart != 0) {
            revert ProposalAlreadyExists(proposalId);
        }
        uint48 nowTs = Time.timestamp();
        // Strictly before this block: nothing moved in the proposal's own second (or later) can count.
        uint48 snapshot = nowTs - 1;
        uint256 votes = token.getPastVotes(msg.sender, snapshot);
        if (votes < proposalThreshold) {
            revert InsufficientProposerVotes(msg.sender, votes, proposalThreshold);
        }
        p.proposer = msg.sender;
        p.snapshot = snapshot;
        p.voteStart = nowTs + 1;
        p.voteEnd = nowTs + 1 + votingPeriod;
    }

    /// @dev A library proposal whose parent is no longer current, or a call proposal (treeSize 0) whose call was
    /// executed since it was proposed.
    function _stale(uint256 proposalId, Proposal storage p) private view returns (bool) {
        if (p.treeSize != 0) {
            return p.parentVersion != currentVersion;
        }
        ProposedCall storage c = _calls[proposalId];
        return c.executionsAtProposal != callExecutions[c.callHash];
    }

    /// @dev Reverts with the proposal's own kind of staleness error when it is stale.
    function _requireFresh(uint256 proposalId, Proposal storage p) private view {
        if (p.treeSize != 0) {
            if (p.parentVersion != currentVersion) {
                revert ProposalStale(proposalId, p.parentVersion, currentVersion);
            }
            return;
        }
        ProposedCall storage c = _calls[proposalId];
        uint256 executionsNow = callExecutions[c.callHash];
        if (c.executionsAtProposal != executionsNow) {
            revert CallProposalStale(proposalId, c.callHash, c.executionsAtProposal, executionsNow);
        }
    }

    function _supermajority(Proposal storage p) private view returns (bool) {
        return uint256(p.forWeight) > 2 * uint256(p.againstWeight);
    }
}
