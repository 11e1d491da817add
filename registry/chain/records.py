"""What the registry stores and emits, as typed records: proposals, tallies, library versions, events, and
the mined transactions that made them (TxResult)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from eth_typing import ChecksumAddress
from web3.types import TxReceipt


@dataclass(frozen=True)
class TxResult:
    """A mined, successful transaction."""

    tx_hash: str
    gas_used: int
    block_number: int
    receipt: TxReceipt
    contract_address: ChecksumAddress | None = None


class ProposalState(enum.IntEnum):
    """ExperienceRegistry.ProposalState, same order."""

    UNKNOWN = 0
    PENDING = 1
    ACTIVE = 2
    DEFEATED = 3
    QUEUED = 4
    SUCCEEDED = 5
    EXECUTED = 6
    STALE = 7
    EXPIRED = 8
    CANCELED = 9


@dataclass(frozen=True)
class ProposalTx(TxResult):
    """A mined propose transaction and the id of the proposal it created."""

    proposal_id: int = 0


@dataclass(frozen=True)
class Proposal:
    """A proposal as stored by the registry."""

    id: int
    root: bytes
    tree_size: int
    proposer: ChecksumAddress
    parent_version: int
    cid: str
    snapshot: int
    vote_start: int
    vote_end: int
    executed: bool
    for_weight: int
    against_weight: int
    canceled: bool = False

    @property
    def is_call(self) -> bool:
        """A call proposal (no library: the contract stores tree size 0, which a library cannot have)."""
        return self.tree_size == 0


@dataclass(frozen=True)
class ProposedCall:
    """What a call proposal calls, and its CallProposed event's fields."""

    proposal_id: int
    target: ChecksumAddress
    data: bytes
    proposer: ChecksumAddress
    vote_end: int
    block_number: int


@dataclass(frozen=True)
class CallBinding:
    """What a call proposal is bound to: how often its call (`call_hash`, ExperienceRegistry.hashCall) had
    been executed when it was proposed, and how often now. Once they differ an identical call was executed
    since it was proposed, and the proposal is stale for good."""

    call_hash: bytes
    executions_at_proposal: int
    executions_now: int

    @property
    def stale(self) -> bool:
        """Whether an identical call was executed since the proposal was made."""
        return self.executions_now != self.executions_at_proposal


@dataclass(frozen=True)
class Tallies:
    """Quadratic weight cast on a proposal."""

    for_weight: int
    against_weight: int

    @property
    def cast(self) -> int:
        """Total weight cast, for and against."""
        return self.for_weight + self.against_weight

    def quorum_reached(self, quorum: int) -> bool:
        """Whether the support meets `quorum` (only `for` weight counts, as in the registry)."""
        return self.for_weight >= quorum

    @property
    def supermajority(self) -> bool:
        """Whether `for` is strictly more than twice `against` (the registry's passing rule)."""
        return self.for_weight > 2 * self.against_weight


@dataclass(frozen=True)
class LibraryVersion:
    """One entry of the library history (version 0 is the empty genesis)."""

    version: int
    root: bytes
    tree_size: int
    cid: str
    timestamp: int


@dataclass(frozen=True)
class LibraryUpdate:
    """A LibraryUpdated event."""

    version: int
    root: bytes
    tree_size: int
    cid: str
    block_number: int
    tx_hash: str
    log_index: int


@dataclass(frozen=True)
class ProposalCreatedEvent:
    """A ProposalCreated event."""

    proposal_id: int
    root: bytes
    proposer: ChecksumAddress
    tree_size: int
    cid: str
    parent_version: int
    salt: bytes
    snapshot: int
    vote_start: int
    vote_end: int
    block_number: int
    tx_hash: str


@dataclass(frozen=True)
class RegistryParams:
    """The registry's immutable governance parameters."""

    token: ChecksumAddress
    voting_period: int
    execution_delay: int
    grace_period: int
    proposal_threshold: int
    quorum: int
    voter_registry: ChecksumAddress | None
    max_cid_length: int
