// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {IVoterRegistry} from "./IVoterRegistry.sol";

/**
 * @title AllowlistVoterRegistry
 * @notice Reference {IVoterRegistry}: an allowlist kept by one owner (for instance a multisig that admits one
 * address per verified person). It makes quadratic voting Sybil-resistant exactly as far as the owner is
 * trustworthy and careful about admitting a person only once.
 */
contract AllowlistVoterRegistry is IVoterRegistry, Ownable2Step {
    mapping(address voter => bool) private _registered;

    /**
     * @notice `voter` was added to (`registered` true) or removed from the allowlist.
     * @param voter The account whose registration changed.
     * @param registered Its new registration status.
     */
    event VoterRegistrationChanged(address indexed voter, bool registered);

    /**
     * @notice Creates the allowlist, owned by `initialOwner` and holding `initialVoters`.
     * @param initialOwner The account allowed to change the allowlist (ownership moves in two steps).
     * @param initialVoters Accounts registered from the start.
     */
    constructor(address initialOwner, address[] memory initialVoters) Ownable(initialOwner) {
        for (uint256 i = 0; i < initialVoters.length; ++i) {
            _setRegistered(initialVoters[i], true);
        }
    }

    /// @inheritdoc IVoterRegistry
    function isRegistered(address voter) external view returns (bool) {
        return _registered[voter];
    }

    /**
     * @notice Adds or removes voters. Only the owner may call it.
     * @param voters The accounts to change.
     * @param registered True to register them, false to deregister them.
     */
    function setRegistered(address[] calldata voters, bool registered) external onlyOwner {
        for (uint256 i = 0; i < voters.length; ++i) {
            _setRegistered(voters[i], registered);
        }
    }

    function _setRegistered(address voter, bool registered) private {
        if (_registered[voter] != registered) {
            _registered[voter] = registered;
            emit VoterRegistrationChanged(voter, registered);
        }
    }
}
