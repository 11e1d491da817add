// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @title IVoterRegistry
 * @notice Optional Sybil-resistance hook of {ExperienceRegistry}: when a registry is configured, only accounts
 * it reports as registered may vote. Implementations decide what "registered" means (an allowlist, a
 * proof-of-personhood attestation, a KYC oracle...). The answer must not depend on who is asking and should be
 * cheap: it is read once per vote through a static call.
 */
interface IVoterRegistry {
    /**
     * @notice Whether `voter` may vote.
     * @param voter The account casting a vote.
     * @return True when `voter` is registered.
     */
    function isRegistered(address voter) external view returns (bool);
}
