"""Answer receipts (node.provenance.receipts): the digest is EIP-712's as eth_account computes it, the
node's signature recovers to the node, and a forged, altered or malformed receipt is refused."""

from __future__ import annotations

import dataclasses
import json
import os

import coincurve
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_hash.auto import keccak
from eth_utils import to_checksum_address

from zoo.inference.provenance.documents import output_document, prompt_document, sha256_hex
from zoo.node.credits.signing import SignatureError
from zoo.node.provenance.receipts import ZERO_ADDRESS, Receipt, check, parse, sign, signer_of
from zoo.registry.errors import ValidationError


def node_key() -> tuple[bytes, str]:
    key = coincurve.PrivateKey(os.urandom(32))
    return key.secret, to_checksum_address(keccak(key.public_key.format(compressed=False)[1:])[12:])


def receipt_of(node: str, **changes: object) -> Receipt:
    fields = dict(
        node=node, model=sha256_hex(b"weights"), adapter="0x" + "00" * 32, library="0x" + "ab" * 32,
        request=sha256_hex(b"request bytes"),
        prompt=sha256_hex(prompt_document([{"role": "user", "content": "hi"}], None)),
        output=sha256_hex(output_document(["Hello."])), prompt_tokens=12, completion_tokens=3,
        timestamp=1_790_000_000, client=ZERO_ADDRESS,
    )  # fmt: skip
    return Receipt(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_signed_receipt_recovers_to_its_node_as_eth_account_says() -> None:
    secret, node = node_key()
    signed = sign(receipt_of(node), secret)
    check(signed)
    assert signer_of(signed) == node
    # The digest by hand is EIP-712's: eth_account recovers the same signer from the full document.
    message = encode_typed_data(full_message=signed.typed_data())
    assert Account.recover_message(message, signature=bytes.fromhex(signed.signature[2:])) == node
    assert parse(json.dumps(signed.to_json())) == signed


@pytest.mark.parametrize(
    "field, value",
    [("model", sha256_hex(b"other weights")), ("library", "0x" + "cd" * 32), ("output", sha256_hex(b"Bye.")),
     ("prompt_tokens", 13), ("completion_tokens", 2), ("timestamp", 1_790_000_001),
     ("client", to_checksum_address("0x" + "11" * 20)), ("request", sha256_hex(b"another request")),
     ("proof", sha256_hex(b"another proof"))],
)  # fmt: skip
def test_an_altered_receipt_is_refused(field: str, value: object) -> None:
    secret, node = node_key()
    altered = dataclasses.replace(sign(receipt_of(node), secret), **{field: value})
    with pytest.raises(SignatureError, match="forged or altered"):
        check(altered)


def test_a_receipt_signed_by_another_key_or_no_key_is_refused() -> None:
    _secret, node = node_key()
    other_secret, _ = node_key()
    with pytest.raises(SignatureError, match="not by the node it names"):
        check(sign(receipt_of(node), other_secret))
    unsigned = receipt_of(node, signature="0x" + "ff" * 65)
    with pytest.raises(SignatureError) as e:
        check(unsigned)
    assert e.value.reason == "forged"


@pytest.mark.parametrize(
    "change, field",
    [({"model": "0x12"}, "receipt.model"), ({"node": "nobody"}, "receipt.node"),
     ({"prompt_tokens": -1}, "receipt.prompt_tokens"), ({"timestamp": 2**64}, "receipt.timestamp"),
     ({"signature": "0x00"}, "receipt.signature"), ({"extra": 1}, "receipt"),
     ({"prompt_tokens": "12"}, "receipt.prompt_tokens"), ({"proof": "0x" + "AB" * 32}, "receipt.proof")],
)  # fmt: skip
def test_a_malformed_receipt_names_its_field(change: dict, field: str) -> None:
    secret, node = node_key()
    data = {**sign(receipt_of(node), secret).to_json(), **change}
    with pytest.raises(ValidationError) as e:
        parse(data)
    assert e.value.field == field
    for text in ("not json", "[1]", "x" * 5000):
        with pytest.raises(ValidationError):
            parse(text)
