// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {Checkpoints} from "@openzeppelin/contracts/utils/structs/Checkpoints.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Time} from "@openzeppelin/contracts/utils/types/Time.sol";
import {IVoterRegistry} from "./IVoterRegistry.sol";

/**
 * @title AllowlistVoterRegistry
 * @notice Reference {IVoterRegistry}: an allowlist kept by one owner (for instance a multisig that admits one
 * address per verified person). It makes quadratic voting Sybil-resistant exactly as far as the owner is
 * trustworthy and careful about admitting a person only once.
 * @dev Every registration change is checkpointed on the block-timestamp clock (OpenZeppelin {Checkpoints},
 * as ERC20Votes does for votes), so {isRegisteredAt} answers for any past second and a change the owner makes
 * while a vote is open has no effect on that vote.
 */
contract AllowlistVoterRegistry is IVoterRegistry, Ownable2Step {
    using Checkpoints for Checkpoints.Trace208;

    mapping(address voter => Checkpoints.Trace208) private _registration;

    /**
     * @notice `voter` was added to (`registered` true) or removed from the allowlist.
     * @param voter The account whose registration changed.
     * @param registered Its new registration status.
     */
    event VoterRegistrationChanged(address indexed voter, bool registered);

    /**
     * @notice A lookup at `timepoint` asked about a second that has not ended yet.
     * @param timepoint The timepoint asked for.
     * @param clock The current timepoint.
     */
    error RegistryFutureLookup(uint256 timepoint, uint48 clock);

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
        return _registration[voter].latest() != 0;
    }

    /// @inheritdoc IVoterRegistry
    function isRegisteredAt(address voter, uint256 timepoint) external view returns (bool) {
        uint48 now_ = clock();
        if (timepoint >= now_) {
            revert RegistryFutureLookup(timepoint, now_);
        }
        return _registration[voter].upperLookupRecent(SafeCast.toUint48(timepoint)) != 0;
    }

    /**
     * @notice Adds or removes voters. Only the owner may call it. Takes effect for proposals whose snapshot
     * is at or after this block's second.
     * @param voters The accounts to change.
     * @param registered True to register them, false to deregister them.
     */
    function setRegistered(address[] calldata voters, bool registered) external onlyOwner {
        for (uint256 i = 0; i < voters.length; ++i) {
            _setRegistered(voters[i], registered);
        }
    }

    /**
     * @notice The ERC-6372 clock: the current block timestamp.
     * @return The current timepoint, in seconds since the Unix epoch.
     */
    function clock() public view returns (uint48) {
        return Time.timestamp();
    }

    /**
     * @notice Machine-readable description of the ERC-6372 clock.
     * @return The string "mode=timestamp".
     */
    // solhint-disable-next-line func-name-mixedcase
    function CLOCK_MODE() external pure returns (string memory) {
        return "mode=timestamp";
    }

    function _setRegistered(address voter, bool registered) private {
        Checkpoints.Trace208 storage trace = _registration[voter];
        if ((trace.latest() != 0) != registered) {
            trace.push(clock(), registered ? 1 : 0);
            emit VoterRegistrationChanged(voter, registered);
        }
    }
}
