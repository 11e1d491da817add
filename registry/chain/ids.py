"""Proposal ids: ExperienceRegistry.hashProposal, hashCallProposal and hashCall computed locally, and how ids
are shown and read back."""

from __future__ import annotations

from eth_abi import encode as abi_encode
from hexbytes import HexBytes
from web3 import Web3


def to_bytes32(value: bytes | str) -> bytes:
    """32 bytes from bytes or 0x-hex; ValueError for any other length."""
    raw = bytes(HexBytes(value))
    if len(raw) != 32:
        raise ValueError(f"expected 32 bytes, got {len(raw)}")
    return raw


def proposal_id(
    root: bytes | str, tree_size: int, cid: str, parent_version: int, proposer: str, salt: bytes | str
) -> int:
    """ExperienceRegistry.hashProposal, computed locally: the id a proposal with these fields gets."""
    encoded = abi_encode(
        ["bytes32", "uint256", "bytes32", "uint256", "address", "bytes32"],
        [
            to_bytes32(root),
            int(tree_size),
            Web3.keccak(text=cid),
            int(parent_version),
            Web3.to_checksum_address(proposer),
            to_bytes32(salt),
        ],
    )
    return int.from_bytes(Web3.keccak(encoded), "big")


def call_proposal_id(target: str, data: bytes, proposer: str, salt: bytes | str) -> int:
    """ExperienceRegistry.hashCallProposal, computed locally: the id a call proposal gets."""
    encoded = abi_encode(
        ["string", "address", "bytes32", "address", "bytes32"],
        [
            "zoo.call",
            Web3.to_checksum_address(target),
            Web3.keccak(bytes(data)),
            Web3.to_checksum_address(proposer),
            to_bytes32(salt),
        ],
    )
    return int.from_bytes(Web3.keccak(encoded), "big")


def call_hash(target: str, data: bytes) -> bytes:
    """ExperienceRegistry.hashCall, computed locally: the key identical calls share in callExecutions."""
    encoded = abi_encode(["address", "bytes32"], [Web3.to_checksum_address(target), Web3.keccak(bytes(data))])
    return bytes(Web3.keccak(encoded))


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
