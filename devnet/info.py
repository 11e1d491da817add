"""A running devnet as what drives it sees it: `DevnetInfo`, what devnet.json records (endpoints, contract
addresses, dev accounts, settings, the processes it started), and `warp`, which moves its chain's clock.

The manager (manager.py) writes and reads the record; the dev DAO and ledger (dev_dao.py, dev_ledger.py),
which the manager itself uses to register a node, and the tests work from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zoo.devnet.process import ProcessRecord


@dataclass
class DevnetInfo:
    rpc_url: str
    chain_id: int
    token_address: str
    registry_address: str
    ipfs_api: str
    accounts: list[dict[str, str]]
    processes: list[ProcessRecord]
    settings: dict[str, int]
    genesis: dict[str, Any] = field(default_factory=dict)
    voter_registry_address: str = ""
    ledger_address: str = ""  # the UsageLedger; its governor is the registry (DAO call proposals)
    contracts_key: str = ""  # the compiled sources' hash (zoo.contracts.build) the chain was deployed from
    deploy_block: int = 0
    started_at: float = 0.0
    ready: bool = False

    def to_json(self) -> bytes:
        data = {**self.__dict__, "processes": [p.to_dict() for p in self.processes]}
        return json.dumps(data, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> DevnetInfo:
        data = json.loads(raw)
        data["processes"] = [ProcessRecord(**p) for p in data.get("processes", [])]
        return cls(**data)


def warp(w3: Any, seconds: int) -> int:
    """Move the devnet chain's clock forward and mine a block; returns the new block timestamp."""
    w3.provider.make_request("evm_increaseTime", [int(seconds)])
    w3.provider.make_request("evm_mine", [])
    return int(w3.eth.get_block("latest")["timestamp"])
