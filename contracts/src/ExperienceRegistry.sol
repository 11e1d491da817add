// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IVotes} from "@openzeppelin/contracts/governance/utils/IVotes.sol";
import {IERC6372} from "@openzeppelin/contracts/interfaces/IERC6372.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {Time} from "@openzeppelin/contracts/utils/types/Time.sol";
import {IVoterRegistry} from "./IVoterRegistry.sol";
import {RFC9162} from "./RFC9162.sol";

/**
 * @title ExperienceRegistry
 * @notice The on-chain head of the Zoo experience library. A library version is the RFC 9162 Merkle root of
 * its canonical experience records plus the IPFS CID of its content. Holders of the governance token (an
 * ERC20Votes token on a timestamp clock, such as {KeeperToken}) propose a new root whose parent is the current
 * root, vote on it with quadratic weight, and anyone executes it once the vote has passed, which appends a
 * version to the history.
 *
 * Rules:
 * - A proposal's snapshot is the second before the block that created it; proposer threshold and vote weights
 *   are read at the snapshot, so tokens acquired (bought, borrowed, flash-loaned, received from someone who
 *   already voted) after the proposal was made never count.
 * - Voting opens the second after the proposal and lasts `votingPeriod` seconds: open while
 *   `voteStart <= block.timestamp < voteEnd`.
 * - A vote weighs `floor(sqrt(votes at snapshot))`; each address votes once per proposal.
 * - Execution is possible from `voteEnd + executionDelay` on, once. It requires a strict two-thirds
 *   supermajority of weight (`forWeight > 2 * againstWeight`), support of at least `quorum` weight (only
 *   `for` weight counts toward quorum, as in OpenZeppelin's GovernorCountingSimple: an opponent's vote can
 *   never lift a proposal over quorum), and that the proposal's parent is still the current root: of several
 *   competing proposals on the same parent, the first executed wins and the others become Stale.
 *
 * SECURITY: square-root voting is NOT Sybil-resistant on its own. Whoever splits a balance over k addresses
 * (each delegating to itself) multiplies their weight by sqrt(k): one holder of 100 tokens has weight 10, the
 * same 100 tokens over 100 addresses have weight 100. The quadratic damping only holds when every voter is a
 * distinct person, which the chain cannot tell. The mitigation is the optional voter registry
 * ({IVoterRegistry}, fixed at deployment): when set, only addresses it reports as registered may vote, so the
 * registry (an allowlist of verified people, a proof-of-personhood attestation) carries the Sybil resistance.
 * Without a registry, treat the weights as no better than "sqrt per address".
 */
contract ExperienceRegistry {
    /// @notice Lifecycle of a proposal, as reported by {state}.
    enum ProposalState {
        // No proposal with this root exists.
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
        // The current root is no longer the proposal's parent (another proposal was executed): it can never pass.
        Stale
    }

    /// @notice A proposal, keyed by the root it proposes.
    struct Proposal {
        // The account that created it.
        address proposer;
        // Timestamp at which token votes are read (the second before creation).
        uint48 snapshot;
        // First second in which votes are accepted.
        uint48 voteStart;
        // First second in which votes are no longer accepted.
        uint48 voteEnd;
        // Whether it was executed.
        bool executed;
        // The library root it builds on; it must still be current when executed.
        bytes32 parentRoot;
        // Sum of the quadratic weights voting for.
        uint256 forWeight;
        // Sum of the quadratic weights voting against.
        uint256 againstWeight;
        // IPFS CID of the proposed library's content.
        string cid;
    }

    /// @notice An entry of the library history.
    struct LibraryVersion {
        // Merkle root of the library (zero for version 0, the empty genesis).
        bytes32 root;
        // Block timestamp at which the version became current.
        uint48 timestamp;
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
    /// @notice Token votes (not quadratic weight) the proposer needs at the snapshot.
    uint256 public immutable proposalThreshold;
    /// @notice Minimum total quadratic weight (for + against) a proposal needs to pass.
    uint256 public immutable quorum;
    /// @notice Registry of addresses allowed to vote; the zero address means everyone may vote.
    IVoterRegistry public immutable voterRegistry;

    /// @notice Merkle root of the current library version (zero before the first execution).
    bytes32 public currentRoot;
    /// @notice Number of the current library version (zero before the first execution); only ever increases.
    uint256 public currentVersion;

    mapping(bytes32 root => Proposal) private _proposals;
    mapping(bytes32 root => mapping(address voter => bool)) private _hasVoted;
    mapping(uint256 version => LibraryVersion) private _versions;

    /**
     * @notice A proposal was created.
     * @param root The proposed library root.
     * @param proposer The account that created it.
     * @param parentRoot The library root it builds on.
     * @param cid IPFS CID of the proposed library's content.
     * @param snapshot Timestamp at which votes are read.
     * @param voteStart First second of voting.
     * @param voteEnd First second after voting.
     */
    event ProposalCreated(
        bytes32 indexed root,
        address indexed proposer,
        bytes32 parentRoot,
        string cid,
        uint48 snapshot,
        uint48 voteStart,
        uint48 voteEnd
    );

    /**
     * @notice A vote was cast.
     * @param root The proposal voted on.
     * @param voter The voting account.
     * @param support True for, false against.
     * @param weight The vote's quadratic weight.
     */
    event VoteCast(bytes32 indexed root, address indexed voter, bool support, uint256 weight);

    /**
     * @notice A proposal was executed.
     * @param root The executed proposal's root.
     */
    event ProposalExecuted(bytes32 indexed root);

    /**
     * @notice The current library changed.
     * @param version The new version number.
     * @param root The new library root.
     * @param cid IPFS CID of the new library's content.
     */
    event LibraryUpdated(uint256 indexed version, bytes32 indexed root, string cid);

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

    /**
     * @notice The voter registry address has no code.
     * @param voterRegistry The address given.
     */
    error InvalidVoterRegistry(address voterRegistry);

    /// @notice The proposed root is zero (reserved for the empty genesis).
    error ZeroRoot();

    /// @notice The proposed CID is empty.
    error EmptyCID();

    /**
     * @notice The proposed CID is longer than {MAX_CID_LENGTH}.
     * @param length The CID's length in bytes.
     * @param maxLength The longest accepted.
     */
    error CIDTooLong(uint256 length, uint256 maxLength);

    /**
     * @notice The proposed CID is not a CIDv0 (`Qm` + 44 base58btc characters) or a multibase CIDv1 string
     * (a prefix `b` `B` `z` `k` `K` `f` `F` or `u`, then characters of `[0-9A-Za-z_-]`).
     * @param position Zero-based index of the first byte that breaks the rule.
     */
    error InvalidCID(uint256 position);

    /**
     * @notice A proposal for this root already exists (roots can be proposed only once).
     * @param root The root.
     */
    error ProposalAlreadyExists(bytes32 root);

    /**
     * @notice The proposal's parent is not the current root.
     * @param parentRoot The parent given.
     * @param currentRoot The current root.
     */
    error WrongParent(bytes32 parentRoot, bytes32 currentRoot);

    /**
     * @notice The proposer's votes at the snapshot are below {proposalThreshold}.
     * @param proposer The proposer.
     * @param votes Its votes at the snapshot.
     * @param threshold The votes required.
     */
    error InsufficientProposerVotes(address proposer, uint256 votes, uint256 threshold);

    /**
     * @notice No proposal with this root exists.
     * @param root The root.
     */
    error ProposalNotFound(bytes32 root);

    /**
     * @notice Voting on the proposal has not opened yet.
     * @param root The proposal.
     * @param voteStart First second of voting.
     */
    error VotingNotStarted(bytes32 root, uint48 voteStart);

    /**
     * @notice Voting on the proposal has closed.
     * @param root The proposal.
     * @param voteEnd First second after voting.
     */
    error VotingClosed(bytes32 root, uint48 voteEnd);

    /**
     * @notice The voter already voted on the proposal.
     * @param root The proposal.
     * @param voter The voter.
     */
    error AlreadyVoted(bytes32 root, address voter);

    /**
     * @notice The voter had no votes at the proposal's snapshot.
     * @param root The proposal.
     * @param voter The voter.
     */
    error NoVotingPower(bytes32 root, address voter);

    /**
     * @notice The voter is not in the voter registry.
     * @param voter The voter.
     */
    error VoterNotRegistered(address voter);

    /**
     * @notice The proposal's parent is no longer the current root, so it can never be executed.
     * @param root The proposal.
     * @param parentRoot Its parent.
     * @param currentRoot The current root.
     */
    error ProposalStale(bytes32 root, bytes32 parentRoot, bytes32 currentRoot);

    /**
     * @notice The proposal cannot be executed before `executableAt`.
     * @param root The proposal.
     * @param executableAt First second of execution (end of voting plus the execution delay).
     */
    error ExecutionTooEarly(bytes32 root, uint256 executableAt);

    /**
     * @notice The proposal was already executed.
     * @param root The proposal.
     */
    error ProposalAlreadyExecuted(bytes32 root);

    /**
     * @notice Fewer than {quorum} weight units were cast for the proposal (against votes do not count).
     * @param root The proposal.
     * @param support Weight cast for.
     * @param quorum The weight required.
     */
    error QuorumNotReached(bytes32 root, uint256 support, uint256 quorum);

    /**
     * @notice The proposal lacks a strict two-thirds supermajority (`forWeight > 2 * againstWeight`).
     * @param root The proposal.
     * @param forWeight Weight for.
     * @param againstWeight Weight against.
     */
    error ProposalDefeated(bytes32 root, uint256 forWeight, uint256 againstWeight);

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
     * @param proposalThreshold_ Token votes a proposer needs at the snapshot.
     * @param quorum_ Minimum `for` quadratic weight for a proposal to pass (against votes never count toward it).
     * @param voterRegistry_ Registry of allowed voters, or the zero address to let every token holder vote.
     */
    constructor(
        IVotes token_,
        uint32 votingPeriod_,
        uint32 executionDelay_,
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
        if (address(voterRegistry_) != address(0) && address(voterRegistry_).code.length == 0) {
            revert InvalidVoterRegistry(address(voterRegistry_));
        }
        token = token_;
        votingPeriod = votingPeriod_;
        executionDelay = executionDelay_;
        proposalThreshold = proposalThreshold_;
        quorum = quorum_;
        voterRegistry = voterRegistry_;
        _versions[0].timestamp = Time.timestamp();
    }

    /**
     * @notice Proposes `root` (content at `cid`) as the next library version after `parentRoot`.
     * @dev A root can be proposed only once, ever, and the first proposal of a root fixes its CID. A holder
     * above the threshold who front-runs a proposal with the same root and a wrong CID therefore blocks that
     * root; voters must check that the CID's content hashes to the root and vote such a proposal down, and the
     * honest proposer must publish a different root (any change to the library's records changes it).
     * @param root Merkle root of the proposed library (non-zero, never proposed before).
     * @param cid IPFS CID of the proposed library's content (1 to {MAX_CID_LENGTH} bytes, see {InvalidCID}).
     * @param parentRoot The root it builds on; must equal {currentRoot}.
     * @return voteEnd First second after the voting window.
     */
    function propose(bytes32 root, string calldata cid, bytes32 parentRoot) external returns (uint48 voteEnd) {
        if (root == bytes32(0)) {
            revert ZeroRoot();
        }
        uint256 cidLength = bytes(cid).length;
        if (cidLength == 0) {
            revert EmptyCID();
        }
        if (cidLength > MAX_CID_LENGTH) {
            revert CIDTooLong(cidLength, MAX_CID_LENGTH);
        }
        _checkCID(bytes(cid));
        Proposal storage p = _proposals[root];
        if (p.voteStart != 0) {
            revert ProposalAlreadyExists(root);
        }
        if (parentRoot != currentRoot) {
            revert WrongParent(parentRoot, currentRoot);
        }
        uint48 nowTs = Time.timestamp();
        // Strictly before this block: nothing moved in the proposal's own second (or later) can count.
        uint48 snapshot = nowTs - 1;
        uint256 votes = token.getPastVotes(msg.sender, snapshot);
        if (votes < proposalThreshold) {
            revert InsufficientProposerVotes(msg.sender, votes, proposalThreshold);
        }
        uint48 voteStart = nowTs + 1;
        voteEnd = voteStart + votingPeriod;
        p.proposer = msg.sender;
        p.snapshot = snapshot;
        p.voteStart = voteStart;
        p.voteEnd = voteEnd;
        p.parentRoot = parentRoot;
        p.cid = cid;
        emit ProposalCreated(root, msg.sender, parentRoot, cid, snapshot, voteStart, voteEnd);
    }

    /**
     * @notice Votes on the proposal of `root` with weight `floor(sqrt(votes at its snapshot))`.
     * @dev The token and registry are read with static calls, so neither can re-enter.
     * @param root The proposal.
     * @param support True to vote for, false to vote against.
     * @return weight The weight counted.
     */
    function vote(bytes32 root, bool support) external returns (uint256 weight) {
        Proposal storage p = _proposals[root];
        if (p.voteStart == 0) {
            revert ProposalNotFound(root);
        }
        uint48 nowTs = Time.timestamp();
        if (nowTs < p.voteStart) {
            revert VotingNotStarted(root, p.voteStart);
        }
        if (nowTs >= p.voteEnd) {
            revert VotingClosed(root, p.voteEnd);
        }
        if (p.parentRoot != currentRoot) {
            revert ProposalStale(root, p.parentRoot, currentRoot);
        }
        if (_hasVoted[root][msg.sender]) {
            revert AlreadyVoted(root, msg.sender);
        }
        if (address(voterRegistry) != address(0) && !voterRegistry.isRegistered(msg.sender)) {
            revert VoterNotRegistered(msg.sender);
        }
        weight = Math.sqrt(token.getPastVotes(msg.sender, p.snapshot));
        if (weight == 0) {
            revert NoVotingPower(root, msg.sender);
        }
        _hasVoted[root][msg.sender] = true;
        if (support) {
            p.forWeight += weight;
        } else {
            p.againstWeight += weight;
        }
        emit VoteCast(root, msg.sender, support, weight);
    }

    /**
     * @notice Makes a passed proposal the current library version. Anyone may call it.
     * @param root The proposal.
     * @return version The new version number.
     */
    function execute(bytes32 root) external returns (uint256 version) {
        Proposal storage p = _proposals[root];
        if (p.voteStart == 0) {
            revert ProposalNotFound(root);
        }
        if (p.executed) {
            revert ProposalAlreadyExecuted(root);
        }
        uint256 executableAt = uint256(p.voteEnd) + executionDelay;
        if (block.timestamp < executableAt) {
            revert ExecutionTooEarly(root, executableAt);
        }
        if (p.parentRoot != currentRoot) {
            revert ProposalStale(root, p.parentRoot, currentRoot);
        }
        if (p.forWeight < quorum) {
            revert QuorumNotReached(root, p.forWeight, quorum);
        }
        if (!_supermajority(p)) {
            revert ProposalDefeated(root, p.forWeight, p.againstWeight);
        }
        p.executed = true;
        currentRoot = root;
        version = ++currentVersion;
        LibraryVersion storage v = _versions[version];
        v.root = root;
        v.timestamp = Time.timestamp();
        v.cid = p.cid;
        emit ProposalExecuted(root);
        emit LibraryUpdated(version, root, p.cid);
    }

    /**
     * @notice The proposal of `root`; all fields are zero when there is none.
     * @param root The proposal.
     * @return The proposal.
     */
    function proposal(bytes32 root) external view returns (Proposal memory) {
        return _proposals[root];
    }

    /**
     * @notice The lifecycle state of the proposal of `root`.
     * @param root The proposal.
     * @return The state; {execute} succeeds exactly in state Succeeded.
     */
    function state(bytes32 root) external view returns (ProposalState) {
        Proposal storage p = _proposals[root];
        if (p.voteStart == 0) {
            return ProposalState.Unknown;
        }
        if (p.executed) {
            return ProposalState.Executed;
        }
        if (p.parentRoot != currentRoot) {
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
        if (block.timestamp < uint256(p.voteEnd) + executionDelay) {
            return ProposalState.Queued;
        }
        return ProposalState.Succeeded;
    }

    /**
     * @notice Whether `voter` has voted on the proposal of `root`.
     * @param root The proposal.
     * @param voter The account.
     * @return True when it has voted.
     */
    function hasVoted(bytes32 root, address voter) external view returns (bool) {
        return _hasVoted[root][voter];
    }

    /**
     * @notice The weight `voter` would vote with on the proposal of `root` (ignoring the voter registry and
     * whether it already voted).
     * @param root The proposal (must exist).
     * @param voter The account.
     * @return `floor(sqrt(votes of voter at the proposal's snapshot))`.
     */
    function votingWeight(bytes32 root, address voter) external view returns (uint256) {
        Proposal storage p = _proposals[root];
        if (p.voteStart == 0) {
            revert ProposalNotFound(root);
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
     * @return cid Its IPFS CID.
     * @return timestamp When it became current.
     */
    function currentLibrary()
        external
        view
        returns (uint256 version, bytes32 root, string memory cid, uint48 timestamp)
    {
        version = currentVersion;
        LibraryVersion storage v = _versions[version];
        return (version, v.root, v.cid, v.timestamp);
    }

    /**
     * @notice Library version `version` of the history (version 0 is the empty genesis).
     * @param version The version number, at most {currentVersion}.
     * @return root Its Merkle root.
     * @return cid Its IPFS CID.
     * @return timestamp When it became current.
     */
    function versionAt(uint256 version) external view returns (bytes32 root, string memory cid, uint48 timestamp) {
        if (version > currentVersion) {
            revert UnknownVersion(version, currentVersion);
        }
        LibraryVersion storage v = _versions[version];
        return (v.root, v.cid, v.timestamp);
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
     * @notice Verifies an RFC 9162 inclusion proof against the root of library version `version`.
     * @param version A version number, at most {currentVersion}; version 0 (the empty library) holds nothing.
     * @param leafHash The leaf's hash, SHA-256(0x00 || leaf bytes).
     * @param index The leaf's zero-based position.
     * @param treeSize The number of leaves in the tree.
     * @param proof The audit path, sibling hashes from the leaf upwards.
     * @return True when the leaf is part of that version's library.
     */
    function verifyInclusionInVersion(
        uint256 version,
        bytes32 leafHash,
        uint256 index,
        uint256 treeSize,
        bytes32[] calldata proof
    ) external view returns (bool) {
        if (version > currentVersion) {
            revert UnknownVersion(version, currentVersion);
        }
        bytes32 root = _versions[version].root;
        return root != bytes32(0) && RFC9162.verify(leafHash, index, treeSize, proof, root);
    }

    /**
     * @dev Every client decodes CIDs from events and storage as text and hands them to IPFS: a CID of
     * arbitrary bytes (non-UTF-8, control characters, spaces) once stayed in the event history and broke
     * every listing for good. Only the characters of the multibase alphabets IPFS uses are accepted.
     */
    function _checkCID(bytes calldata cid) private pure {
        bytes1 first = cid[0];
        if (first == "Q") {
            // CIDv0: base58btc multihash, always "Qm" and 46 characters.
            if (cid.length != 46) {
                revert InvalidCID(cid.length < 46 ? cid.length : 46);
            }
            if (cid[1] != "m") {
                revert InvalidCID(1);
            }
            for (uint256 i = 2; i < 46; ++i) {
                if (!_isBase58(cid[i])) {
                    revert InvalidCID(i);
                }
            }
            return;
        }
        if (
            first != "b" && first != "B" && first != "z" && first != "k" && first != "K" && first != "f"
                && first != "F" && first != "u"
        ) {
            revert InvalidCID(0);
        }
        if (cid.length < 2) {
            revert InvalidCID(1);
        }
        for (uint256 i = 1; i < cid.length; ++i) {
            bytes1 c = cid[i];
            bool ok = (c >= "0" && c <= "9") || (c >= "A" && c <= "Z") || (c >= "a" && c <= "z") || c == "-"
                || c == "_";
            if (!ok) {
                revert InvalidCID(i);
            }
        }
    }

    function _isBase58(bytes1 c) private pure returns (bool) {
        return ((c >= "1" && c <= "9") || (c >= "A" && c <= "Z") || (c >= "a" && c <= "z")) && c != "I"
            && c != "O" && c != "l";
    }

    function _supermajority(Proposal storage p) private view returns (bool) {
        return p.forWeight > 2 * p.againstWeight;
    }
}
