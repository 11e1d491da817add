// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {ERC20Votes} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Votes.sol";
import {Nonces} from "@openzeppelin/contracts/utils/Nonces.sol";
import {Time} from "@openzeppelin/contracts/utils/types/Time.sol";

/**
 * @title KeeperToken
 * @notice KEEPER, the governance token of the Zoo experience-library DAO. Voting power is tracked with
 * ERC20Votes checkpoints on an ERC-6372 timestamp clock, so governance periods are expressed in seconds and
 * {ExperienceRegistry} can read past balances at a timestamp snapshot.
 * @dev The whole supply is minted once, in the constructor; there is no owner and no later minting.
 * As with every ERC20Votes token, balances only count as votes once delegated (to oneself or to someone
 * else). The constructor self-delegates the initial holders so a freshly deployed token can govern at once;
 * anyone who receives tokens later must call {delegate} before a snapshot for them to count.
 */
contract KeeperToken is ERC20, ERC20Permit, ERC20Votes {
    /**
     * @notice `holders` and `amounts` passed to the constructor have different lengths.
     * @param holders Number of holders given.
     * @param amounts Number of amounts given.
     */
    error KeeperTokenLengthMismatch(uint256 holders, uint256 amounts);

    /**
     * @notice Mints the entire supply and self-delegates every initial holder.
     * @param holders Accounts receiving the initial supply (duplicates are allowed and simply add up).
     * @param amounts Token amounts (in the smallest unit, 18 decimals) minted to `holders[i]`.
     */
    constructor(address[] memory holders, uint256[] memory amounts) ERC20("Keeper", "KEEPER") ERC20Permit("Keeper") {
        if (holders.length != amounts.length) {
            revert KeeperTokenLengthMismatch(holders.length, amounts.length);
        }
        for (uint256 i = 0; i < holders.length; ++i) {
            // Delegating before minting makes the mint land directly in the holder's vote checkpoints.
            if (delegates(holders[i]) == address(0)) {
                _delegate(holders[i], holders[i]);
            }
            _mint(holders[i], amounts[i]);
        }
    }

    /**
     * @notice The ERC-6372 clock: the current block timestamp.
     * @return The current timepoint, in seconds since the Unix epoch.
     */
    function clock() public view override returns (uint48) {
        return Time.timestamp();
    }

    /**
     * @notice Machine-readable description of the ERC-6372 clock.
     * @return The string "mode=timestamp".
     */
    // solhint-disable-next-line func-name-mixedcase
    function CLOCK_MODE() public pure override returns (string memory) {
        return "mode=timestamp";
    }

    /**
     * @notice Current permit nonce of `owner` (shared by permits and delegations by signature).
     * @param owner The account whose nonce is read.
     * @return The next nonce `owner` must sign.
     */
    function nonces(address owner) public view override(ERC20Permit, Nonces) returns (uint256) {
        return super.nonces(owner);
    }

    /// @dev Balance moves must also move vote checkpoints; both parents implement `_update`.
    function _update(address from, address to, uint256 value) internal override(ERC20, ERC20Votes) {
        super._update(from, to, value);
    }
}
