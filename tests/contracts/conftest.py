"""Chain test fixtures: one anvil and one deployment per session; each test runs on an evm_snapshot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from web3 import Web3

from tests.contracts.support import (
    ALLOWLISTED,
    BELOW_THRESHOLD,
    EXECUTION_DELAY,
    GRACE_PERIOD,
    PROPOSAL_THRESHOLD,
    QUORUM,
    UNDELEGATED,
    UNDELEGATED_WEIGHT,
    VOTING_PERIOD,
    WEIGHTS,
    World,
    units_for_weight,
)
from zoo.contracts.build import Artifacts, build
from zoo.devnet.anvil import AnvilProcess
from zoo.registry.chain import deploy_allowlist, deploy_registry, deploy_token
from zoo.registry.keys import dev_account


@pytest.fixture(scope="session")
def artifacts() -> Artifacts:
    return build()


@pytest.fixture(scope="session")
def anvil() -> Iterator[AnvilProcess]:
    with AnvilProcess(die_with_parent=True).start() as process:
        yield process


@pytest.fixture(scope="session")
def deployed(anvil: AnvilProcess, artifacts: Artifacts) -> World:
    w3 = Web3(Web3.HTTPProvider(anvil.rpc_url, request_kwargs={"timeout": 30}))
    deployer = dev_account(0)
    holders = [(dev_account(i).address, units_for_weight(w)) for i, w in WEIGHTS.items()]
    holders.append((dev_account(BELOW_THRESHOLD).address, PROPOSAL_THRESHOLD - 1))
    holders.append((deployer.address, units_for_weight(UNDELEGATED_WEIGHT)))
    token = deploy_token(w3, deployer, holders, artifacts=artifacts)
    registry = deploy_registry(
        w3,
        deployer,
        token,
        voting_period=VOTING_PERIOD,
        execution_delay=EXECUTION_DELAY,
        grace_period=GRACE_PERIOD,
        proposal_threshold=PROPOSAL_THRESHOLD,
        quorum=QUORUM,
        artifacts=artifacts,
    )
    allowlist = deploy_allowlist(
        w3, deployer, [dev_account(i).address for i in ALLOWLISTED], artifacts=artifacts
    )
    gated = deploy_registry(
        w3,
        deployer,
        token,
        voting_period=VOTING_PERIOD,
        execution_delay=EXECUTION_DELAY,
        grace_period=GRACE_PERIOD,
        proposal_threshold=PROPOSAL_THRESHOLD,
        quorum=QUORUM,
        voter_registry=allowlist,
        artifacts=artifacts,
    )
    world = World(
        anvil=anvil,
        w3=w3,
        artifacts=artifacts,
        token_address=token,
        registry_address=registry,
        gated_registry_address=gated,
        allowlist_address=allowlist,
        deploy_block=w3.eth.block_number,
    )
    # dev8 holds tokens it never delegated: dev0 is minted them on top of its own share and passes them on.
    world.token(0).transfer(world.address(UNDELEGATED), units_for_weight(UNDELEGATED_WEIGHT))
    # Every snapshot taken from now on lies after all deployment-time balances.
    world.advance(60)
    return world


@pytest.fixture
def world(deployed: World) -> Iterator[World]:
    snapshot = deployed.rpc("evm_snapshot")
    try:
        yield deployed
    finally:
        # Consume any pinned next-block timestamp before reverting, so it cannot leak into the next test.
        deployed.rpc("evm_mine")
        assert deployed.rpc("evm_revert", snapshot) is True
