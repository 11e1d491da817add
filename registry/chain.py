"""Typed web3 client for the on-chain experience registry (ExperienceRegistry) and its token (KeeperToken).

Transactions are signed locally and sent raw; nonce, gas and fees are filled in here so each one costs a
fixed handful of RPC calls. Every transaction is first estimated, which runs it against current state: a
revert surfaces before anything is sent, as a ContractRevert whose message is the contract's custom error
in plain English.
"""

from __future__ import annotations

import datetime
import enum
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Protocol

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_abi.codec import ABICodec
from eth_abi.decoding import StringDecoder
from eth_abi.encoding import TextStringEncoder
from eth_abi.exceptions import DecodingError
from eth_abi.registry import registry as default_registry
from eth_account.datastructures import SignedTransaction
from eth_typing import ChecksumAddress
from eth_utils import abi_to_signature, function_signature_to_4byte_selector, get_abi_input_types
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError, TimeExhausted, Web3RPCError
from web3.types import BlockIdentifier, TxParams, TxReceipt, Wei

from zoo.contracts.build import Artifacts, build

__all__ = [
    "AllowlistClient",
    "ChainError",
    "ContractRevert",
    "LibraryUpdate",
    "LibraryVersion",
    "Proposal",
    "ProposalCreatedEvent",
    "ProposalState",
    "ProposalTx",
    "RegistryClient",
    "RegistryParams",
    "Tallies",
    "TokenClient",
    "TransactionSigner",
    "TxResult",
    "cid_problem",
    "deploy_allowlist",
    "deploy_contract",
    "deploy_registry",
    "deploy_token",
    "describe_revert",
    "format_proposal_id",
    "parse_proposal_id",
    "proposal_id",
    "shown_cid",
]

# Gas limit = estimate * 5/4 + 50k. The estimate is exact only for the block it ran in; the included block
# can differ, most of all for ERC20Votes: a transfer or delegation in a new second pushes a new vote
# checkpoint (a fresh storage slot, ~22k gas each for sender and receiver) where the estimate updated one
# in place. Unused gas is not charged, so the cushion costs nothing.
_GAS_MARGIN_NUM, _GAS_MARGIN_DEN = 5, 4
_GAS_CUSHION = 50_000
_PRIORITY_FEE = 1_000_000  # wei; devnets and L2s need next to nothing, mainnet callers can pass their own
_RECEIPT_TIMEOUT = 120.0

_ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
_PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
_PANIC_CODES = {
    0x01: "assertion failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division or modulo by zero",
    0x21: "invalid enum value",
    0x22: "corrupt storage byte array",
    0x31: "pop on an empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialised internal function",
}

# English sentences for the custom errors of our contracts and the OpenZeppelin code they build on. Fields
# are the error's ABI parameter names; timestamps are rendered with their UTC time.
_ERROR_MESSAGES: dict[str, str] = {
    # ExperienceRegistry
    "ZeroRoot": "the library root must not be zero",
    "EmptyCID": "the CID must not be empty",
    "CIDTooLong": "the CID is {length} bytes long, more than the {maxLength} allowed",
    "InvalidCID": "the CID is not a CIDv0 or a multibase CIDv1 string (character {position} breaks the rule)",
    "EmptyTree": "the tree size must not be zero (a library version holds at least one experience)",
    "ProposalAlreadyExists": (
        "proposal {proposalId} already exists (the same proposer, content, parent and salt; pick a new salt)"
    ),
    "WrongParent": (
        "wrong parent: version {parentVersion} is not the current library version {currentVersion}"
    ),
    "InsufficientProposerVotes": (
        "proposer {proposer} had {votes} votes at the snapshot, below the proposal threshold of {threshold}"
    ),
    "ProposalNotFound": "there is no proposal {proposalId}",
    "VotingNotStarted": "voting on proposal {proposalId} has not started yet (it opens at {voteStart})",
    "VotingClosed": "voting on proposal {proposalId} is closed (it closed at {voteEnd})",
    "AlreadyVoted": "already voted on this proposal (voter {voter})",
    "NoVotingPower": "no voting power on this proposal: voter {voter} had no votes at its snapshot",
    "VoterNotRegistered": "voter {voter} was not in the voter registry at the proposal's snapshot {snapshot}",
    "ProposalStale": (
        "proposal {proposalId} is stale: its parent version {parentVersion} is no longer the current library "
        "version {currentVersion}"
    ),
    "ExecutionTooEarly": "proposal {proposalId} cannot be executed before {executableAt}",
    "ProposalExpired": "proposal {proposalId} passed but expired unexecuted at {expiredAt}",
    "ProposalAlreadyExecuted": "proposal {proposalId} was already executed",
    "QuorumNotReached": "proposal {proposalId} did not reach quorum: {support} weight for, {quorum} needed "
    "(against votes do not count toward quorum)",
    "ProposalDefeated": (
        "proposal {proposalId} was defeated: {forWeight} for and {againstWeight} against is not a two-thirds "
        "majority"
    ),
    "UnknownVersion": "library version {version} does not exist (the current version is {currentVersion})",
    "InvalidToken": "the token address {token} is not a contract",
    "InvalidTokenClock": "the token {token} does not use a timestamp clock (its clock reads {clock})",
    "InvalidVotingPeriod": "the voting period must not be zero",
    "InvalidGracePeriod": "the grace period must not be zero",
    "InvalidQuorum": "the quorum must not be zero",
    "InvalidVoterRegistry": (
        "the voter registry {voterRegistry} is not a contract with a timestamp clock (IVoterRegistry)"
    ),
    # KeeperToken / AllowlistVoterRegistry
    "KeeperTokenLengthMismatch": "{holders} holders but {amounts} amounts",
    "RegistryFutureLookup": (
        "cannot read registrations at {timepoint}: the registry's clock is only at {clock}"
    ),
    # OpenZeppelin
    "ERC20InsufficientBalance": "{sender} has a balance of {balance}, less than the {needed} needed",
    "ERC20InsufficientAllowance": "{spender} may spend {allowance}, less than the {needed} needed",
    "ERC20InvalidSender": "invalid token sender {sender}",
    "ERC20InvalidReceiver": "invalid token receiver {receiver}",
    "ERC20InvalidApprover": "invalid approver {approver}",
    "ERC20InvalidSpender": "invalid spender {spender}",
    "ERC20ExceededSafeSupply": "the supply {increasedSupply} would exceed the largest votable supply {cap}",
    "ERC5805FutureLookup": "cannot read votes at {timepoint}: the token clock is only at {clock}",
    "ERC6372InconsistentClock": "the token's clock is inconsistent",
    "VotesExpiredSignature": "the delegation signature expired at {expiry}",
    "ERC2612ExpiredSignature": "the permit expired at {deadline}",
    "ERC2612InvalidSigner": "the permit was signed by {signer}, not by the owner {owner}",
    "InvalidAccountNonce": "nonce mismatch for {account}: the current nonce is {currentNonce}",
    "OwnableUnauthorizedAccount": "{account} is not the owner",
    "OwnableInvalidOwner": "invalid owner {owner}",
    "SafeCastOverflowedUintDowncast": "{value} does not fit in {bits} bits",
    "ECDSAInvalidSignature": "invalid signature",
    "ECDSAInvalidSignatureLength": "invalid signature length {length}",
    "ECDSAInvalidSignatureS": "invalid signature (s value {s})",
}

_TIME_FIELDS = {"voteStart", "voteEnd", "executableAt", "expiredAt", "expiry", "deadline", "timepoint"}
_TIME_FIELDS |= {"clock", "snapshot"}
_REVERT_SOURCES = ("ExperienceRegistry", "KeeperToken", "AllowlistVoterRegistry")


class ChainError(RuntimeError):
    """A chain interaction failed (RPC error, transaction not mined, missing signer)."""


class ContractRevert(ChainError):
    """A contract call reverted. The message says why in words; `error` and `args` hold the decoded error."""

    def __init__(
        self,
        message: str,
        *,
        error: str | None = None,
        args: Mapping[str, Any] | None = None,
        data: str | None = None,
        tx_hash: str | None = None,
    ) -> None:
        super().__init__(message)
        self.error = error
        self.args_by_name: dict[str, Any] = dict(args or {})
        self.data = data
        self.tx_hash = tx_hash

    @property
    def selector(self) -> str | None:
        """The 4-byte error selector as 0x-hex, when the revert carried one."""
        return self.data[:10] if self.data and len(self.data) >= 10 else None


class TransactionSigner(Protocol):
    """What sending a transaction needs: an eth-account LocalAccount or a zoo.registry.keys.Signer."""

    @property
    def address(self) -> ChecksumAddress: ...

    def sign_transaction(self, transaction: dict[str, Any]) -> SignedTransaction: ...


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


@dataclass(frozen=True)
class TxResult:
    """A mined, successful transaction."""

    tx_hash: str
    gas_used: int
    block_number: int
    receipt: TxReceipt
    contract_address: ChecksumAddress | None = None


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


# ---------------------------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class _ErrorAbi:
    name: str
    names: tuple[str, ...]
    types: tuple[str, ...]


def _error_table(abis: Iterable[Sequence[Mapping[str, Any]]]) -> dict[bytes, _ErrorAbi]:
    table: dict[bytes, _ErrorAbi] = {}
    for abi in abis:
        for item in abi:
            if item.get("type") != "error":
                continue
            selector = function_signature_to_4byte_selector(abi_to_signature(item))  # type: ignore[arg-type]
            table[selector] = _ErrorAbi(
                name=item["name"],
                names=tuple(i.get("name", "") or f"arg{n}" for n, i in enumerate(item.get("inputs", []))),
                types=tuple(get_abi_input_types(item)),  # type: ignore[arg-type]
            )
    return table


@lru_cache(maxsize=1)
def _default_artifacts() -> Artifacts:
    return build()


@lru_cache(maxsize=1)
def _default_error_table() -> dict[bytes, _ErrorAbi]:
    artifacts = _default_artifacts()
    return _error_table(artifacts.get(name).abi for name in _REVERT_SOURCES)


def _format_value(name: str, value: Any) -> str:
    if name == "proposalId" and isinstance(value, int):
        return format_proposal_id(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, int) and not isinstance(value, bool) and name in _TIME_FIELDS and 0 < value < 2**40:
        when = datetime.datetime.fromtimestamp(value, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{value} ({when})"
    if isinstance(value, str) and value.startswith("0x") and len(value) == 42:
        return Web3.to_checksum_address(value)
    return str(value)


def describe_revert(
    data: str | bytes | None,
    errors: Mapping[bytes, _ErrorAbi] | None = None,
) -> tuple[str, str | None, dict[str, Any]]:
    """(English message, error name, decoded args) for raw revert data; unknown selectors are shown in hex."""
    if errors is None:
        errors = _default_error_table()
    raw = bytes(HexBytes(data)) if data else b""
    if not raw:
        return "the transaction reverted without a reason", None, {}
    selector, body = raw[:4], raw[4:]
    try:
        if selector == _ERROR_STRING_SELECTOR:
            (reason,) = abi_decode(["string"], body)
            return f"reverted: {reason}", "Error", {"reason": reason}
        if selector == _PANIC_SELECTOR:
            (code,) = abi_decode(["uint256"], body)
            what = _PANIC_CODES.get(code, "unknown panic")
            return f"contract panicked: {what} (code 0x{code:02x})", "Panic", {"code": code}
        spec = errors.get(selector)
        if spec is not None:
            values = abi_decode(list(spec.types), body)
            args = {
                name: Web3.to_checksum_address(value) if kind == "address" else value
                for name, kind, value in zip(spec.names, spec.types, values, strict=True)
            }
            shown = {name: _format_value(name, value) for name, value in args.items()}
            template = _ERROR_MESSAGES.get(spec.name)
            if template is not None:
                return template.format(**shown), spec.name, args
            listed = ", ".join(f"{k}={v}" for k, v in shown.items())
            return f"{spec.name}({listed})", spec.name, args
    except (DecodingError, ValueError, KeyError):
        pass
    return f"reverted with unknown error 0x{selector.hex()} (data 0x{raw.hex()})", None, {}


def _revert_data(exc: ContractLogicError) -> str | None:
    data = exc.data
    if isinstance(data, Mapping):
        data = data.get("data")
    return data if isinstance(data, str) and data.startswith("0x") else None


def _as_revert(
    exc: ContractLogicError, errors: Mapping[bytes, _ErrorAbi], tx_hash: str | None = None
) -> ContractRevert:
    data = _revert_data(exc)
    name: str | None = None
    args: dict[str, Any] = {}
    if data is None:
        message = exc.message or "the transaction reverted without a reason"
    else:
        message, name, args = describe_revert(data, errors)
    if tx_hash:
        message = f"{message} (transaction {tx_hash})"
    return ContractRevert(message, error=name, args=args, data=data, tx_hash=tx_hash)


# ----------------------------------------------------------------------------------------- transactions


def _to_bytes32(value: bytes | str) -> bytes:
    raw = bytes(HexBytes(value))
    if len(raw) != 32:
        raise ValueError(f"expected 32 bytes, got {len(raw)}")
    return raw


class _Sender:
    """Signs, sends and waits for transactions from one account, surfacing reverts before sending."""

    def __init__(
        self, w3: Web3, account: TransactionSigner | None, errors: Mapping[bytes, _ErrorAbi]
    ) -> None:
        self.w3 = w3
        self.account = account
        self.errors = errors
        self._chain_id: int | None = None

    def require_account(self) -> TransactionSigner:
        if self.account is None:
            raise ChainError("this client has no signing account; pass account= to send transactions")
        return self.account

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = self.w3.eth.chain_id
        return self._chain_id

    def send(self, to: ChecksumAddress | None, data: str) -> TxResult:
        account = self.require_account()
        tx: TxParams = {"from": account.address, "data": HexBytes(data), "value": Wei(0)}
        if to is not None:
            tx["to"] = to
        try:
            # Runs the transaction on the pending block (the time and state it would really meet; "latest"
            # would use the previous block's timestamp): a revert surfaces here, decoded, before sending.
            estimate = self.w3.eth.estimate_gas(tx, "pending")
        except ContractLogicError as exc:
            raise _as_revert(exc, self.errors) from None
        except Web3RPCError as exc:
            raise ChainError(f"gas estimation failed: {exc.message}") from None
        gas_price = self.w3.eth.gas_price
        tx.update(
            {
                "gas": estimate * _GAS_MARGIN_NUM // _GAS_MARGIN_DEN + _GAS_CUSHION,
                "nonce": self.w3.eth.get_transaction_count(account.address, "pending"),
                "chainId": self.chain_id,
                # Twice the current price rides out several blocks of base-fee increases (12.5% each).
                "maxFeePerGas": Wei(2 * gas_price + _PRIORITY_FEE),
                "maxPriorityFeePerGas": Wei(_PRIORITY_FEE),
                "type": 2,
            }
        )
        signed = account.sign_transaction(dict(tx))
        try:
            tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
            receipt = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=_RECEIPT_TIMEOUT, poll_latency=0.05
            )
        except Web3RPCError as exc:
            raise ChainError(f"sending the transaction failed: {exc.message}") from None
        except TimeExhausted as exc:
            raise ChainError(str(exc)) from None
        hash_hex = "0x" + bytes(tx_hash).hex()
        if receipt["status"] != 1:
            raise self._mined_revert(tx, receipt, hash_hex)
        address = receipt.get("contractAddress")
        return TxResult(
            tx_hash=hash_hex,
            gas_used=int(receipt["gasUsed"]),
            block_number=int(receipt["blockNumber"]),
            receipt=receipt,
            contract_address=Web3.to_checksum_address(address) if address else None,
        )

    def _mined_revert(self, tx: TxParams, receipt: TxReceipt, tx_hash: str) -> ContractRevert:
        # Time or state moved between estimate and inclusion. Replaying in the block that included the
        # transaction (its timestamp, the state it left, which the reverted transaction did not touch)
        # usually hits the same error.
        replay: TxParams = {"from": tx["from"], "data": tx["data"], "value": Wei(0), "gas": tx["gas"]}
        if "to" in tx:
            replay["to"] = tx["to"]
        try:
            self.w3.eth.call(replay, int(receipt["blockNumber"]))
        except ContractLogicError as exc:
            return _as_revert(exc, self.errors, tx_hash)
        except Web3RPCError:
            pass
        if receipt["gasUsed"] >= tx.get("gas", 0):
            return ContractRevert(f"the transaction ran out of gas (transaction {tx_hash})", tx_hash=tx_hash)
        return ContractRevert(f"the transaction reverted on chain (transaction {tx_hash})", tx_hash=tx_hash)


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


def proposal_id(
    root: bytes | str, tree_size: int, cid: str, parent_version: int, proposer: str, salt: bytes | str
) -> int:
    """ExperienceRegistry.hashProposal, computed locally: the id a proposal with these fields gets."""
    encoded = abi_encode(
        ["bytes32", "uint256", "bytes32", "uint256", "address", "bytes32"],
        [
            _to_bytes32(root),
            int(tree_size),
            Web3.keccak(text=cid),
            int(parent_version),
            Web3.to_checksum_address(proposer),
            _to_bytes32(salt),
        ],
    )
    return int.from_bytes(Web3.keccak(encoded), "big")


def format_proposal_id(value: int) -> str:
    """A proposal id as 0x and 64 hex digits (how the CLI shows and accepts it)."""
    return f"0x{value:064x}"


def parse_proposal_id(value: int | str) -> int:
    """A proposal id from an int or 0x-hex text (how ids are shown); ValueError when it is neither."""
    if isinstance(value, int):
        number = value
    else:
        digits = value.strip().lower()
        if not digits.startswith("0x") or not 2 < len(digits) <= 66:
            raise ValueError(f"not a proposal id: {value!r} (0x and up to 64 hex digits)")
        try:
            number = int(digits, 16)
        except ValueError:
            raise ValueError(f"not a proposal id: {value!r} (0x and up to 64 hex digits)") from None
    if not 0 <= number < 2**256:
        raise ValueError(f"not a proposal id: {value!r} (out of the uint256 range)")
    return number


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


# ---------------------------------------------------------------------------------------------- clients


# What the registry accepts as a CID (ExperienceRegistry._checkCID): CIDv0, or a multibase prefix and
# characters of the multibase alphabets IPFS uses.
_CID_V0 = re.compile(r"Qm[1-9A-HJ-NP-Za-km-z]{44}")
_CID_V1 = re.compile(r"[bBzkKfFu][0-9A-Za-z_-]+")


def cid_problem(cid: str) -> str | None:
    """Why `cid` is not a CID the registry would accept, or None when it is one."""
    if not cid:
        return "empty"
    if not cid.isascii() or not cid.isprintable():
        return f"not printable ASCII: {cid[:40]!r}"
    if len(cid) > 256:
        return f"{len(cid)} characters, more than 256"
    if cid.startswith("Q"):
        return None if _CID_V0.fullmatch(cid) else "not a CIDv0 ('Qm' and 44 base58btc characters)"
    return None if _CID_V1.fullmatch(cid) else "not a multibase CIDv1 string"


def shown_cid(cid: str, width: int = 0) -> str:
    """A CID for display: as it is when valid, else marked invalid with its characters escaped."""
    problem = cid_problem(cid)
    text = cid if problem is None else f"<invalid CID {ascii(cid)[1:-1]}>"
    return text[:width] + "…" if width and len(text) > width else text


def _tolerant_codec() -> ABICodec:
    """Web3's ABI codec, except that strings that are not UTF-8 decode (surrogate-escaped) instead of
    raising: one hostile event in a registry's history must not break every listing of it for good."""
    tolerant = default_registry.copy()
    tolerant.unregister("string")
    tolerant.register(
        "string", TextStringEncoder, StringDecoder(handle_string_errors="surrogateescape"), label="string"
    )
    return ABICodec(tolerant)


_TOLERANT_CODEC = _tolerant_codec()


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

    def _transact(self, function: str, *args: Any) -> TxResult:
        return self._sender.send(self.address, self.contract.encode_abi(function, args=list(args)))

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
        salt_bytes = os.urandom(32) if salt is None else _to_bytes32(salt)
        key = _to_bytes32(root)
        result = self._transact("propose", key, int(tree_size), cid, parent, salt_bytes)
        pid = proposal_id(key, tree_size, cid, parent, account.address, salt_bytes)
        return ProposalTx(**{f.name: getattr(result, f.name) for f in fields(TxResult)}, proposal_id=pid)

    def vote(self, proposal: int | str, support: bool) -> TxResult:
        """Vote for (`support` True) or against the proposal."""
        return self._transact("vote", parse_proposal_id(proposal), bool(support))

    def execute(self, proposal: int | str) -> TxResult:
        """Execute the passed proposal, making it the next library version."""
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
                _to_bytes32(root),
                int(tree_size),
                cid,
                int(parent_version),
                Web3.to_checksum_address(proposer),
                _to_bytes32(salt),
            )
        )

    def proposal(self, proposal: int | str) -> Proposal | None:
        """The proposal with this id, or None when there is none."""
        pid = parse_proposal_id(proposal)
        # Struct order: proposer, snapshot, voteStart, voteEnd, executed, parentVersion, treeSize, root,
        # forWeight, againstWeight, cid.
        proposer, snapshot, start, end, executed, parent, size, root, for_w, against_w, cid = self._call(
            "proposal", pid
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
        )

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
        matches = sorted(
            {e.proposal_id for e in self.proposal_created_events(from_block)
             if format_proposal_id(e.proposal_id)[2:].startswith(digits)}
        )  # fmt: skip
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
                _to_bytes32(leaf_hash),
                index,
                tree_size,
                [_to_bytes32(p) for p in proof],
                _to_bytes32(root),
            )
        )

    def verify_inclusion_in_version(
        self, version: int, leaf: bytes, index: int, proof: Sequence[bytes]
    ) -> bool:
        """On-chain check that record `leaf` (its canonical bytes, hashed by the contract) is leaf `index` of
        library version `version`, whose tree size the contract stored."""
        return bool(
            self._call(
                "verifyInclusionInVersion", version, bytes(leaf), index, [_to_bytes32(p) for p in proof]
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
