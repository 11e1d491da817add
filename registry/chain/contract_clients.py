"""Typed clients of the deployed contracts: ExperienceRegistry (propose, vote, execute, read proposals,
tallies, the library history and events), KeeperToken and the AllowlistVoterRegistry."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from eth_typing import ChecksumAddress
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError
from web3.types import BlockIdentifier

from zoo.contracts.build import Artifacts
from zoo.registry.chain.abi_codec import _TOLERANT_CODEC
from zoo.registry.chain.chain_errors import _REVERT_SOURCES, _as_revert, _default_error_table, _error_table
from zoo.registry.chain.deploy import _artifacts_or_default
from zoo.registry.chain.ids import (
    call_hash,
    call_proposal_id,
    format_proposal_id,
    parse_proposal_id,
    proposal_id,
    to_bytes32,
)
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
from zoo.registry.chain.sender import TransactionSigner, _Sender


class _ContractClient:
    _artifact_name = ""

    def __init__(
        self,
        w3: Web3,
        address: str,
        account: TransactionSigner | None = None,
        *,
        artifacts: Artifacts | None = None,
    ) -> None:
        w3.codec = _TOLERANT_CODEC  # decodes every valid value exactly as web3's own codec does
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self._artifacts = _artifacts_or_default(artifacts)
        abi = self._artifacts.get(self._artifact_name).abi
        self.contract: Contract = w3.eth.contract(address=self.address, abi=abi)
        errors = (
            _default_error_table()
            if artifacts is None
            else _error_table(self._artifacts.get(n).abi for n in _REVERT_SOURCES)
        )
        self._sender = _Sender(w3, account, errors)

    def _transact(self, function: str, *args: Any, value: int = 0) -> TxResult:
        return self._sender.send(self.address, self.contract.encode_abi(function, args=list(args)), value)

    def _call(self, function: str, *args: Any, block: BlockIdentifier = "latest") -> Any:
        try:
            return getattr(self.contract.functions, function)(*args).call(block_identifier=block)
        except ContractLogicError as exc:
            raise _as_revert(exc, self._sender.errors) from None

    def _require_account(self) -> TransactionSigner:
        return self._sender.require_account()


class TokenClient(_ContractClient):
    """KeeperToken: balances, votes, delegation, transfers."""

    _artifact_name = "KeeperToken"

    def balance(self, owner: str) -> int:
        """Token balance of `owner` (smallest unit)."""
        return int(self._call("balanceOf", Web3.to_checksum_address(owner)))

    def total_supply(self) -> int:
        """Total supply (smallest unit)."""
        return int(self._call("totalSupply"))

    def get_votes(self, account: str) -> int:
        """Current votes delegated to `account`."""
        return int(self._call("getVotes", Web3.to_checksum_address(account)))

    def get_past_votes(self, account: str, timepoint: int) -> int:
        """Votes delegated to `account` at timestamp `timepoint` (must be in the past)."""
        return int(self._call("getPastVotes", Web3.to_checksum_address(account), timepoint))

    def delegates(self, account: str) -> ChecksumAddress | None:
        """Whom `account` delegates its votes to (None: nobody, its balance does not vote)."""
        delegatee = self._call("delegates", Web3.to_checksum_address(account))
        return None if int(delegatee, 16) == 0 else Web3.to_checksum_address(delegatee)

    def delegate(self, delegatee: str | None = None) -> TxResult:
        """Delegate the signer's votes to `delegatee` (default: itself, which makes its balance vote)."""
        target = delegatee or self._require_account().address
        return self._transact("delegate", Web3.to_checksum_address(target))

    def transfer(self, to: str, amount: int) -> TxResult:
        """Transfer `amount` (smallest unit) from the signer to `to`."""
        return self._transact("transfer", Web3.to_checksum_address(to), int(amount))


class RegistryClient(_ContractClient):
    """ExperienceRegistry: propose, vote, execute, and read proposals, tallies and the library history."""

    _artifact_name = "ExperienceRegistry"

    # ---- transactions

    def propose(
        self,
        root: bytes | str,
        cid: str,
        *,
        tree_size: int,
        parent_version: int | None = None,
        salt: bytes | str | None = None,
    ) -> ProposalTx:
        """Propose library `root` over `tree_size` records at `cid` as the version after `parent_version`
        (default: the current version). `salt` (32 bytes, default random) tells apart proposals of the same
        content by the same proposer; the returned result carries the new proposal's id."""
        account = self._require_account()
        parent = self.current_version() if parent_version is None else int(parent_version)
        salt_bytes = os.urandom(32) if salt is None else to_bytes32(salt)
        key = to_bytes32(root)
        result = self._transact("propose", key, int(tree_size), cid, parent, salt_bytes)
        pid = proposal_id(key, tree_size, cid, parent, account.address, salt_bytes)
        return ProposalTx(**{f.name: getattr(result, f.name) for f in fields(TxResult)}, proposal_id=pid)

    def propose_call(self, target: str, data: bytes, *, salt: bytes | str | None = None) -> ProposalTx:
        """Propose that the registry call `target` with `data` (selector and arguments) once the vote
        passes: how the DAO acts on the contracts it governs. `salt` as for `propose`."""
        account = self._require_account()
        salt_bytes = os.urandom(32) if salt is None else to_bytes32(salt)
        address = Web3.to_checksum_address(target)
        result = self._transact("proposeCall", address, bytes(data), salt_bytes)
        pid = call_proposal_id(address, bytes(data), account.address, salt_bytes)
        return ProposalTx(**{f.name: getattr(result, f.name) for f in fields(TxResult)}, proposal_id=pid)

    def propose_cancel(self, proposal: int | str, *, salt: bytes | str | None = None) -> ProposalTx:
        """Propose that the DAO cancel `proposal`: a call proposal of the registry's own `cancel`, the only
        call it may make on itself. Once passed and executed it cancels the proposal in any state before its
        execution (a passed one included). `salt` as for `propose`."""
        return self.propose_call(self.address, self.cancel_call(proposal), salt=salt)

    def cancel_call(self, proposal: int | str) -> bytes:
        """The calldata of `cancel(proposal)` on this registry (what `propose_cancel` proposes)."""
        return bytes.fromhex(
            self.contract.encode_abi("cancel", args=[parse_proposal_id(proposal)]).removeprefix("0x")
        )

    def propose_base_model(
        self, model_sha256: str, *, approve: bool = True, salt: bytes | str | None = None
    ) -> ProposalTx:
        """Propose that the DAO approve (or, `approve` False, withdraw) the model weights hashed
        `model_sha256` (64 hex digits) as a base model libraries may name: a call proposal of the registry's
        own `setBaseModel`. `salt` as for `propose`."""
        return self.propose_call(self.address, self.base_model_call(model_sha256, approve), salt=salt)

    def base_model_call(self, model_sha256: str, approve: bool = True) -> bytes:
        """The calldata of `setBaseModel(model_sha256, approve)` on this registry."""
        data = self.contract.encode_abi("setBaseModel", args=[to_bytes32(model_sha256), bool(approve)])
        return bytes.fromhex(data.removeprefix("0x"))

    def base_models(self) -> list[str]:
        """The SHA-256s (64 lower-case hex digits) of the base models the DAO approved, sorted."""
        return sorted(bytes(h).hex() for h in self._call("baseModels"))

    def base_model_approved(self, model_sha256: str) -> bool:
        return bool(self._call("baseModelApproved", to_bytes32(model_sha256)))

    def cancel(self, proposal: int | str) -> TxResult:
        """Cancel the signer's own proposal while it is pending or active (the DAO cancels others, and passed
        ones, through `propose_cancel`)."""
        return self._transact("cancel", parse_proposal_id(proposal))

    def vote(self, proposal: int | str, support: bool) -> TxResult:
        """Vote for (`support` True) or against the proposal."""
        return self._transact("vote", parse_proposal_id(proposal), bool(support))

    def execute(self, proposal: int | str) -> TxResult:
        """Execute the passed proposal: it becomes the next library version, or its call is made."""
        return self._transact("execute", parse_proposal_id(proposal))

    # ---- views

    def params(self) -> RegistryParams:
        """The registry's governance parameters."""
        registry = self._call("voterRegistry")
        return RegistryParams(
            token=Web3.to_checksum_address(self._call("token")),
            voting_period=int(self._call("votingPeriod")),
            execution_delay=int(self._call("executionDelay")),
            grace_period=int(self._call("gracePeriod")),
            proposal_threshold=int(self._call("proposalThreshold")),
            quorum=int(self._call("quorum")),
            voter_registry=None if int(registry, 16) == 0 else Web3.to_checksum_address(registry),
            max_cid_length=int(self._call("MAX_CID_LENGTH")),
        )

    def token(self) -> TokenClient:
        """A client for the governance token, signing with the same account."""
        return TokenClient(self.w3, self._call("token"), self.account, artifacts=self._artifacts)

    def current(self) -> LibraryVersion:
        """The current library version (version 0, root zero, before the first execution)."""
        version, root, size, cid, timestamp = self._call("currentLibrary")
        return LibraryVersion(int(version), bytes(root), int(size), cid, int(timestamp))

    def current_root(self) -> bytes:
        """Merkle root of the current library (32 zero bytes before the first execution)."""
        return bytes(self._call("currentRoot"))

    def current_cid(self) -> str:
        """CID of the current library ("" before the first execution)."""
        return str(self._call("currentCID"))

    def current_version(self) -> int:
        """Current library version number."""
        return int(self._call("currentVersion"))

    def version_at(self, version: int) -> LibraryVersion:
        """Library version `version` of the history."""
        root, size, cid, timestamp = self._call("versionAt", version)
        return LibraryVersion(version, bytes(root), int(size), cid, int(timestamp))

    def history(self, *, include_genesis: bool = False) -> list[LibraryVersion]:
        """All library versions, oldest first (version 1 on, or 0 on with include_genesis)."""
        latest = self.current_version()
        first = 0 if include_genesis else 1
        return [self.version_at(v) for v in range(first, latest + 1)]

    def hash_proposal(
        self,
        root: bytes | str,
        tree_size: int,
        cid: str,
        parent_version: int,
        proposer: str,
        salt: bytes | str,
    ) -> int:
        """The contract's own proposal id for these fields (see `proposal_id` for the local computation)."""
        return int(
            self._call(
                "hashProposal",
                to_bytes32(root),
                int(tree_size),
                cid,
                int(parent_version),
                Web3.to_checksum_address(proposer),
                to_bytes32(salt),
            )
        )

    def proposal(self, proposal: int | str) -> Proposal | None:
        """The proposal with this id, or None when there is none."""
        pid = parse_proposal_id(proposal)
        # Struct order: proposer, snapshot, voteStart, voteEnd, executed, canceled, parentVersion, treeSize,
        # root, forWeight, againstWeight, cid.
        proposer, snapshot, start, end, executed, canceled, parent, size, root, for_w, against_w, cid = (
            self._call("proposal", pid)
        )
        if start == 0:
            return None
        return Proposal(
            id=pid,
            root=bytes(root),
            tree_size=int(size),
            proposer=Web3.to_checksum_address(proposer),
            parent_version=int(parent),
            cid=cid,
            snapshot=int(snapshot),
            vote_start=int(start),
            vote_end=int(end),
            executed=bool(executed),
            for_weight=int(for_w),
            against_weight=int(against_w),
            canceled=bool(canceled),
        )

    def proposed_call(self, proposal: int | str) -> tuple[ChecksumAddress, bytes] | None:
        """(target, calldata) of a call proposal; None for any other id."""
        target, data = self._call("proposedCall", parse_proposal_id(proposal))
        if int(target, 16) == 0:
            return None
        return Web3.to_checksum_address(target), bytes(data)

    def call_binding(self, proposal: int | str) -> CallBinding | None:
        """What a call proposal is bound to (its call's executions when proposed and now; `stale` once an
        identical call was executed since); None for any other id."""
        if self.proposed_call(proposal) is None:
            return None
        key, at_proposal, now = self._call("callBinding", parse_proposal_id(proposal))
        return CallBinding(bytes(key), int(at_proposal), int(now))

    def hash_call(self, target: str, data: bytes) -> bytes:
        """The contract's hashCall (see `call_hash` for the local computation)."""
        return bytes(self._call("hashCall", Web3.to_checksum_address(target), bytes(data)))

    def call_executions(self, target: str, data: bytes) -> int:
        """How many times the call `target.call(data)` was executed through call proposals."""
        return int(self._call("callExecutions", call_hash(target, data)))

    def state(self, proposal: int | str) -> ProposalState:
        """Lifecycle state of the proposal."""
        return ProposalState(int(self._call("state", parse_proposal_id(proposal))))

    def tallies(self, proposal: int | str) -> Tallies:
        """Weight cast for and against the proposal (zeros when there is none)."""
        p = self.proposal(proposal)
        return Tallies(0, 0) if p is None else Tallies(p.for_weight, p.against_weight)

    def has_voted(self, proposal: int | str, voter: str) -> bool:
        """Whether `voter` voted on the proposal."""
        return bool(self._call("hasVoted", parse_proposal_id(proposal), Web3.to_checksum_address(voter)))

    def voting_weight(self, proposal: int | str, voter: str) -> int:
        """The quadratic weight `voter` has on the proposal (its snapshot votes' square root)."""
        return int(self._call("votingWeight", parse_proposal_id(proposal), Web3.to_checksum_address(voter)))

    def quadratic_weight(self, votes: int) -> int:
        """The contract's integer square root of `votes` (floor)."""
        return int(self._call("quadraticWeight", int(votes)))

    def resolve_proposal(self, text: str, from_block: BlockIdentifier = 0) -> int:
        """The id of the proposal that `text` names: a full id, or an unambiguous prefix of one (0x and at
        least 4 hex digits) among the registry's ProposalCreated events. ValueError says why not."""
        raw = text.strip().lower()
        digits = raw.removeprefix("0x")
        if not digits or any(c not in "0123456789abcdef" for c in digits) or len(digits) > 64:
            raise ValueError(f"not a proposal id or id prefix: {text!r} (0x and hex digits)")
        if len(digits) == 64:
            return int(digits, 16)
        if len(digits) < 4:
            raise ValueError(f"proposal id prefix {text!r} is too short: give at least 4 hex digits")
        ids = [e.proposal_id for e in self.proposal_created_events(from_block)]
        ids += [c.proposal_id for c in self.call_proposed_events(from_block)]
        matches = sorted({i for i in ids if format_proposal_id(i)[2:].startswith(digits)})
        if not matches:
            raise ValueError(f"no proposal id starts with 0x{digits}")
        if len(matches) > 1:
            shown = ", ".join(format_proposal_id(m)[:18] + "…" for m in matches[:5])
            raise ValueError(f"0x{digits} is ambiguous: {len(matches)} proposals match ({shown})")
        return matches[0]

    def verify_inclusion(
        self, leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes | str
    ) -> bool:
        """On-chain RFC 9162 inclusion check of `leaf_hash` at `index` of a `tree_size`-leaf tree."""
        return bool(
            self._call(
                "verifyInclusion",
                to_bytes32(leaf_hash),
                index,
                tree_size,
                [to_bytes32(p) for p in proof],
                to_bytes32(root),
            )
        )

    def verify_inclusion_in_version(
        self, version: int, leaf: bytes, index: int, proof: Sequence[bytes]
    ) -> bool:
        """On-chain check that record `leaf` (its canonical bytes, hashed by the contract) is leaf `index` of
        library version `version`, whose tree size the contract stored."""
        return bool(
            self._call(
                "verifyInclusionInVersion", version, bytes(leaf), index, [to_bytes32(p) for p in proof]
            )
        )

    # ---- events

    def _logs(
        self, event: str, from_block: BlockIdentifier, to_block: BlockIdentifier, filters: Mapping[str, Any]
    ) -> list[Any]:
        getter: Callable[..., Iterable[Any]] = getattr(self.contract.events, event)().get_logs
        logs = getter(argument_filters=dict(filters) or None, from_block=from_block, to_block=to_block)
        return sorted(logs, key=lambda e: (e["blockNumber"], e["logIndex"]))

    def library_updated_events(
        self, from_block: BlockIdentifier = 0, to_block: BlockIdentifier = "latest"
    ) -> list[LibraryUpdate]:
        """LibraryUpdated events in the block range, oldest first."""
        return [
            LibraryUpdate(
                version=int(e["args"]["version"]),
                root=bytes(e["args"]["root"]),
                tree_size=int(e["args"]["treeSize"]),
                cid=e["args"]["cid"],
                block_number=int(e["blockNumber"]),
                tx_hash="0x" + bytes(e["transactionHash"]).hex(),
                log_index=int(e["logIndex"]),
            )
            for e in self._logs("LibraryUpdated", from_block, to_block, {})
        ]

    def proposal_created_events(
        self, from_block: BlockIdentifier = 0, to_block: BlockIdentifier = "latest"
    ) -> list[ProposalCreatedEvent]:
        """ProposalCreated events in the block range, oldest first."""
        return [
            ProposalCreatedEvent(
                proposal_id=int(e["args"]["proposalId"]),
                root=bytes(e["args"]["root"]),
                proposer=Web3.to_checksum_address(e["args"]["proposer"]),
                tree_size=int(e["args"]["treeSize"]),
                cid=e["args"]["cid"],
                parent_version=int(e["args"]["parentVersion"]),
                salt=bytes(e["args"]["salt"]),
                snapshot=int(e["args"]["snapshot"]),
                vote_start=int(e["args"]["voteStart"]),
                vote_end=int(e["args"]["voteEnd"]),
                block_number=int(e["blockNumber"]),
                tx_hash="0x" + bytes(e["transactionHash"]).hex(),
            )
            for e in self._logs("ProposalCreated", from_block, to_block, {})
        ]

    def call_proposed_events(
        self, from_block: BlockIdentifier = 0, to_block: BlockIdentifier = "latest"
    ) -> list[ProposedCall]:
        """CallProposed events in the block range, oldest first."""
        return [
            ProposedCall(
                proposal_id=int(e["args"]["proposalId"]),
                target=Web3.to_checksum_address(e["args"]["target"]),
                data=bytes(e["args"]["data"]),
                proposer=Web3.to_checksum_address(e["args"]["proposer"]),
                vote_end=int(e["args"]["voteEnd"]),
                block_number=int(e["blockNumber"]),
            )
            for e in self._logs("CallProposed", from_block, to_block, {})
        ]


class AllowlistClient(_ContractClient):
    """AllowlistVoterRegistry, the reference voter registry: who may vote, changed by its owner."""

    _artifact_name = "AllowlistVoterRegistry"

    def is_registered(self, voter: str) -> bool:
        """Whether `voter` is registered now."""
        return bool(self._call("isRegistered", Web3.to_checksum_address(voter)))

    def is_registered_at(self, voter: str, timepoint: int) -> bool:
        """Whether `voter` was registered at the end of second `timepoint` (which must be in the past)."""
        return bool(self._call("isRegisteredAt", Web3.to_checksum_address(voter), int(timepoint)))

    def owner(self) -> ChecksumAddress:
        """The account allowed to change the allowlist."""
        return Web3.to_checksum_address(self._call("owner"))

    def set_registered(self, voters: Iterable[str], registered: bool = True) -> TxResult:
        """Register (or with registered=False, deregister) `voters`; only the owner may do this."""
        addresses = [Web3.to_checksum_address(v) for v in voters]
        return self._transact("setRegistered", addresses, bool(registered))
