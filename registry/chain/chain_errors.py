"""Chain errors, and contract reverts decoded into plain English from the compiled contracts' ABIs."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_utils import abi_to_signature, function_signature_to_4byte_selector, get_abi_input_types
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractLogicError

from zoo.contracts.build import Artifacts, build
from zoo.registry.chain.ids import format_proposal_id
from zoo.registry.chain.records import ProposalState
from zoo.registry.errors import ZooError

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
    "InvalidCallTarget": (
        "a call proposal must call a contract, and on the registry itself only cancel(proposal) "
        "(got {target})"
    ),
    "CallProposalStale": (
        "call proposal {proposalId} is stale: an identical call was executed since it was proposed (its call "
        "{callHash} had run {executionsAtProposal} times then, {executionsNow} now); propose it again if it "
        "is still wanted"
    ),
    "ProposalIsCanceled": "proposal {proposalId} was canceled",
    "ProposalNotCancelable": (
        "proposal {proposalId} cannot be canceled: it is {state} (its proposer may cancel it only while it "
        "is pending or active, the DAO only before it is executed)"
    ),
    "NotAllowedToCancel": (
        "{caller} may not cancel proposal {proposalId}: only its proposer (while voting is open) or the DAO "
        "(a passed call proposal of cancel) may"
    ),
    "EmptyCall": "a call proposal's calldata must hold at least a function selector",
    "CallNotAllowed": (
        "a call proposal makes only the DAO's calls (a UsageLedger's registerNode, deregisterNode and "
        "resolveChallenge; cancel on the registry): selector {selector} on {target} is not one"
    ),
    "NonCanonicalCall": (
        "the calldata {data} is not the one encoding of its call on {target} (bytes appended or missing, or "
        "dirty padding); its canonical encoding is {canonical}"
    ),
    # UsageLedger (the others read as their name and values)
    "ReportAlreadyChallenged": (
        "node {node}'s report for epoch {epoch} was challenged already, by {challenger}: a report is "
        "challenged once"
    ),
    "ChallengeResolutionClosed": (
        "the challenge of node {node}'s report for epoch {epoch} lapsed at {closedAt}: the DAO can no longer "
        "resolve it, anyone settles it (`zoo-node credits settle-challenge`)"
    ),
    "ChallengeResolutionOpen": (
        "the DAO may resolve the challenge of node {node}'s report for epoch {epoch} until {closesAt}; "
        "it lapses only then"
    ),
    "ReportOfEndedRegistration": (
        "node {node}'s report for epoch {epoch} was posted under its registration {reportRegistration}, "
        "which a deregistration ended (it is in registration {currentRegistration} now): nothing of it "
        "applies"
    ),
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
    "FailedCall": "the proposal's call failed without a reason",
    "AddressEmptyCode": "{target} has no code to call",
    "ECDSAInvalidSignature": "invalid signature",
    "ECDSAInvalidSignatureLength": "invalid signature length {length}",
    "ECDSAInvalidSignatureS": "invalid signature (s value {s})",
}

_TIME_FIELDS = {"voteStart", "voteEnd", "executableAt", "expiredAt", "expiry", "deadline", "timepoint"}
_TIME_FIELDS |= {"clock", "snapshot", "closedAt", "closesAt"}
_REVERT_SOURCES = ("ExperienceRegistry", "KeeperToken", "AllowlistVoterRegistry", "UsageLedger")


class ChainError(ZooError, RuntimeError):
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
    if name == "state" and isinstance(value, int):
        return ProposalState(value).name.lower() if value in ProposalState._value2member_map_ else str(value)
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
