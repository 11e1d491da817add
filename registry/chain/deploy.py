"""Deploying the compiled contracts: KeeperToken, ExperienceRegistry and the AllowlistVoterRegistry."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eth_typing import ChecksumAddress
from web3 import Web3

from zoo.contracts.build import Artifacts
from zoo.registry.chain.chain_errors import ChainError, _default_artifacts, _error_table
from zoo.registry.chain.sender import TransactionSigner, _Sender


def _artifacts_or_default(artifacts: Artifacts | None) -> Artifacts:
    return artifacts if artifacts is not None else _default_artifacts()


def deploy_contract(
    w3: Web3, account: TransactionSigner, name: str, *args: Any, artifacts: Artifacts | None = None
) -> ChecksumAddress:
    """Deploy compiled contract `name` with constructor `args`; returns its address."""
    artifacts = _artifacts_or_default(artifacts)
    artifact = artifacts.get(name)
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    data = factory.constructor(*args).data_in_transaction
    errors = _error_table(artifacts.get(n).abi for n in artifacts.names())
    result = _Sender(w3, account, errors).send(None, data)
    if result.contract_address is None:
        raise ChainError(f"deploying {name} produced no contract address (transaction {result.tx_hash})")
    return result.contract_address


def deploy_token(
    w3: Web3,
    account: TransactionSigner,
    holders: Mapping[str, int] | Sequence[tuple[str, int]],
    *,
    artifacts: Artifacts | None = None,
) -> ChecksumAddress:
    """Deploy a KeeperToken minting `holders` (address -> amount, smallest unit); returns its address.

    The initial holders are self-delegated, so their balances are votes from the deployment block on.
    """
    pairs = list(holders.items()) if isinstance(holders, Mapping) else list(holders)
    addresses = [Web3.to_checksum_address(a) for a, _ in pairs]
    amounts = [int(v) for _, v in pairs]
    return deploy_contract(w3, account, "KeeperToken", addresses, amounts, artifacts=artifacts)


# A passed proposal can be executed for two weeks (Compound's timelock grace period); the default quorum is
# the support of 10,000 whole tokens held by one address, or 100 whole tokens each from 10 addresses.
DEFAULT_GRACE_PERIOD = 14 * 24 * 3600
DEFAULT_QUORUM = 100 * 10**9


def deploy_registry(
    w3: Web3,
    account: TransactionSigner,
    token: str,
    *,
    voting_period: int = 7 * 24 * 3600,
    execution_delay: int = 24 * 3600,
    grace_period: int = DEFAULT_GRACE_PERIOD,
    proposal_threshold: int = 10**18,
    quorum: int = DEFAULT_QUORUM,
    voter_registry: str | None = None,
    artifacts: Artifacts | None = None,
) -> ChecksumAddress:
    """Deploy an ExperienceRegistry governed by `token`; returns its address.

    Periods are in seconds; `proposal_threshold` is in token votes (smallest unit); `quorum` is in quadratic
    weight units (sqrt of the smallest unit: 1 whole 18-decimal token weighs 10**9) and must not be zero.
    """
    registry_address = Web3.to_checksum_address(voter_registry) if voter_registry else "0x" + "00" * 20
    return deploy_contract(
        w3,
        account,
        "ExperienceRegistry",
        Web3.to_checksum_address(token),
        voting_period,
        execution_delay,
        grace_period,
        proposal_threshold,
        quorum,
        registry_address,
        artifacts=artifacts,
    )


def deploy_allowlist(
    w3: Web3,
    account: TransactionSigner,
    voters: Iterable[str] = (),
    *,
    owner: str | None = None,
    artifacts: Artifacts | None = None,
) -> ChecksumAddress:
    """Deploy an AllowlistVoterRegistry owned by `owner` (default: the deployer) holding `voters`."""
    return deploy_contract(
        w3,
        account,
        "AllowlistVoterRegistry",
        Web3.to_checksum_address(owner or account.address),
        [Web3.to_checksum_address(v) for v in voters],
        artifacts=artifacts,
    )


# Four weeks for the DAO to resolve a challenge: the default registry's vote (7 days) plus its execution
# delay (1 day), three times over, so that a challenge proposed late or voted down and proposed again fits.
DEFAULT_RESOLUTION_PERIOD = 28 * 24 * 3600


def deploy_ledger(
    w3: Web3,
    account: TransactionSigner,
    *,
    governor: str,
    keeper_token: str,
    epoch_length: int = 24 * 3600,
    challenge_window: int = 2 * 24 * 3600,
    max_units_per_report: int = 10**12,
    challenge_threshold: int = 10**18,
    report_window: int = 7 * 24 * 3600,
    challenge_bond: int = 10**17,
    resolution_period: int = DEFAULT_RESOLUTION_PERIOD,
    artifacts: Artifacts | None = None,
) -> ChecksumAddress:
    """Deploy a UsageLedger whose nodes `governor` registers, which accepts an epoch's report up to
    `report_window` seconds after the epoch ends, and whose reports KEEPER holders of at least
    `challenge_threshold` votes may challenge within `challenge_window` seconds by staking
    `challenge_bond` wei; a challenge the governor has not resolved `resolution_period` seconds after it
    was made lapses (bond back, report released), so make that longer than the governor's vote plus its
    execution delay. Returns its address."""
    return deploy_contract(
        w3,
        account,
        "UsageLedger",
        Web3.to_checksum_address(governor),
        Web3.to_checksum_address(keeper_token),
        epoch_length,
        challenge_window,
        max_units_per_report,
        challenge_threshold,
        report_window,
        challenge_bond,
        resolution_period,
        artifacts=artifacts,
    )
