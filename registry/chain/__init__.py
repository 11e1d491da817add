"""The on-chain contracts from Python: typed clients, deployment, revert decoding, proposal ids.

Modules: contract_clients (RegistryClient, TokenClient, AllowlistClient), ledger (LedgerClient, the
UsageLedger), deploy, records (what the registry stores and emits, and TxResult), chain_errors (ChainError,
ContractRevert and the revert decoder), sender (signing and sending), ids (proposal ids), abi_codec (decoding
that survives hostile strings); the CID rule is zoo.registry.cids, re-exported here. Imports only
zoo.contracts and zoo.registry.cids from the project.
"""

from zoo.registry.chain.chain_errors import ChainError, ContractRevert, describe_revert
from zoo.registry.chain.contract_clients import AllowlistClient, RegistryClient, TokenClient
from zoo.registry.chain.deploy import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_QUORUM,
    deploy_allowlist,
    deploy_contract,
    deploy_ledger,
    deploy_registry,
    deploy_token,
)
from zoo.registry.chain.ids import (
    call_hash,
    call_proposal_id,
    format_proposal_id,
    parse_proposal_id,
    proposal_id,
)
from zoo.registry.chain.ledger import LedgerClient, UsageReport, record_leaf
from zoo.registry.chain.records import (
    CallBinding,
    LibraryUpdate,
    LibraryVersion,
    Proposal,
    ProposalCreatedEvent,
    ProposalState,
    ProposalTx,
    ProposedCall,
    RegistryParams,
    Tallies,
    TxResult,
)
from zoo.registry.chain.sender import TransactionSigner
from zoo.registry.cids import cid_problem, shown_cid
from zoo.registry.spend import SpendAuthorization, sign_spend_authorization, spend_authorization_digest

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_QUORUM",
    "AllowlistClient",
    "CallBinding",
    "ChainError",
    "ContractRevert",
    "LedgerClient",
    "LibraryUpdate",
    "LibraryVersion",
    "Proposal",
    "ProposalCreatedEvent",
    "ProposalState",
    "ProposalTx",
    "ProposedCall",
    "RegistryClient",
    "RegistryParams",
    "SpendAuthorization",
    "Tallies",
    "TokenClient",
    "TransactionSigner",
    "TxResult",
    "UsageReport",
    "call_hash",
    "call_proposal_id",
    "cid_problem",
    "deploy_allowlist",
    "deploy_contract",
    "deploy_ledger",
    "deploy_registry",
    "deploy_token",
    "describe_revert",
    "format_proposal_id",
    "parse_proposal_id",
    "proposal_id",
    "record_leaf",
    "shown_cid",
    "sign_spend_authorization",
    "spend_authorization_digest",
]
