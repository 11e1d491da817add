"""A client's consent to be charged credits: the EIP-712 SpendAuthorization the UsageLedger checks before a
node's SPENT record lowers the client's balance.

    domain   EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)
             = ("UsageLedger", "1", the chain's id, the ledger's address)
    message  SpendAuthorization(address client,address node,uint256 epoch,uint256 units)

"`node` may charge me, `client`, up to `units` credits in `epoch`": a client signs one per node and epoch
(its wallet shows what it allows), sends it with its requests (the zoo-spend header, node/credits), and the
node keeps the largest it received to prove its spends. The client is named because an ERC-1271 wallet
usually accepts whatever its owner's key signed: without it, one signature of an owner would consent for
every account that owner controls. Light on purpose (no web3): the daemon checks these on the request path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_hash.auto import keccak
from eth_utils import to_checksum_address

SPEND_AUTHORIZATION_TYPE = [
    {"name": "client", "type": "address"},
    {"name": "node", "type": "address"},
    {"name": "epoch", "type": "uint256"},
    {"name": "units", "type": "uint256"},
]
_DOMAIN_TYPEHASH = keccak(
    b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
_SPEND_TYPEHASH = keccak(b"SpendAuthorization(address client,address node,uint256 epoch,uint256 units)")


@dataclass(frozen=True)
class SpendAuthorization:
    """A client's signed consent that `node` may charge it up to `units` credits in `epoch`."""

    client: str  # checksum address; part of what was signed
    node: str  # checksum address
    epoch: int
    units: int
    signature: bytes  # r || s || v (65 bytes), or whatever the client's ERC-1271 wallet accepts


def spend_domain(chain_id: int, ledger: str) -> dict[str, Any]:
    return {
        "name": "UsageLedger",
        "version": "1",
        "chainId": int(chain_id),
        "verifyingContract": to_checksum_address(ledger),
    }


def spend_authorization_digest(
    chain_id: int, ledger: str, client: str, node: str, epoch: int, units: int
) -> bytes:
    """The EIP-712 digest of `client`'s spend authorization (what the contract's spendAuthorizationDigest
    returns). By hand, as node/credits/signing.py hashes requests: four keccaks, not eth_account's document
    walk; the tests hold it equal to the contract's and to eth_account's."""
    if not 0 <= epoch < 2**256 or not 0 <= units < 2**256:
        raise ValueError("epoch and units must fit in uint256")
    domain = keccak(
        _DOMAIN_TYPEHASH + keccak(b"UsageLedger") + keccak(b"1") + int(chain_id).to_bytes(32, "big")
        + bytes.fromhex(to_checksum_address(ledger)[2:]).rjust(32, b"\0")
    )  # fmt: skip
    message = keccak(
        _SPEND_TYPEHASH + bytes.fromhex(to_checksum_address(client)[2:]).rjust(32, b"\0")
        + bytes.fromhex(to_checksum_address(node)[2:]).rjust(32, b"\0")
        + epoch.to_bytes(32, "big") + units.to_bytes(32, "big")
    )  # fmt: skip
    return keccak(b"\x19\x01" + domain + message)


def typed_spend_authorization(
    chain_id: int, ledger: str, client: str, node: str, epoch: int, units: int
) -> dict[str, Any]:
    """The authorization as a full EIP-712 document (what a wallet is asked to sign)."""
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "SpendAuthorization": SPEND_AUTHORIZATION_TYPE,
        },
        "primaryType": "SpendAuthorization",
        "domain": spend_domain(chain_id, ledger),
        "message": {
            "client": to_checksum_address(client),
            "node": to_checksum_address(node),
            "epoch": int(epoch),
            "units": int(units),
        },
    }


def sign_spend_authorization(
    account: Any,
    chain_id: int,
    ledger: str,
    node: str,
    epoch: int,
    units: int,
    *,
    client: str | None = None,
) -> SpendAuthorization:
    """`account` (a Signer, an eth_account LocalAccount or a hex key) lets `node` charge it up to `units`
    credits in `epoch`, signed through eth_account's typed-data signing, as a wallet would. `client`: the
    charged account when it is not the key's own, an ERC-1271 wallet whose owner `account` is."""
    from eth_account import Account  # the client's import: the node never signs these

    account = getattr(account, "account", account)  # a Signer's LocalAccount
    key = account.key if hasattr(account, "key") else account
    client = to_checksum_address(client or Account.from_key(key).address)
    signed = Account.sign_typed_data(
        key, full_message=typed_spend_authorization(chain_id, ledger, client, node, epoch, units)
    )
    return SpendAuthorization(
        client,
        to_checksum_address(node),
        int(epoch),
        int(units),
        bytes(signed.signature),
    )
