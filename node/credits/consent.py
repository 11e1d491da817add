"""The node's check of a zoo-spend header: the request's signer consents to be charged credits here.

A spend authorization is accepted when it names the request's signer as the client, this node and the
current epoch (the meter's), and its EIP-712 signature, in the UsageLedger's domain, recovers to that
signer (zoo.registry.spend). The node keeps the largest one each client sent in an epoch: the ledger
applies a spend only with it. A contract wallet (ERC-1271) cannot authorise through this header: the node
checks with ecrecover, on the request path, without a chain call.
"""

from __future__ import annotations

from collections.abc import Callable

from eth_utils import to_checksum_address

from zoo.node.credits.signing import SPEND_HEADER, SignatureError, parse_spend_header, recover_signer
from zoo.registry.spend import SpendAuthorization, spend_authorization_digest


class SpendUnavailable(SignatureError):
    """The node cannot check spend authorizations yet (it has not reached its chain)."""


class SpendCheck:
    """Checks zoo-spend headers for `node_address` against the ledger at `ledger_address`."""

    def __init__(
        self,
        node_address: str,
        ledger_address: str,
        chain_id: Callable[[], int],
        epoch_now: Callable[[], int],
    ) -> None:
        """chain_id: the chain's id, 0 while unknown; epoch_now: the meter's current epoch."""
        self.node_address = to_checksum_address(node_address)
        self.ledger_address = to_checksum_address(ledger_address)
        self._chain_id = chain_id
        self._epoch_now = epoch_now

    def check(self, value: str, client: str) -> SpendAuthorization:
        """The authorization in header `value`, signed by `client`; SignatureError saying why not."""
        epoch, units, signature = parse_spend_header(value)
        now = self._epoch_now()
        if epoch != now:
            raise SignatureError(
                "stale",
                f"{SPEND_HEADER} authorizes epoch {epoch}, but this node's epoch is {now}: "
                f"sign one for {now}",
            )
        chain_id = self._chain_id()
        if not chain_id:
            raise SpendUnavailable(
                "unavailable",
                "this node has not reached its chain yet, so it cannot check a spend authorization: "
                "retry soon",
            )
        digest = spend_authorization_digest(
            chain_id, self.ledger_address, client, self.node_address, epoch, units
        )
        if recover_signer(digest, signature).hex() != client[2:].lower():
            raise SignatureError(
                "forged",
                f"{SPEND_HEADER} is not {client}'s SpendAuthorization(client {client}, node "
                f"{self.node_address}, epoch {epoch}, units {units}) on chain {chain_id}, ledger "
                f"{self.ledger_address}",
            )
        return SpendAuthorization(client, self.node_address, epoch, units, signature)
