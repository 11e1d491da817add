// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC6372} from "@openzeppelin/contracts/interfaces/IERC6372.sol";

/**
 * @title IVoterRegistry
 * @notice Optional Sybil-resistance hook of {ExperienceRegistry}: when a registry is configured, only accounts
 * it reports as registered *at a proposal's snapshot* may vote on that proposal. Implementations decide what
 * "registered" means (an allowlist, a proof-of-personhood attestation, a KYC oracle...).
 * @dev Membership must be answerable at a past timepoint, like ERC20Votes' `getPastVotes`: a registry read at
 * vote time would let whoever controls it add or remove voters mid-vote, or move a person's registration to a
 * second address so that the person votes twice. The clock is ERC-6372 and must be the block timestamp (the
 * clock of the governance token), so a proposal's snapshot means the same instant for tokens and registry.
 */
interface IVoterRegistry is IERC6372 {
    /**
     * @notice Whether `voter` is registered now.
     * @param voter The account.
     * @return True when `voter` is registered.
     */
    function isRegistered(address voter) external view returns (bool);

    /**
     * @notice Whether `voter` was registered at the end of second `timepoint`.
     * @dev Must revert for a timepoint that is not yet in the past (`timepoint >= clock()`): its answer could
     * still change.
     * @param voter The account.
     * @param timepoint A past timestamp.
     * @return True when `voter` was registered at `timepoint`.
     */
    function isRegisteredAt(address voter, uint256 timepoint) external view returns (bool);
}
