"""Signing, sending and waiting for transactions from one account, surfacing reverts before sending.

Transactions are signed locally and sent raw; nonce, gas and fees are filled in here so each one costs a
fixed handful of RPC calls. Every transaction is first estimated, which runs it against current state: a
revert surfaces before anything is sent, as a ContractRevert whose message is the contract's custom error
in plain English.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from eth_account.datastructures import SignedTransaction
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractLogicError, TimeExhausted, Web3RPCError
from web3.types import TxParams, TxReceipt, Wei

from zoo.registry.chain.chain_errors import ChainError, ContractRevert, _as_revert, _ErrorAbi
from zoo.registry.chain.records import TxResult

# Gas limit = estimate * 5/4 + 50k. The estimate is exact only for the block it ran in; the included block
# can differ, most of all for ERC20Votes: a transfer or delegation in a new second pushes a new vote
# checkpoint (a fresh storage slot, ~22k gas each for sender and receiver) where the estimate updated one
# in place. Unused gas is not charged, so the cushion costs nothing.
_GAS_MARGIN_NUM, _GAS_MARGIN_DEN = 5, 4
_GAS_CUSHION = 50_000
_PRIORITY_FEE = 1_000_000  # wei; devnets and L2s need next to nothing, mainnet callers can pass their own
_RECEIPT_TIMEOUT = 120.0


class TransactionSigner(Protocol):
    """What sending a transaction needs: an eth-account LocalAccount or a zoo.registry.keys.Signer."""

    @property
    def address(self) -> ChecksumAddress: ...

    def sign_transaction(self, transaction: dict[str, Any]) -> SignedTransaction: ...


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

    def send(self, to: ChecksumAddress | None, data: str, value: int = 0) -> TxResult:
        """Send `data` (and `value` wei) to `to` (None: deploy)."""
        account = self.require_account()
        tx: TxParams = {"from": account.address, "data": HexBytes(data), "value": Wei(value)}
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
        replay: TxParams = {"from": tx["from"], "data": tx["data"], "value": tx["value"], "gas": tx["gas"]}
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
