"""Signed requests: a client proves which Ethereum account sends a request, with no account on the node.

A request is signed as EIP-712 typed data (what wallets show and sign):

    domain   EIP712Domain(string name,string version) = ("zoo-node", "1")
    message  Request(address node,string method,bytes32 body,uint64 timestamp,uint64 nonce)

`node` is the serving node's account (GetStatus.node_address), so a signature cannot be replayed at
another node; `method` the gRPC method path ("/zoo.v1.InferenceService/Infer") or the HTTP method and
path ("POST /v1/chat/completions"); `body` the SHA-256 of the request's bytes exactly as sent (the
serialized protobuf message, the HTTP body; SHA-256 as in HTTP's Content-Digest, RFC 9530, and a third
of keccak's cost here); `timestamp` Unix seconds; `nonce` a random 64-bit number.

It travels as one header, gRPC metadata and HTTP alike:

    zoo-signature: signer=0x<40 hex>,timestamp=<int>,nonce=<int>,signature=0x<130 hex>

A signed client that wants to spend credits here (and be served first) adds its consent to be charged,
a SpendAuthorization for this node and the current epoch (zoo.registry.spend), as a second header:

    zoo-spend: epoch=<int>,units=<int>,signature=0x<130 hex>
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import coincurve
from eth_hash.auto import keccak
from eth_utils import to_checksum_address

from zoo.registry.errors import ZooError

HEADER = "zoo-signature"
SPEND_HEADER = "zoo-spend"
_SPEND_FIELDS = ("epoch", "units", "signature")
DOMAIN = {"name": "zoo-node", "version": "1"}
DOMAIN_TYPE = [{"name": "name", "type": "string"}, {"name": "version", "type": "string"}]
REQUEST_TYPE = [
    {"name": "node", "type": "address"},
    {"name": "method", "type": "string"},
    {"name": "body", "type": "bytes32"},
    {"name": "timestamp", "type": "uint64"},
    {"name": "nonce", "type": "uint64"},
]
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_FIELDS = ("signer", "timestamp", "nonce", "signature")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")
_UINT = re.compile(r"[0-9]{1,78}")  # up to 2**256 - 1


class SignatureError(ZooError):
    """A signed request that is refused; the message says why (malformed, stale, replayed, forged)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a short label for metrics: malformed, stale, replayed, forged


@dataclass(frozen=True)
class SignedHeader:
    """A parsed zoo-signature header (not yet verified)."""

    signer: str  # checksum address
    timestamp: int
    nonce: int
    signature: bytes  # r || s || v, 65 bytes


# The EIP-712 hashes, by hand: eth_account's encode_typed_data builds and walks the whole typed-data
# document in Python for every request (about a millisecond; benchmarks/signing.py), where the node's
# check may cost 0.2 ms. For this one fixed type the hash is four keccaks; the tests hold it equal to
# eth_account's on random requests.
_DOMAIN_TYPEHASH = keccak(b"EIP712Domain(string name,string version)")
DOMAIN_SEPARATOR = keccak(
    _DOMAIN_TYPEHASH + keccak(DOMAIN["name"].encode()) + keccak(DOMAIN["version"].encode())
)
_REQUEST_TYPEHASH = keccak(b"Request(address node,string method,bytes32 body,uint64 timestamp,uint64 nonce)")


def request_digest(node: bytes, method: str, body_hash: bytes, timestamp: int, nonce: int) -> bytes:
    """The EIP-712 digest a client signs for one request (node: 20 address bytes)."""
    struct_hash = keccak(
        _REQUEST_TYPEHASH
        + node.rjust(32, b"\0")
        + _method_hash(method)
        + body_hash
        + timestamp.to_bytes(32, "big")
        + nonce.to_bytes(32, "big")
    )
    return keccak(b"\x19\x01" + DOMAIN_SEPARATOR + struct_hash)


def body_digest(body: bytes) -> bytes:
    """What a signature says of the body: its SHA-256."""
    return hashlib.sha256(body).digest()


@lru_cache(maxsize=64)
def _method_hash(method: str) -> bytes:
    return keccak(method.encode())


@lru_cache(maxsize=4096)
def checksum_address(address: str) -> str:
    """EIP-55 form of a 0x address (cached: a node sees the same clients again and again)."""
    return to_checksum_address(address)


def typed_request(node: str, method: str, body: bytes, timestamp: int, nonce: int) -> dict[str, Any]:
    """The request as a full EIP-712 document (what a wallet is asked to sign)."""
    return {
        "types": {
            "EIP712Domain": DOMAIN_TYPE,
            "Request": REQUEST_TYPE,
        },
        "primaryType": "Request",
        "domain": DOMAIN,
        "message": {
            "node": to_checksum_address(node),
            "method": method,
            "body": body_digest(body),
            "timestamp": timestamp,
            "nonce": nonce,
        },
    }


def sign_request(
    account: Any,
    node: str,
    method: str,
    body: bytes,
    *,
    timestamp: int | None = None,
    nonce: int | None = None,
) -> str:
    """The zoo-signature header value for one request, signed by `account` (an eth_account LocalAccount,
    or a hex private key). Signing goes through eth_account, as a wallet would."""
    from eth_account import Account  # the client's import: the node never signs requests

    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.randbits(64) if nonce is None else nonce
    signed = Account.sign_typed_data(
        account.key if hasattr(account, "key") else account,
        full_message=typed_request(node, method, body, timestamp, nonce),
    )
    signer = Account.from_key(account.key if hasattr(account, "key") else account).address
    return f"signer={signer},timestamp={timestamp},nonce={nonce},signature=0x{bytes(signed.signature).hex()}"


def _fields(header: str, value: str, names: tuple[str, ...], shape: str) -> dict[str, str]:
    """A header's `name=value` parts, each of `names` exactly once; SignatureError('malformed', ...) naming
    what is wrong (zoo-signature and zoo-spend share this form)."""
    if len(value) > 512:
        raise SignatureError("malformed", f"{header} header is {len(value)} characters, more than 512")
    fields: dict[str, str] = {}
    for part in value.split(","):
        name, sep, item = part.strip().partition("=")
        if not sep or name not in names:
            raise SignatureError(
                "malformed", f"{header} header must be {shape} (got a part {ascii(part.strip())[:60]})"
            )
        if name in fields:
            raise SignatureError("malformed", f"{header} header names {name} twice: {shape}, once each")
        fields[name] = item.strip()
    missing = [f for f in names if f not in fields]
    if missing:
        raise SignatureError("malformed", f"{header} header lacks {', '.join(missing)}")
    return fields


def _uint(header: str, name: str, text: str, bits: int) -> int:
    if not _UINT.fullmatch(text) or int(text) >= 2**bits:
        raise SignatureError("malformed", f"{header} {name} must be an integer from 0 to 2**{bits} - 1")
    return int(text)


def _signature(header: str, text: str) -> bytes:
    if not _SIGNATURE.fullmatch(text):
        raise SignatureError("malformed", f"{header} signature must be 0x and 130 hex digits (r, s, v)")
    return bytes.fromhex(text[2:])


def parse_header(value: str) -> SignedHeader:
    """A zoo-signature header's fields; SignatureError('malformed', ...) naming what is wrong."""
    fields = _fields(HEADER, value, _FIELDS, "signer=0x..,timestamp=..,nonce=..,signature=0x..")
    if not _ADDRESS.fullmatch(fields["signer"]):
        raise SignatureError("malformed", f"{HEADER} signer must be 0x and 40 hex digits")
    signature = _signature(HEADER, fields["signature"])
    return SignedHeader(
        checksum_address(fields["signer"]),
        _uint(HEADER, "timestamp", fields["timestamp"], 64),
        _uint(HEADER, "nonce", fields["nonce"], 64),
        signature,
    )


def spend_header(epoch: int, units: int, signature: bytes) -> str:
    """The zoo-spend header value of a spend authorization."""
    return f"epoch={epoch},units={units},signature=0x{bytes(signature).hex()}"


def parse_spend_header(value: str) -> tuple[int, int, bytes]:
    """(epoch, units, signature) of a zoo-spend header; SignatureError("malformed", ...) says why not."""
    fields = _fields(SPEND_HEADER, value, _SPEND_FIELDS, "epoch=..,units=..,signature=0x..")
    return (
        _uint(SPEND_HEADER, "epoch", fields["epoch"], 256),
        _uint(SPEND_HEADER, "units", fields["units"], 256),
        _signature(SPEND_HEADER, fields["signature"]),
    )


def recover_signer(digest: bytes, signature: bytes) -> bytes:
    """The 20-byte address whose key made `signature` (r || s || v, v 27/28 or 0/1) over `digest`.

    Raises SignatureError('forged', ...) for a signature no key could have made, or a malleable one
    (s in the upper half of the curve order, which EIP-2 rules out)."""
    r, s, v = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:64], "big"), signature[64]
    recovery = v - 27 if v >= 27 else v
    if recovery not in (0, 1) or not 0 < r < _SECP256K1_N or not 0 < s <= _SECP256K1_N // 2:
        raise SignatureError(
            "forged", "signature is not a valid secp256k1 signature (r, s or v out of range)"
        )
    try:
        key = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + bytes([recovery]), digest, hasher=None
        )
    except ValueError:
        raise SignatureError("forged", "signature does not recover to any key") from None
    return _address_of(key.format(compressed=False))


@lru_cache(maxsize=4096)
def _address_of(public_key: bytes) -> bytes:
    """The address of an uncompressed public key (cached: the same clients sign again and again)."""
    return keccak(public_key[1:])[12:]
