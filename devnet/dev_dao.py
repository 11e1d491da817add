"""The devnet's DAO in one object: dev accounts 0-2, which hold enough KEEPER between them to pass any
proposal, approving library versions and making calls (registering UsageLedger nodes) the way governance
does (propose, warp into the voting window, three votes for, warp past voting and the execution delay,
execute). For tests and benchmarks, where waiting out a real voting period is not an option; the
`zoo-node dao` commands are the operator's way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from web3 import Web3

from zoo.devnet.info import DevnetInfo, warp
from zoo.registry.chain import RegistryClient, TxResult
from zoo.registry.keys import dev_account

VOTERS = 3


class DevDao:
    def __init__(self, w3: Any, registry_address: str, settings: Mapping[str, int]) -> None:
        self.w3 = w3
        self.voters = [RegistryClient(w3, registry_address, dev_account(i)) for i in range(VOTERS)]
        self.wait_s = settings["voting_period_s"] + settings["execution_delay_s"] + 1

    @classmethod
    def of(cls, info: DevnetInfo, *, timeout_s: float = 60) -> DevDao:
        """The DAO of a running devnet, over its RPC endpoint."""
        w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": timeout_s}))
        return cls(w3, info.registry_address, info.settings)

    @property
    def proposer(self) -> RegistryClient:
        return self.voters[0]

    def propose_and_pass(
        self, root: bytes | str, cid: str, *, tree_size: int, parent_version: int | None = None
    ) -> int:
        """Everything up to (not including) execute, leaving the proposal executable; returns its id."""
        proposal = self.proposer.propose(root, cid, tree_size=tree_size, parent_version=parent_version)
        return self._pass(proposal.proposal_id)

    def pass_call(self, target: str, data: bytes) -> int:
        """A call proposal, voted through and left executable; returns its id."""
        return self._pass(self.proposer.propose_call(target, data).proposal_id)

    def _pass(self, proposal: int) -> int:
        """Into the voting window, every voter for, past voting and the execution delay."""
        warp(self.w3, 1)
        for voter in self.voters:
            voter.vote(proposal, True)
        warp(self.w3, self.wait_s)
        return proposal

    def call(self, target: str, data: bytes) -> TxResult:
        """Make the registry call `target` with `data`: propose, pass and execute."""
        return self.execute(self.pass_call(target, data))

    def execute(self, proposal: int) -> TxResult:
        return self.proposer.execute(proposal)

    def approve(
        self, root: bytes | str, cid: str, *, tree_size: int, parent_version: int | None = None
    ) -> TxResult:
        """Make (root, cid) the next current version: propose, pass and execute."""
        return self.execute(
            self.propose_and_pass(root, cid, tree_size=tree_size, parent_version=parent_version)
        )
