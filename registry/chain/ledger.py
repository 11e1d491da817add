"""Typed client of the UsageLedger: node registration, usage reports, challenges, claims and balances.

A report's records are leaves `kind (1 byte) || account (20 bytes) || units (32 bytes, big-endian)`:
kind 0 an author's earned units, kind 1 a client's spent credits (see contracts/src/UsageLedger.sol).
A spent record applies only with the client's consent, a signed SpendAuthorization (zoo.registry.spend).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi.exceptions import DecodingError
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import Web3
from web3.types import BlockIdentifier

from zoo.registry.chain.contract_clients import _ContractClient
from zoo.registry.chain.ids import to_bytes32
from zoo.registry.chain.records import TxResult
from zoo.registry.spend import SpendAuthorization

EARNED, SPENT = 0, 1


def record_leaf(kind: int, account: str, units: int) -> bytes:
    """The leaf bytes of one report record (what the contract's leaf() returns)."""
    if kind not in (EARNED, SPENT):
        raise ValueError(f"record kind must be {EARNED} (earned) or {SPENT} (spent), got {kind}")
    if not 0 <= units < 2**256:
        raise ValueError(f"units must fit in uint256, got {units}")
    return bytes([kind]) + bytes.fromhex(Web3.to_checksum_address(account)[2:]) + units.to_bytes(32, "big")


@dataclass(frozen=True)
class UsageReport:
    """A report as the ledger stores it."""

    node: ChecksumAddress
    epoch: int
    root: bytes
    tree_size: int
    posted_at: int
    challenged: bool
    voided: bool
    earned_units: int
    claimed_units: int
    cid: str
    challenger: ChecksumAddress | None = None  # who challenged it (pending or resolved); None if nobody
    registration: int = 0  # the node's registration number it was posted under (claimable only under it)
    challenged_at: int = 0  # when it was challenged (0: never); the DAO resolves within resolution_period


@dataclass(frozen=True)
class NodeRegistration:
    """A node's registration on the ledger."""

    active: bool  # it may post reports, and its reports of this registration be claimed
    number: int  # how many times it was registered; a report counts only under the number it was posted in
    first_epoch: int  # the first epoch it may report (the one it was last registered in)


@dataclass(frozen=True)
class LedgerParams:
    governor: ChecksumAddress
    keeper_token: ChecksumAddress
    epoch_length: int
    challenge_window: int
    max_units_per_report: int
    challenge_threshold: int
    report_window: int  # seconds after an epoch ends within which its report may be posted
    challenge_bond: int  # wei a challenger stakes
    resolution_period: int  # seconds after a challenge within which the DAO resolves it; then it lapses


class LedgerClient(_ContractClient):
    """UsageLedger: registration (the governor), reports (nodes), challenges, claims and balances."""

    _artifact_name = "UsageLedger"

    # ---- the governor's calls, as calldata for a DAO call proposal (RegistryClient.propose_call)

    GOVERNOR_FUNCTIONS = ("registerNode", "deregisterNode", "resolveChallenge")

    def governor_call(self, function: str, *args: Any) -> bytes:
        """Calldata of one of the governor's functions, e.g. ("registerNode", node)."""
        if function not in self.GOVERNOR_FUNCTIONS:
            known = ", ".join(self.GOVERNOR_FUNCTIONS)
            raise ValueError(f"{function!r} is not a governor function ({known})")
        args = tuple(Web3.to_checksum_address(a) if isinstance(a, str) else a for a in args)
        return bytes(HexBytes(self.contract.encode_abi(function, args=list(args))))

    def describe_call(self, data: bytes) -> str:
        """A ledger call in words ("registerNode(0xAb…)"), or a note that the data calls nothing known.
        Calldata that is not its call's one encoding (bytes appended, dirty padding: what registries before
        DaoCalls accepted) is said to be so, since the call it makes is not told apart from the canonical
        one."""
        data = bytes(data)
        try:
            function, params = self.contract.decode_function_input(data)
        except DecodingError:  # a known selector, arguments short or out of their types' range
            name = self.contract.get_function_by_selector(data[:4]).fn_name
            return f"{name}(…) with arguments the ledger refuses ({len(data)} bytes): it never runs"
        except ValueError:
            return f"an unknown call ({len(data)} bytes) on the UsageLedger"
        shown = f"{function.fn_name}({', '.join(str(v) for v in params.values())})"
        canonical = bytes(HexBytes(self.contract.encode_abi(function.fn_name, args=list(params.values()))))
        if data != canonical:
            sizes = f"{len(data)} bytes of calldata, {len(canonical)} canonical"
            return f"{shown}, NOT canonically encoded ({sizes})"
        return shown

    # ---- transactions

    def register_node(self, node: str) -> TxResult:
        return self._transact("registerNode", Web3.to_checksum_address(node))

    def deregister_node(self, node: str) -> TxResult:
        return self._transact("deregisterNode", Web3.to_checksum_address(node))

    def resolve_challenge(self, node: str, epoch: int, upheld: bool) -> TxResult:
        return self._transact("resolveChallenge", Web3.to_checksum_address(node), int(epoch), bool(upheld))

    def post_report(
        self, epoch: int, root: bytes | str, *, tree_size: int, earned_units: int, cid: str
    ) -> TxResult:
        return self._transact(
            "postReport", int(epoch), to_bytes32(root), int(tree_size), int(earned_units), cid
        )

    def challenge(self, node: str, epoch: int, reason: str) -> TxResult:
        """Challenge a report, staking the ledger's challenge bond (from the signer's ether)."""
        bond = int(self._call("challengeBond"))
        return self._transact("challenge", Web3.to_checksum_address(node), int(epoch), reason, value=bond)

    def settle_lapsed_challenge(self, node: str, epoch: int) -> TxResult:
        """Settle a challenge the DAO left unresolved past the resolution period: the bond goes back to the
        challenger and the report is released (anyone may)."""
        return self._transact("settleLapsedChallenge", Web3.to_checksum_address(node), int(epoch))

    def withdraw(self) -> TxResult:
        """Withdraw the bonds awarded to the signer."""
        return self._transact("withdraw")

    def claim(self, node: str, epoch: int, units: int, index: int, proof: Sequence[bytes]) -> TxResult:
        return self._transact(
            "claim", Web3.to_checksum_address(node), int(epoch), int(units), int(index), list(proof)
        )

    def apply_spent(
        self,
        node: str,
        epoch: int,
        units: int,
        index: int,
        proof: Sequence[bytes],
        authorization: SpendAuthorization,
    ) -> TxResult:
        """Apply the SPENT record of `authorization.client` (`units`, at leaf `index`) with its consent."""
        return self._transact(
            "applySpent",
            Web3.to_checksum_address(node),
            int(epoch),
            authorization.client,
            int(units),
            int(index),
            list(proof),
            int(authorization.units),
            bytes(authorization.signature),
        )

    # ---- reads

    def params(self) -> LedgerParams:
        return LedgerParams(
            Web3.to_checksum_address(self._call("governor")),
            Web3.to_checksum_address(self._call("keeperToken")),
            int(self._call("epochLength")),
            int(self._call("challengeWindow")),
            int(self._call("maxUnitsPerReport")),
            int(self._call("challengeThreshold")),
            int(self._call("reportWindow")),
            int(self._call("challengeBond")),
            int(self._call("resolutionPeriod")),
        )

    def first_epoch(self, node: str) -> int:
        """The first epoch `node` may report (the one it was registered in)."""
        return int(self._call("firstEpoch", Web3.to_checksum_address(node)))

    def registration(self, node: str) -> NodeRegistration:
        """`node`'s registration: active or not, its number, its first reportable epoch."""
        active, number, first_epoch = self._call("registration", Web3.to_checksum_address(node))
        return NodeRegistration(bool(active), int(number), int(first_epoch))

    def withdrawable(self, account: str) -> int:
        """Wei of awarded challenge bonds `account` can withdraw."""
        return int(self._call("withdrawable", Web3.to_checksum_address(account)))

    def spend_digest(self, client: str, node: str, epoch: int, units: int) -> bytes:
        """The contract's EIP-712 digest of `client`'s spend authorization (spend_authorization_digest
        computes it off chain)."""
        return bytes(
            self._call(
                "spendAuthorizationDigest",
                Web3.to_checksum_address(client),
                Web3.to_checksum_address(node),
                int(epoch),
                int(units),
            )
        )

    def is_registered(self, node: str) -> bool:
        return bool(self._call("registered", Web3.to_checksum_address(node)))

    def balance(self, account: str) -> int:
        """Credits `account` may spend (claimed minus spent, never below zero)."""
        return int(self._call("balanceOf", Web3.to_checksum_address(account)))

    def earned(self, account: str) -> int:
        return int(self._call("earned", Web3.to_checksum_address(account)))

    def spent(self, account: str) -> int:
        return int(self._call("spent", Web3.to_checksum_address(account)))

    def report(self, node: str, epoch: int) -> UsageReport | None:
        """The report `node` posted for `epoch`, or None."""
        r = self._call("report", Web3.to_checksum_address(node), int(epoch))
        (root, tree_size, posted_at, challenged, voided, registration, earned_units, claimed_units, cid,
         challenger, challenged_at) = r  # fmt: skip
        if posted_at == 0:
            return None
        return UsageReport(
            Web3.to_checksum_address(node), int(epoch), bytes(root), int(tree_size), int(posted_at),
            bool(challenged), bool(voided), int(earned_units), int(claimed_units), str(cid),
            None if int(challenger, 16) == 0 else Web3.to_checksum_address(challenger),
            int(registration), int(challenged_at),
        )  # fmt: skip

    def settled(self, node: str, epoch: int, kind: int, account: str) -> bool:
        return bool(
            self._call(
                "settled",
                Web3.to_checksum_address(node),
                int(epoch),
                int(kind),
                Web3.to_checksum_address(account),
            )
        )

    def posted_reports(
        self, from_block: BlockIdentifier = 0, node: str | None = None, epoch: int | None = None
    ) -> list[UsageReport]:
        """Every report posted (found by its ReportPosted event), oldest first, as the ledger holds it now
        (challenged, voided, claimed); only `node`'s and `epoch`'s if given."""
        filters: dict[str, Any] = {}
        if node is not None:
            filters["node"] = Web3.to_checksum_address(node)
        if epoch is not None:
            filters["epoch"] = int(epoch)
        logs = self.contract.events.ReportPosted().get_logs(
            argument_filters=filters or None, from_block=from_block
        )
        ordered = sorted(logs, key=lambda e: (e["blockNumber"], e["logIndex"]))
        reports = [self.report(e["args"]["node"], int(e["args"]["epoch"])) for e in ordered]
        return [r for r in reports if r is not None]

    def leaf(self, kind: int, account: str, units: int) -> bytes:
        return bytes(self._call("leaf", int(kind), Web3.to_checksum_address(account), int(units)))
