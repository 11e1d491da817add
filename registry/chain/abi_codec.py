"""An ABI codec for reading the registry's events and calls that survives hostile strings."""

from __future__ import annotations

from eth_abi.codec import ABICodec
from eth_abi.decoding import StringDecoder
from eth_abi.encoding import TextStringEncoder
from eth_abi.registry import registry as default_registry


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
