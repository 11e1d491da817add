// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @notice A call proposal's selector is not one the DAO may call on this target: on another contract only
 * the {ILedgerGovernance} functions, on the registry itself only `cancel(uint256)` and
 * `setBaseModel(bytes32,bool)`.
 * @param target The contract the proposal would call.
 * @param selector The calldata's first four bytes.
 */
error CallNotAllowed(address target, bytes4 selector);

/**
 * @notice A call proposal's calldata is not the one encoding of its call: bytes appended or missing, or an
 * argument word outside its type (an address word with high bits set, a bool word other than 0 or 1).
 * @param target The contract the proposal would call.
 * @param data The calldata given.
 * @param canonical `abi.encodeWithSelector` of the selector and the arguments read from `data` (what to
 * propose instead, if that is the call meant).
 */
error NonCanonicalCall(address target, bytes data, bytes canonical);

/// @notice The calls a {UsageLedger}'s governor makes: what a DAO call proposal may call on another contract.
interface ILedgerGovernance {
    /// @notice Let `node` post usage reports.
    function registerNode(address node) external;

    /// @notice Stop `node` posting usage reports.
    function deregisterNode(address node) external;

    /// @notice Void a challenged report (`upheld`) or release it.
    function resolveChallenge(address node, uint256 epoch, bool upheld) external;
}

/**
 * @title DaoCalls
 * @notice Which calls a DAO call proposal may make, and the one encoding of each it accepts.
 * @dev Solidity's ABI decoder ignores bytes after a call's arguments, so `registerNode(N)` with bytes
 * appended is the same call to the target but other calldata: hashed as bytes it was another call, and two
 * passed `registerNode(N)` proposals, one padded, could both run (the second after the DAO had deregistered
 * N, with no vote). So a proposal's calldata must be exactly `abi.encodeWithSelector(selector, args...)` of
 * the arguments it holds: nothing appended, nothing missing, no argument word outside its type (which the
 * target's decoder would refuse anyway, leaving a proposal that can never run). Then the calldata, and so
 * {ExperienceRegistry-hashCall}, is one-to-one with the call. The allowed selectors make decoding possible:
 * the registry cannot know the argument types of an arbitrary function.
 */
library DaoCalls {
    /// @notice `cancel(uint256)`, one of the two calls a call proposal may make on the registry itself.
    bytes4 internal constant CANCEL = bytes4(keccak256("cancel(uint256)"));
    /// @notice `setBaseModel(bytes32,bool)`, the other: the DAO's list of approved base models.
    bytes4 internal constant SET_BASE_MODEL = bytes4(keccak256("setBaseModel(bytes32,bool)"));

    /**
     * @notice Reverts with {CallNotAllowed} unless `data` calls an allowed function (`cancel(uint256)` or
     * `setBaseModel(bytes32,bool)` when `onSelf`, an {ILedgerGovernance} function otherwise), and with
     * {NonCanonicalCall} unless it is that call's canonical encoding.
     * @param target The contract to be called (for the errors).
     * @param data The calldata, at least four bytes.
     * @param onSelf Whether `target` is the registry itself.
     */
    function requireCanonical(address target, bytes calldata data, bool onSelf) internal pure {
        bytes4 selector = bytes4(data[:4]);
        bytes memory canonical;
        if (onSelf) {
            if (selector == CANCEL) {
                canonical = abi.encodeWithSelector(selector, _word(data, 0));
            } else if (selector == SET_BASE_MODEL) {
                canonical = abi.encodeWithSelector(selector, bytes32(_word(data, 0)), _word(data, 1) != 0);
            } else {
                revert CallNotAllowed(target, selector);
            }
        } else if (
            selector == ILedgerGovernance.registerNode.selector || selector == ILedgerGovernance.deregisterNode.selector
        ) {
            canonical = abi.encodeWithSelector(selector, address(uint160(_word(data, 0))));
        } else if (selector == ILedgerGovernance.resolveChallenge.selector) {
            canonical =
                abi.encodeWithSelector(selector, address(uint160(_word(data, 0))), _word(data, 1), _word(data, 2) != 0);
        } else {
            revert CallNotAllowed(target, selector);
        }
        if (keccak256(canonical) != keccak256(data)) revert NonCanonicalCall(target, data, canonical);
    }

    /// @dev Argument word `i` of `data` (after the selector); 0 when `data` ends before it, which the length
    /// comparison then refuses.
    function _word(bytes calldata data, uint256 i) private pure returns (uint256 word) {
        uint256 start = 4 + 32 * i;
        if (data.length >= start + 32) word = uint256(bytes32(data[start:start + 32]));
    }
}
