// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IVotes} from "@openzeppelin/contracts/governance/utils/IVotes.sol";
import {IERC6372} from "@openzeppelin/contracts/interfaces/IERC6372.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {SignatureChecker} from "@openzeppelin/contracts/utils/cryptography/SignatureChecker.sol";
import {CIDs} from "./CIDs.sol";
import {ILedgerGovernance} from "./DaoCalls.sol";
import {RFC9162} from "./RFC9162.sol";

/**
 * @title UsageLedger
 * @notice Inference credits for the authors of approved experiences, settled from the usage nodes meter.
 *
 * A node registered by the DAO (the `governor`) posts, once per ended epoch, a usage report: the RFC 9162
 * Merkle root over its records, the number of records, the units authors earned in total, and the IPFS CID
 * of the full report, which anyone can fetch and check against the root. A record is the leaf
 * `abi.encodePacked(uint8 kind, address account, uint256 units)`: kind 0 (EARNED) credits an author with
 * the units the node's answers gave their experiences, kind 1 (SPENT) debits a client with the credits it
 * spent at the node. A report is for an ended epoch at or after the node's registration, posted at most
 * `reportWindow` seconds after that epoch ended. For `challengeWindow` seconds after posting, a KEEPER holder
 * (at least `challengeThreshold` votes the second before the report was posted) may challenge a report,
 * staking `challengeBond` wei, once per report; a challenged report is frozen until the governor resolves it:
 * upheld, it is void for good and the bond goes back to the challenger; dismissed, it is claimable and the
 * bond goes to the node it froze. The governor has `resolutionPeriod` seconds from the challenge; after that
 * the challenge has lapsed and anyone settles it ({settleLapsedChallenge}): the bond goes back to the
 * challenger and the report is released, as if it had not been challenged. Once the window has passed, each
 * author claims their EARNED record with a Merkle proof, once per (node, epoch), and anyone applies a SPENT
 * record that comes with the client's signed {SpendAuthorization} naming that client, node and epoch (the node
 * does, so balances go down everywhere).
 *
 * Credits are non-transferable: an account's balance is what it claimed minus what it spent, shown as zero
 * while spent exceeds claimed. There is no transfer. A consent lets its node charge up to its units in its
 * epoch whether or not the node served anything, for the whole epoch (time before it was signed included),
 * and whatever the client's balance: `spent` may exceed `earned`, a debt that later claims pay off first.
 *
 * What an honest operator can and cannot prevent: a registered node can invent usage (for its own
 * accounts, say). The contract bounds it: at most `maxUnitsPerReport` units are claimable from one report,
 * one report per node and epoch, only for epochs from the node's registration on and only within
 * `reportWindow` of their end (so a node adds at most `maxUnitsPerReport` units per epoch it was registered,
 * never a backlog of past epochs), only after the challenge window, and the DAO can deregister a node, which
 * makes its reports not yet claimed unclaimable for good: a report counts only under the registration it was
 * posted in, so registering the node again later revives none of them. It cannot prove that usage happened.
 * A node cannot spend anyone's credits: a SPENT record applies only up to what the client signed that it
 * allows that node to charge in that epoch (EIP-712, this contract's domain, the client named in what it
 * signs, so one owner's signature never serves another of its accounts), so a node lowers only the balances
 * of clients that chose to spend there, and by no more than they allowed.
 */
contract UsageLedger is EIP712, ILedgerGovernance {
    /// @notice Leaf kind of an author's earned units.
    uint8 public constant EARNED = 0;
    /// @notice Leaf kind of a client's spent credits.
    uint8 public constant SPENT = 1;
    /// @notice Longest CID accepted, in bytes.
    uint256 public constant MAX_CID_LENGTH = 256;
    /// @notice EIP-712 type of a client's consent to be charged by a node in an epoch, up to `units` credits.
    /// The client is part of what it signs: a signature checked through ERC-1271 is often valid for every
    /// wallet its owner controls, and must not serve any but the one it names.
    bytes32 public constant SPEND_AUTHORIZATION_TYPEHASH =
        keccak256("SpendAuthorization(address client,address node,uint256 epoch,uint256 units)");

    /// @notice A node's registration, as {registration} returns it.
    struct Registration {
        // Whether the node may post reports, and its reports of this registration be claimed and applied.
        bool active;
        // How many times the node was registered, this registration included; each report keeps the number
        // it was posted under.
        uint32 number;
        // The first epoch it may report: the one it was (last) registered in.
        uint64 firstEpoch;
    }

    /// @notice One usage report, keyed by node and epoch.
    struct Report {
        // Merkle root over the report's records.
        bytes32 root;
        // Number of records (leaves). 32 bits, so that the registration below and earnedUnits share this slot
        // with it (a report writes one slot fewer); a report of 2**32 records could not be built anyway.
        uint32 treeSize;
        // When it was posted; the challenge window runs from here.
        uint48 postedAt;
        // A KEEPER holder challenged it and the challenge is neither resolved nor settled as lapsed.
        bool challenged;
        // The governor upheld a challenge: nothing can be claimed or applied from it, ever.
        bool voided;
        // The node's registration number ({Registration}) when it was posted: only under it is it claimable.
        uint32 registration;
        // Units of EARNED records the node declared (at most maxUnitsPerReport).
        uint128 earnedUnits;
        // Units claimed from it so far (never more than earnedUnits).
        uint128 claimedUnits;
        // IPFS CID of the full report.
        string cid;
        // Who challenged it (and staked the bond), while a challenge is pending or after it was resolved.
        address challenger;
        // When it was challenged (zero if never); the governor resolves by `challengedAt + resolutionPeriod`.
        uint48 challengedAt;
    }

    /// @notice The account that registers and deregisters nodes and resolves challenges (the DAO).
    address public immutable governor;
    /// @notice The KEEPER token (ERC-5805, timestamp clock) whose holders may challenge reports.
    IVotes public immutable keeperToken;
    /// @notice Length of an epoch in seconds; epoch `e` spans `[e * epochLength, (e + 1) * epochLength)`.
    uint256 public immutable epochLength;
    /// @notice Seconds after posting during which a report can be challenged and nothing claimed from it.
    uint256 public immutable challengeWindow;
    /// @notice Most units a report may declare as earned (and so most claimable from one node and epoch).
    uint256 public immutable maxUnitsPerReport;
    /// @notice KEEPER votes a challenger needs, read the second before the report was posted.
    uint256 public immutable challengeThreshold;
    /// @notice Seconds after an epoch ends within which its report may be posted.
    uint256 public immutable reportWindow;
    /// @notice Wei a challenger stakes: returned when the challenge is upheld or lapses, paid to the node when
    /// dismissed.
    uint256 public immutable challengeBond;
    /// @notice Seconds after a challenge within which the governor may resolve it; then it lapses. Set it
    /// above the governor's vote plus execution delay, so that the DAO can answer in time.
    uint256 public immutable resolutionPeriod;

    mapping(address node => Registration) private _registrations;
    /// @notice Wei an account can withdraw: bonds of challenges resolved in its favour.
    mapping(address account => uint256) public withdrawable;
    /// @notice Credits claimed by an account, ever.
    mapping(address account => uint256) public earned;
    /// @notice Credits spent by an account, ever.
    mapping(address account => uint256) public spent;

    mapping(address node => mapping(uint256 epoch => Report)) private _reports;
    mapping(bytes32 record => bool) private _settled;

    event NodeRegistered(address indexed node);
    event NodeDeregistered(address indexed node);
    event ReportPosted(
        address indexed node, uint256 indexed epoch, bytes32 root, uint256 treeSize, uint256 earnedUnits, string cid
    );
    event ReportChallenged(address indexed node, uint256 indexed epoch, address indexed challenger, string reason);
    event ChallengeResolved(address indexed node, uint256 indexed epoch, bool upheld);
    /// @notice The governor did not resolve a challenge within `resolutionPeriod`: the report is released and
    /// the bond returned to `challenger`.
    event ChallengeLapsed(address indexed node, uint256 indexed epoch, address indexed challenger);
    event CreditsClaimed(address indexed node, uint256 indexed epoch, address indexed author, uint256 units);
    event CreditsSpent(address indexed node, uint256 indexed epoch, address indexed client, uint256 units);
    /// @notice A resolved challenge's bond went to `to` (withdrawable).
    event BondAwarded(address indexed node, uint256 indexed epoch, address indexed to, uint256 amount);
    /// @notice `account` withdrew `amount` wei of awarded bonds.
    event Withdrawn(address indexed account, uint256 amount);

    /// @notice A constructor argument is out of range (its name says which).
    error InvalidParameter(string name);
    /// @notice Only the governor may do this.
    error NotGovernor(address caller);
    /// @notice The node is not registered.
    error NodeNotRegistered(address node);
    /// @notice The node is registered already (or, deregistering, not registered).
    error NodeAlreadyRegistered(address node);
    /// @notice The epoch has not ended: a report for it can be posted from `endsAt` on.
    error EpochNotEnded(uint256 epoch, uint256 endsAt);
    /// @notice The epoch lies before the node's registration: its first reportable epoch is `firstEpoch`.
    error EpochBeforeRegistration(uint256 epoch, uint256 firstEpoch);
    /// @notice The report for the epoch had to be posted before `deadline`.
    error ReportTooLate(uint256 epoch, uint256 deadline);
    /// @notice A challenge must stake exactly the bond.
    error WrongChallengeBond(uint256 sent, uint256 bond);
    /// @notice Nothing to withdraw.
    error NothingToWithdraw(address account);
    /// @notice The client did not sign a spend authorization naming it, this node and this epoch, for the units
    /// presented (`authorized`).
    error InvalidSpendAuthorization(address node, uint256 epoch, address client, uint256 authorized);
    /// @notice The SPENT record charges more than the client's authorization allows.
    error SpendOverAuthorization(address client, uint256 units, uint256 authorized);
    /// @notice The node posted a report for this epoch already.
    error ReportExists(address node, uint256 epoch);
    /// @notice The node posted no report for this epoch.
    error ReportNotFound(address node, uint256 epoch);
    /// @notice The report's root is zero.
    error ZeroRoot();
    /// @notice The report has no records, or more than 2**32 - 1.
    error EmptyTree();
    /// @notice The report declares more earned units than one report may.
    error UnitsOverCap(uint256 units, uint256 cap);
    /// @notice The report's challenge window is still open: claims start at `claimableAt`.
    error ChallengeWindowOpen(address node, uint256 epoch, uint256 claimableAt);
    /// @notice The report's challenge window closed at `closedAt`.
    error ChallengeWindowClosed(address node, uint256 epoch, uint256 closedAt);
    /// @notice The report is challenged and waits for the governor.
    error ReportUnderChallenge(address node, uint256 epoch);
    /// @notice The report was voided by an upheld challenge.
    error ReportVoided(address node, uint256 epoch);
    /// @notice The report is not challenged (nothing to resolve).
    error ReportNotChallenged(address node, uint256 epoch);
    /// @notice The report was challenged once already (by `challenger`): a report is challenged at most once.
    error ReportAlreadyChallenged(address node, uint256 epoch, address challenger);
    /// @notice The challenge lapsed at `closedAt`: the governor can no longer resolve it, anyone settles it
    /// with {settleLapsedChallenge}.
    error ChallengeResolutionClosed(address node, uint256 epoch, uint256 closedAt);
    /// @notice The governor may resolve the challenge until `closesAt`; it lapses only then.
    error ChallengeResolutionOpen(address node, uint256 epoch, uint256 closesAt);
    /// @notice The report was posted under the node's registration `reportRegistration`, which a
    /// deregistration ended; the node is now in its registration `currentRegistration`.
    error ReportOfEndedRegistration(
        address node, uint256 epoch, uint256 reportRegistration, uint256 currentRegistration
    );
    /// @notice The challenger held too few KEEPER votes the second before the report was posted.
    error InsufficientKeeperVotes(address challenger, uint256 votes, uint256 threshold);
    /// @notice The proof does not show this record in the report.
    error InvalidProof(address node, uint256 epoch, uint8 kind, address account, uint256 units);
    /// @notice This record of this report was claimed (or applied) already.
    error AlreadySettled(address node, uint256 epoch, uint8 kind, address account);
    /// @notice Claiming `units` would take more than the report declared as earned.
    error ClaimOverCap(address node, uint256 epoch, uint256 claimable, uint256 units);

    modifier onlyGovernor() {
        if (msg.sender != governor) {
            revert NotGovernor(msg.sender);
        }
        _;
    }

    constructor(
        address governor_,
        IVotes keeperToken_,
        uint256 epochLength_,
        uint256 challengeWindow_,
        uint256 maxUnitsPerReport_,
        uint256 challengeThreshold_,
        uint256 reportWindow_,
        uint256 challengeBond_,
        uint256 resolutionPeriod_
    ) EIP712("UsageLedger", "1") {
        if (governor_ == address(0)) {
            revert InvalidParameter("governor");
        }
        if (address(keeperToken_).code.length == 0) {
            revert InvalidParameter("keeperToken");
        }
        // Challenge thresholds are read with getPastVotes at a timestamp: the token must count in seconds.
        try IERC6372(address(keeperToken_)).CLOCK_MODE() returns (string memory mode) {
            if (keccak256(bytes(mode)) != keccak256("mode=timestamp")) {
                revert InvalidParameter("keeperToken");
            }
        } catch {
            revert InvalidParameter("keeperToken");
        }
        if (epochLength_ == 0 || epochLength_ > 365 days) {
            revert InvalidParameter("epochLength");
        }
        if (challengeWindow_ == 0 || challengeWindow_ > 365 days) {
            revert InvalidParameter("challengeWindow");
        }
        if (maxUnitsPerReport_ == 0 || maxUnitsPerReport_ > type(uint128).max) {
            revert InvalidParameter("maxUnitsPerReport");
        }
        if (challengeThreshold_ == 0) {
            revert InvalidParameter("challengeThreshold");
        }
        if (reportWindow_ == 0 || reportWindow_ > 365 days) {
            revert InvalidParameter("reportWindow");
        }
        if (challengeBond_ == 0) {
            revert InvalidParameter("challengeBond");
        }
        if (resolutionPeriod_ == 0 || resolutionPeriod_ > 365 days) {
            revert InvalidParameter("resolutionPeriod");
        }
        governor = governor_;
        keeperToken = keeperToken_;
        epochLength = epochLength_;
        challengeWindow = challengeWindow_;
        maxUnitsPerReport = maxUnitsPerReport_;
        challengeThreshold = challengeThreshold_;
        reportWindow = reportWindow_;
        challengeBond = challengeBond_;
        resolutionPeriod = resolutionPeriod_;
    }

    // ---- governance

    /// @notice Let `node` post reports (the governor only); a new registration, with a new number.
    function registerNode(address node) external onlyGovernor {
        Registration storage reg = _registrations[node];
        if (reg.active || node == address(0)) {
            revert NodeAlreadyRegistered(node);
        }
        reg.active = true;
        ++reg.number;
        // An epoch is a timestamp divided by at least one: it fits in 64 bits.
        reg.firstEpoch = uint64(block.timestamp / epochLength);
        emit NodeRegistered(node);
    }

    /// @notice Stop `node` posting reports; its reports can no longer be claimed or applied, even if it is
    /// registered again (the governor only).
    function deregisterNode(address node) external onlyGovernor {
        Registration storage reg = _registrations[node];
        if (!reg.active) {
            revert NodeNotRegistered(node);
        }
        reg.active = false;
        emit NodeDeregistered(node);
    }

    /**
     * @notice Resolve a challenge within `resolutionPeriod` of it: `upheld` voids the report for good and
     * returns the bond to the challenger; dismissed, the report becomes claimable and the bond goes to the node
     * (for the freeze it suffered). Bonds are withdrawn with {withdraw}.
     */
    function resolveChallenge(address node, uint256 epoch, bool upheld) external onlyGovernor {
        Report storage r = _existing(node, epoch);
        if (!r.challenged) {
            revert ReportNotChallenged(node, epoch);
        }
        uint256 closesAt = uint256(r.challengedAt) + resolutionPeriod;
        if (block.timestamp >= closesAt) {
            revert ChallengeResolutionClosed(node, epoch, closesAt);
        }
        r.challenged = false;
        r.voided = upheld;
        address to = upheld ? r.challenger : node;
        withdrawable[to] += challengeBond;
        emit ChallengeResolved(node, epoch, upheld);
        emit BondAwarded(node, epoch, to, challengeBond);
    }

    /**
     * @notice Settle a challenge the governor left unresolved for `resolutionPeriod` seconds (anyone may):
     * the bond goes back to the challenger and the report is released, claimable as if never challenged.
     * Emits {ChallengeLapsed} and {BondAwarded}.
     * @dev The DAO's silence is no verdict, so the state before the challenge returns. Voiding instead would
     * let any KEEPER holder kill an honest report for free whenever the DAO is slow; keeping the bond would
     * make an honest challenger pay for the DAO's inaction. What remains: a challenge the DAO ignores freezes a
     * report for at most `resolutionPeriod` at no cost (the DAO takes the bond by dismissing in time), and a
     * bad report it ignores is claimable like any unchallenged one, within the per-report cap.
     */
    function settleLapsedChallenge(address node, uint256 epoch) external {
        Report storage r = _existing(node, epoch);
        if (!r.challenged) {
            revert ReportNotChallenged(node, epoch);
        }
        uint256 closesAt = uint256(r.challengedAt) + resolutionPeriod;
        if (block.timestamp < closesAt) {
            revert ChallengeResolutionOpen(node, epoch, closesAt);
        }
        r.challenged = false;
        address challenger = r.challenger;
        withdrawable[challenger] += challengeBond;
        emit ChallengeLapsed(node, epoch, challenger);
        emit BondAwarded(node, epoch, challenger, challengeBond);
    }

    /// @notice Send the caller the bonds awarded to it. Emits a {Withdrawn} event.
    function withdraw() external {
        uint256 amount = withdrawable[msg.sender];
        if (amount == 0) {
            revert NothingToWithdraw(msg.sender);
        }
        withdrawable[msg.sender] = 0;
        emit Withdrawn(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
    }

    // ---- reports

    /**
     * @notice Post the caller's usage report for an ended epoch: one from the node's registration on, posted
     * within `reportWindow` seconds of the epoch's end.
     * @param epoch The epoch (`block.timestamp / epochLength` while it runs).
     * @param root RFC 9162 root over the records.
     * @param treeSize Number of records (1 to 2**32 - 1).
     * @param earnedUnits Sum of the units of the EARNED records (what claims may take in total).
     * @param cid IPFS CID of the full report.
     */
    function postReport(uint256 epoch, bytes32 root, uint256 treeSize, uint256 earnedUnits, string calldata cid)
        external
    {
        Registration storage reg = _registrations[msg.sender];
        if (!reg.active) {
            revert NodeNotRegistered(msg.sender);
        }
        if (epoch < reg.firstEpoch) {
            revert EpochBeforeRegistration(epoch, reg.firstEpoch);
        }
        // An epoch so large that its end overflows reverts here with a panic (checked arithmetic).
        uint256 endsAt = (epoch + 1) * epochLength;
        if (block.timestamp < endsAt) {
            revert EpochNotEnded(epoch, endsAt);
        }
        if (block.timestamp >= endsAt + reportWindow) {
            revert ReportTooLate(epoch, endsAt + reportWindow);
        }
        Report storage r = _reports[msg.sender][epoch];
        if (r.postedAt != 0) {
            revert ReportExists(msg.sender, epoch);
        }
        if (root == bytes32(0)) {
            revert ZeroRoot();
        }
        if (treeSize == 0 || treeSize > type(uint32).max) {
            revert EmptyTree();
        }
        if (earnedUnits > maxUnitsPerReport) {
            revert UnitsOverCap(earnedUnits, maxUnitsPerReport);
        }
        CIDs.check(bytes(cid), MAX_CID_LENGTH);
        r.root = root;
        r.treeSize = uint32(treeSize);
        r.postedAt = uint48(block.timestamp);
        r.registration = reg.number;
        r.earnedUnits = uint128(earnedUnits);
        r.cid = cid;
        emit ReportPosted(msg.sender, epoch, root, treeSize, earnedUnits, cid);
    }

    /**
     * @notice Challenge a report within its window; `reason` is for the governor to read.
     * @dev A challenge freezes every claim of the report until a DAO vote resolves it, so challenges must not
     * be free: a challenger holds at least `challengeThreshold` KEEPER votes (read before the report was
     * posted) and stakes `challengeBond` wei. An upheld challenge gets its bond back; a dismissed one loses it
     * to the node it froze; one the governor leaves unresolved for `resolutionPeriod` gets it back
     * ({settleLapsedChallenge}). Freezing n honest reports thus risks n bonds, while an honest challenger risks
     * nothing it does not get back. (A per-challenger quota was the alternative; it would still let many
     * KEEPER addresses freeze reports for free, and limit an honest challenger facing many bad reports.)
     * A report is challenged at most once: a lapsed challenge repeated would freeze a report again and again
     * for free, and a passed `resolveChallenge` proposal left over from the first challenge could resolve a
     * second one that no vote looked at.
     */
    function challenge(address node, uint256 epoch, string calldata reason) external payable {
        if (msg.value != challengeBond) {
            revert WrongChallengeBond(msg.value, challengeBond);
        }
        Report storage r = _existing(node, epoch);
        uint256 closedAt = uint256(r.postedAt) + challengeWindow;
        if (block.timestamp >= closedAt) {
            revert ChallengeWindowClosed(node, epoch, closedAt);
        }
        if (r.voided) {
            revert ReportVoided(node, epoch);
        }
        if (r.challenged) {
            revert ReportUnderChallenge(node, epoch);
        }
        if (r.challenger != address(0)) {
            revert ReportAlreadyChallenged(node, epoch, r.challenger);
        }
        // Votes the second before posting: tokens acquired after the report was posted never count.
        uint256 votes = keeperToken.getPastVotes(msg.sender, uint256(r.postedAt) - 1);
        if (votes < challengeThreshold) {
            revert InsufficientKeeperVotes(msg.sender, votes, challengeThreshold);
        }
        r.challenged = true;
        r.challenger = msg.sender;
        r.challengedAt = uint48(block.timestamp);
        emit ReportChallenged(node, epoch, msg.sender, reason);
    }

    /**
     * @notice Claim the caller's EARNED record of a report: its units become the caller's credits.
     * @param index The record's position among the report's leaves.
     * @param proof The RFC 9162 audit path.
     */
    function claim(address node, uint256 epoch, uint256 units, uint256 index, bytes32[] calldata proof)
        external
    {
        Report storage r = _settle(node, epoch, EARNED, msg.sender, units, index, proof);
        uint256 claimable = uint256(r.earnedUnits) - uint256(r.claimedUnits);
        if (units > claimable) {
            revert ClaimOverCap(node, epoch, claimable, units);
        }
        r.claimedUnits += uint128(units);
        earned[msg.sender] += units;
        emit CreditsClaimed(node, epoch, msg.sender, units);
    }

    /**
     * @notice Apply a SPENT record of a report to `client`'s balance (anyone may; the node does), with the
     * client's consent: its EIP-712 signature of SpendAuthorization(client, node, epoch, authorized), `units`
     * at most `authorized`. A contract account consents through ERC-1271; naming the client in the signed
     * struct keeps a wallet owner's signature for one account from serving another.
     * @param authorized The units the client's authorization allows (at least `units`).
     * @param signature The client's signature of the authorization.
     */
    function applySpent(
        address node,
        uint256 epoch,
        address client,
        uint256 units,
        uint256 index,
        bytes32[] calldata proof,
        uint256 authorized,
        bytes calldata signature
    ) external {
        if (units > authorized) {
            revert SpendOverAuthorization(client, units, authorized);
        }
        bytes32 digest = spendAuthorizationDigest(client, node, epoch, authorized);
        if (!SignatureChecker.isValidSignatureNow(client, digest, signature)) {
            revert InvalidSpendAuthorization(node, epoch, client, authorized);
        }
        _settle(node, epoch, SPENT, client, units, index, proof);
        spent[client] += units;
        emit CreditsSpent(node, epoch, client, units);
    }

    // ---- views

    /// @notice Whether `node` may post reports (and its reports of this registration be claimed).
    function registered(address node) external view returns (bool) {
        return _registrations[node].active;
    }

    /// @notice The first epoch `node` may report: the one it was (last) registered in.
    function firstEpoch(address node) external view returns (uint256) {
        return _registrations[node].firstEpoch;
    }

    /// @notice `node`'s registration: whether it is active, its number, its first reportable epoch.
    function registration(address node) external view returns (Registration memory) {
        return _registrations[node];
    }

    /// @notice Credits `account` may spend: claimed minus spent, zero while spent exceeds claimed.
    function balanceOf(address account) external view returns (uint256) {
        uint256 e = earned[account];
        uint256 s = spent[account];
        return e > s ? e - s : 0;
    }

    /// @notice The report a node posted for an epoch (all zero when none).
    function report(address node, uint256 epoch) external view returns (Report memory) {
        return _reports[node][epoch];
    }

    /// @notice Whether a record of a report was claimed or applied.
    function settled(address node, uint256 epoch, uint8 kind, address account) external view returns (bool) {
        return _settled[_recordKey(node, epoch, kind, account)];
    }

    /// @notice The EIP-712 digest `client` signs to let `node` charge it up to `units` credits in `epoch`.
    function spendAuthorizationDigest(address client, address node, uint256 epoch, uint256 units)
        public
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(keccak256(abi.encode(SPEND_AUTHORIZATION_TYPEHASH, client, node, epoch, units)));
    }

    /// @notice The leaf bytes of a record.
    function leaf(uint8 kind, address account, uint256 units) public pure returns (bytes memory) {
        return abi.encodePacked(kind, account, units);
    }

    /// @notice The epoch a timestamp falls in.
    function epochOf(uint256 timestamp) external view returns (uint256) {
        return timestamp / epochLength;
    }

    // ---- internals

    function _existing(address node, uint256 epoch) private view returns (Report storage r) {
        r = _reports[node][epoch];
        if (r.postedAt == 0) {
            revert ReportNotFound(node, epoch);
        }
    }

    /// @dev The checks every claim and application shares; marks the record settled.
    function _settle(
        address node,
        uint256 epoch,
        uint8 kind,
        address account,
        uint256 units,
        uint256 index,
        bytes32[] calldata proof
    ) private returns (Report storage r) {
        r = _existing(node, epoch);
        Registration storage reg = _registrations[node];
        if (!reg.active) {
            revert NodeNotRegistered(node);
        }
        if (r.registration != reg.number) {
            revert ReportOfEndedRegistration(node, epoch, r.registration, reg.number);
        }
        if (r.voided) {
            revert ReportVoided(node, epoch);
        }
        if (r.challenged) {
            revert ReportUnderChallenge(node, epoch);
        }
        uint256 claimableAt = uint256(r.postedAt) + challengeWindow;
        if (block.timestamp < claimableAt) {
            revert ChallengeWindowOpen(node, epoch, claimableAt);
        }
        bytes32 key = _recordKey(node, epoch, kind, account);
        if (_settled[key]) {
            revert AlreadySettled(node, epoch, kind, account);
        }
        if (!RFC9162.verify(RFC9162.leafHash(leaf(kind, account, units)), index, r.treeSize, proof, r.root)) {
            revert InvalidProof(node, epoch, kind, account, units);
        }
        _settled[key] = true;
    }

    function _recordKey(address node, uint256 epoch, uint8 kind, address account) private pure returns (bytes32) {
        return keccak256(abi.encode(node, epoch, kind, account));
    }
}
