// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @notice A CID is empty.
error EmptyCID();

/**
 * @notice A CID is longer than the contract accepts.
 * @param length The CID's length in bytes.
 * @param maxLength The longest accepted.
 */
error CIDTooLong(uint256 length, uint256 maxLength);

/**
 * @notice A CID is not a CIDv0 (`Qm` + 44 base58btc characters) or a multibase CIDv1 string (a prefix `b`
 * `B` `z` `k` `K` `f` `F` or `u`, then characters of `[0-9A-Za-z_-]`).
 * @param position Zero-based index of the first byte that breaks the rule.
 */
error InvalidCID(uint256 position);

/**
 * @title CIDs
 * @notice The one rule for the IPFS CIDs the contracts store and emit. Every client decodes CIDs from events
 * and storage as text and hands them to IPFS: a CID of arbitrary bytes (non-UTF-8, control characters,
 * spaces) once stayed in the event history and broke every listing for good. Only the characters of the
 * multibase alphabets IPFS uses are accepted.
 */
library CIDs {
    /// @notice Reverts with {EmptyCID}, {CIDTooLong} or {InvalidCID} unless `cid` follows the rule.
    function check(bytes calldata cid, uint256 maxLength) internal pure {
        if (cid.length == 0) {
            revert EmptyCID();
        }
        if (cid.length > maxLength) {
            revert CIDTooLong(cid.length, maxLength);
        }
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
}
