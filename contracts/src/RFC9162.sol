// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @title RFC9162
 * @notice Merkle inclusion proofs of RFC 9162 (Certificate Transparency v2), section 2.1.3.2, over SHA-256:
 * a leaf hashes as SHA-256(0x00 || leaf) and an interior node as SHA-256(0x01 || left || right). The distinct
 * prefixes keep a leaf from being passed off as an interior node (second-preimage attack), and the tree
 * size takes part in verification, so a proof for one size never verifies against a tree of another shape.
 */
library RFC9162 {
    /**
     * @notice The RFC 9162 leaf hash of `leaf`.
     * @param leaf The leaf's bytes.
     * @return SHA-256(0x00 || leaf).
     */
    function leafHash(bytes memory leaf) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x00), leaf));
    }

    /**
     * @notice The RFC 9162 interior node hash.
     * @param left The left child's hash.
     * @param right The right child's hash.
     * @return SHA-256(0x01 || left || right).
     */
    function nodeHash(bytes32 left, bytes32 right) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x01), left, right));
    }

    /**
     * @notice Verifies that `leaf` (a leaf hash) sits at `index` of a tree of `treeSize` leaves with root
     * `root`, given the audit path `proof` (sibling hashes from the leaf upwards).
     * @dev Follows RFC 9162 section 2.1.3.2 step by step; any failed step returns false (never reverts), and
     * a path of the wrong length for the (index, treeSize) pair is rejected by the final `sn == 0` check.
     * @param leaf The RFC 9162 leaf hash.
     * @param index The leaf's zero-based position.
     * @param treeSize The number of leaves in the tree.
     * @param proof The audit path.
     * @param root The expected tree root.
     * @return True when the proof is valid.
     */
    function verify(bytes32 leaf, uint256 index, uint256 treeSize, bytes32[] memory proof, bytes32 root)
        internal
        pure
        returns (bool)
    {
        if (index >= treeSize) {
            return false;
        }
        uint256 fn = index;
        uint256 sn = treeSize - 1;
        bytes32 r = leaf;
        for (uint256 i = 0; i < proof.length; ++i) {
            if (sn == 0) {
                return false;
            }
            bytes32 p = proof[i];
            if (fn & 1 == 1 || fn == sn) {
                r = nodeHash(p, r);
                // A right-edge node with no sibling at this level is carried up unchanged.
                while (fn & 1 == 0 && fn != 0) {
                    fn >>= 1;
                    sn >>= 1;
                }
            } else {
                r = nodeHash(r, p);
            }
            fn >>= 1;
            sn >>= 1;
        }
        return sn == 0 && r == root;
    }
}
