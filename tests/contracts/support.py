"""Shared pieces of the chain tests: governance parameters, holder weights, and the World helper.

Token balances are chosen so quadratic weights are exact: a holder of (w * 10**9)**2 units (w**2 whole
tokens) votes with weight w * 10**9, written below as w "weight units" (W).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from web3 import Web3

from zoo.contracts.build import Artifacts
from zoo.devnet.anvil import AnvilProcess
from zoo.registry.chain import AllowlistClient, ContractRevert, LedgerClient, RegistryClient, TokenClient
from zoo.registry.keys import Signer, dev_account

W = 10**9  # quadratic weight of one whole token
TOKEN = 10**18
DAY = 24 * 3600
VOTING_PERIOD = 7 * DAY
EXECUTION_DELAY = DAY
GRACE_PERIOD = 2 * DAY  # how long a passed proposal stays executable
PROPOSAL_THRESHOLD = TOKEN
QUORUM = 250 * W


def units_for_weight(weight_units: int) -> int:
    """Token units whose square root is exactly weight_units * W."""
    return (weight_units * W) ** 2


# dev index -> weight in W at deployment (self-delegated by the token's constructor).
WEIGHTS = {0: 100, 1: 200, 2: 100, 3: 201, 6: 20, 7: 50, 9: 49}
BELOW_THRESHOLD = 5  # holds one unit less than the proposal threshold
UNDELEGATED = 8  # receives tokens by transfer and never delegates
UNDELEGATED_WEIGHT = 30
EMPTY = 4  # holds nothing at deployment
ALLOWLISTED = (0, 1, 2, 3)


@dataclass
class World:
    """The deployed contracts plus helpers to act as dev accounts and to move time."""

    anvil: AnvilProcess
    w3: Web3
    artifacts: Artifacts
    token_address: str
    registry_address: str
    gated_registry_address: str
    allowlist_address: str
    deploy_block: int
    _clients: dict[tuple[str, int], Any] = field(default_factory=dict)

    def account(self, index: int) -> Signer:
        return dev_account(index)

    def address(self, index: int) -> str:
        return dev_account(index).address

    def registry(self, index: int = 0) -> RegistryClient:
        return self._client("registry", index, RegistryClient, self.registry_address)

    def gated(self, index: int = 0) -> RegistryClient:
        """Client of the registry whose voters must be on the allowlist."""
        return self._client("gated", index, RegistryClient, self.gated_registry_address)

    def token(self, index: int = 0) -> TokenClient:
        return self._client("token", index, TokenClient, self.token_address)

    def allowlist(self, index: int = 0) -> AllowlistClient:
        return self._client("allowlist", index, AllowlistClient, self.allowlist_address)

    def ledger(self, address: str, index: int | None = None) -> LedgerClient:
        """Client of a UsageLedger a test module deployed; read-only without `index`."""
        account = None if index is None else dev_account(index)
        return LedgerClient(self.w3, address, account, artifacts=self.artifacts)

    def _client(self, kind: str, index: int, cls: type, address: str) -> Any:
        key = (kind, index)
        if key not in self._clients:
            self._clients[key] = cls(self.w3, address, dev_account(index), artifacts=self.artifacts)
        return self._clients[key]

    def rpc(self, method: str, *params: Any) -> Any:
        reply = self.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
        assert "error" not in reply, reply
        return reply.get("result")

    def now(self) -> int:
        """Timestamp of the latest block."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def advance(self, seconds: int) -> int:
        """Move chain time forward and mine a block; returns its timestamp."""
        self.rpc("evm_increaseTime", seconds)
        self.rpc("evm_mine")
        return self.now()

    def pin_next_block(self, timestamp: int) -> None:
        """Make the next block (and estimates run before it) carry exactly `timestamp`."""
        self.rpc("evm_setNextBlockTimestamp", timestamp)

    def block_time(self, block_number: int) -> int:
        return int(self.w3.eth.get_block(block_number)["timestamp"])


@contextmanager
def refused(error: str, match: str | None = None, **args: object) -> Iterator[None]:
    """The block must raise ContractRevert for custom error `error`, with a message containing `match`
    and these decoded argument values, when given."""
    with pytest.raises(ContractRevert) as info:
        yield
    assert info.value.error == error, str(info.value)
    if match is not None:
        assert match in str(info.value), str(info.value)
    for name, value in args.items():
        assert info.value.args_by_name[name] == value, str(info.value)


# Voters whose weight together passes a proposal: quorum and the two-thirds supermajority.
FOR = (1, 3)


def pass_ids(world: World, *ids: int) -> list[int]:
    """Vote the proposals (made in this order, the last one just now) through and wait until all are
    executable."""
    world.advance(1)
    for pid in ids:
        for voter in FOR:
            world.registry(voter).vote(pid, True)
    proposal = world.registry().proposal(ids[-1])
    assert proposal is not None
    world.advance(proposal.vote_end + EXECUTION_DELAY - world.now())
    return list(ids)


def pass_calls(world: World, target: str, *calls: bytes) -> list[int]:
    """Propose the calls, vote them through, wait until they are executable; returns the proposal ids."""
    return pass_ids(world, *(world.registry().propose_call(target, data).proposal_id for data in calls))


def pass_call(world: World, target: str, data: bytes) -> int:
    return pass_calls(world, target, data)[0]
