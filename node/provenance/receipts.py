"""Answer receipts: the serving node's signed statement of what it answered, with which weights.

A receipt is EIP-712 typed data in the domain signed requests use (node/credits/signing.py):

    domain   EIP712Domain(string name,string version) = ("zoo-node", "1")
    message  Receipt(address node,bytes32 model,bytes32 adapter,bytes32 library,bytes32 request,
                     bytes32 prompt,bytes32 output,uint32 promptTokens,uint32 completionTokens,
                     uint64 timestamp,address client,bytes32 proof)

`node` is the signing node's account; `model` and `adapter` the SHA-256 of the weights (zero: none, or
unknown for a remote backend); `library` the root the experiences came from (zero: none); `request` the
SHA-256 of the request's bytes as sent (what a signed request's `body` is, so the receipt names the one
request it answers); `prompt` the SHA-256 of the prompt as the model saw it (the messages after retrieval,
experiences included, and the tools: zoo.inference.provenance.documents); `output` the SHA-256 of the
answer's text (every choice's); the token counts as metered; `timestamp` Unix seconds; `client` the request's
signer (zero: anonymous); `proof` the SHA-256 of the answer's proof of inference (zero: none asked for;
zoo.inference.provenance.answer_proof), so the proof a receipt came with cannot be swapped for another.

The node signs with its own key (DATA_DIR/node.key); anyone recovers the signer from the signature and
compares it with `node`: a forged or altered receipt recovers to another address. A receipt says what the
node claims; it does not by itself show the claim true (docs/security.md, "Receipts").
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import Any

import coincurve
from eth_hash.auto import keccak
from eth_utils import to_checksum_address

from zoo.inference.provenance.documents import output_document, sha256_hex
from zoo.node.credits.signing import DOMAIN, DOMAIN_SEPARATOR, DOMAIN_TYPE, SignatureError, recover_signer
from zoo.registry.errors import ValidationError

RECEIPT_TYPE = [
    {"name": "node", "type": "address"},
    {"name": "model", "type": "bytes32"},
    {"name": "adapter", "type": "bytes32"},
    {"name": "library", "type": "bytes32"},
    {"name": "request", "type": "bytes32"},
    {"name": "prompt", "type": "bytes32"},
    {"name": "output", "type": "bytes32"},
    {"name": "promptTokens", "type": "uint32"},
    {"name": "completionTokens", "type": "uint32"},
    {"name": "timestamp", "type": "uint64"},
    {"name": "client", "type": "address"},
    {"name": "proof", "type": "bytes32"},
]
_TYPEHASH = keccak(
    b"Receipt(address node,bytes32 model,bytes32 adapter,bytes32 library,bytes32 request,bytes32 prompt,"
    b"bytes32 output,uint32 promptTokens,uint32 completionTokens,uint64 timestamp,address client,"
    b"bytes32 proof)"
)
ZERO32 = "0x" + "00" * 32
ZERO_ADDRESS = "0x" + "00" * 20
_HEX32 = re.compile(r"0x[0-9a-f]{64}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_SIGNATURE = re.compile(r"0x[0-9a-f]{130}")
MAX_RECEIPT_CHARS = 4096


@dataclass(frozen=True)
class Receipt:
    """One signed receipt: the message's fields (bytes32 as 0x hex, addresses checksummed) and the node's
    signature (0x, r || s || v)."""

    node: str
    model: str
    adapter: str
    library: str
    request: str
    prompt: str
    output: str
    prompt_tokens: int
    completion_tokens: int
    timestamp: int
    client: str
    proof: str = "0x" + "00" * 32
    signature: str = ""

    def digest(self) -> bytes:
        """The EIP-712 digest the node signs."""
        words = b"".join(
            [
                _TYPEHASH,
                bytes.fromhex(self.node[2:]).rjust(32, b"\0"),
                *(bytes.fromhex(h[2:]) for h in (self.model, self.adapter, self.library, self.request)),
                *(bytes.fromhex(h[2:]) for h in (self.prompt, self.output)),
                self.prompt_tokens.to_bytes(32, "big"),
                self.completion_tokens.to_bytes(32, "big"),
                self.timestamp.to_bytes(32, "big"),
                bytes.fromhex(self.client[2:]).rjust(32, b"\0"),
                bytes.fromhex(self.proof[2:]),
            ]
        )
        return keccak(b"\x19\x01" + DOMAIN_SEPARATOR + keccak(words))

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # flat: asdict's deep copies cost more

    def typed_data(self) -> dict[str, Any]:
        """The full EIP-712 document (what eth_account or a wallet verifies)."""
        message = {
            "node": self.node, "model": self.model, "adapter": self.adapter, "library": self.library,
            "request": self.request, "prompt": self.prompt, "output": self.output,
            "promptTokens": self.prompt_tokens, "completionTokens": self.completion_tokens,
            "timestamp": self.timestamp, "client": self.client, "proof": self.proof,
        }  # fmt: skip
        return {
            "types": {
                "EIP712Domain": DOMAIN_TYPE,
                "Receipt": RECEIPT_TYPE,
            },
            "primaryType": "Receipt",
            "domain": DOMAIN,
            "message": message,
        }


def hex32(value: str) -> str:
    """A 64-hex-digit hash or root as 0x-prefixed lower case; "" becomes zero (none)."""
    if not value:
        return ZERO32
    text = value.lower() if value.startswith("0x") else "0x" + value.lower()
    if not _HEX32.fullmatch(text):
        raise ValidationError("receipt", f"not a 32-byte hash: {value[:80]!r}")
    return text


def sign(receipt: Receipt, private_key: bytes | coincurve.PrivateKey) -> Receipt:
    """`receipt` signed with the node's key (its `node` must be that key's address)."""
    key = private_key if isinstance(private_key, coincurve.PrivateKey) else coincurve.PrivateKey(private_key)
    signature = key.sign_recoverable(receipt.digest(), hasher=None)
    r_s, recovery = signature[:64], signature[64]
    return replace(receipt, signature="0x" + (r_s + bytes([27 + recovery])).hex())


def parse(data: dict[str, Any] | str) -> Receipt:
    """A receipt from its JSON (a dict or text); ValidationError naming the field that is wrong."""
    if isinstance(data, str):
        if len(data) > MAX_RECEIPT_CHARS:
            raise ValidationError("receipt", f"is {len(data)} characters, more than {MAX_RECEIPT_CHARS}")
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise ValidationError("receipt", f"is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValidationError("receipt", "must be a JSON object")
    names = set(Receipt.__dataclass_fields__)
    unknown, missing = set(data) - names, names - set(data)
    if unknown or missing:
        raise ValidationError("receipt", f"fields unknown: {sorted(unknown)}, missing: {sorted(missing)}")
    for field in ("model", "adapter", "library", "request", "prompt", "output", "proof"):
        if not isinstance(data[field], str) or not _HEX32.fullmatch(data[field]):
            raise ValidationError(f"receipt.{field}", "must be 0x and 64 lower-case hex digits")
    for field in ("node", "client"):
        if not isinstance(data[field], str) or not _ADDRESS.fullmatch(data[field]):
            raise ValidationError(f"receipt.{field}", "must be an address: 0x and 40 hex digits")
    for field, bits in (("prompt_tokens", 32), ("completion_tokens", 32), ("timestamp", 64)):
        value = data[field]
        if type(value) is not int or not 0 <= value < 2**bits:
            raise ValidationError(f"receipt.{field}", f"must be an integer from 0 to 2**{bits} - 1")
    if not isinstance(data["signature"], str) or not _SIGNATURE.fullmatch(data["signature"]):
        raise ValidationError("receipt.signature", "must be 0x and 130 lower-case hex digits (r, s, v)")
    addresses = {f: to_checksum_address(data[f]) for f in ("node", "client")}
    return Receipt(**{**data, **addresses})


def signer_of(receipt: Receipt) -> str:
    """The address whose key signed `receipt` (SignatureError 'forged' for a signature no key made)."""
    return to_checksum_address(recover_signer(receipt.digest(), bytes.fromhex(receipt.signature[2:])))


def check(receipt: Receipt) -> None:
    """SignatureError unless `receipt` was signed by the node it names."""
    signer = signer_of(receipt)
    if signer != receipt.node:
        raise SignatureError(
            "forged",
            f"receipt is signed by {signer}, not by the node it names ({receipt.node}): forged or altered",
        )


# The SHA-256 (0x hex) of the request's bytes as received, set by the gRPC interceptor for each public call
# (node/api/interceptor.py); "" where no bytes were kept, and the servicer hashes the decoded message.
REQUEST_SHA256: ContextVar[str] = ContextVar("zoo_request_sha256", default="")


class Notary:
    """Signs this node's receipts: its key and account, and the hashes of what it serves."""

    def __init__(
        self, key: bytes, node: str, model_sha256: str, adapter_sha256: Callable[[str], str] | None = None
    ) -> None:
        self._key = coincurve.PrivateKey(key)
        self.node = to_checksum_address(node)
        self.model = hex32(model_sha256)
        self.adapter_sha256 = adapter_sha256

    def receipt(
        self, outcome: Any, request_sha256: str, client: str, timestamp: int | None = None
    ) -> Receipt:
        """The signed receipt of `outcome` (an InferOutcome) answering the request hashed `request_sha256`
        for `client` ("" when anonymous)."""
        texts = [c.text for c in outcome.choices] or [outcome.text]
        adapter = ZERO32
        if outcome.adapter and self.adapter_sha256 is not None:
            adapter = hex32(self.adapter_sha256(outcome.adapter))
        unsigned = Receipt(
            node=self.node,
            model=self.model,
            adapter=adapter,
            library=hex32(outcome.library_root),
            request=hex32(request_sha256),
            prompt=hex32(outcome.prompt_sha256),
            output=sha256_hex(output_document(texts)),
            prompt_tokens=min(outcome.prompt_tokens, 2**32 - 1),
            completion_tokens=min(outcome.completion_tokens, 2**32 - 1),
            timestamp=int(time.time()) if timestamp is None else timestamp,
            client=to_checksum_address(client) if client else ZERO_ADDRESS,
            proof=outcome.proof.sha256() if outcome.proof is not None else ZERO32,
        )
        return sign(unsigned, self._key)


__all__ = [
    "RECEIPT_TYPE", "REQUEST_SHA256", "ZERO32", "ZERO_ADDRESS", "Notary", "Receipt", "check", "hex32",
    "parse", "sign", "signer_of",
]  # fmt: skip
