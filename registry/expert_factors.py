"""Expert factors: the token-level decode-time factors an experience may carry (its `factors` field).

Token token_ids[i] gets sign(i) * scales[i // block_size] (inference/factors.py weighs the factors of the
experiences in a prompt into one logits bias). Token ids are sorted and unique, signs are packed one bit a
token (pack_signs), and scales are float32 values, one a block of `block_size` consecutive token ids, held
and encoded (base64) as their little-endian bytes; the tokenizer names the vocabulary the ids belong to.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import Struct, field

from zoo.registry.errors import ValidationError
from zoo.registry.validation import (
    MAX_NAME_CHARS,
    STRUCT_OPTIONS,
    Problem,
    Problems,
    as_name,
    as_number,
    check_clean,
)

MAX_FACTOR_TOKENS = 1 << 20
MAX_TOKEN_ID = (1 << 32) - 1
MAX_SCALE = 100.0


def to_float32(value: float) -> float:
    """The float32 value nearest to `value`, as a Python float; overflow is an error, not infinity."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise Problem("value", f"{value} is outside the float32 range") from None


def pack_signs(signs: Sequence[int]) -> bytes:
    """Pack ±1 values into bits, least significant bit first (numpy's packbits(bitorder="little")); 1 = +1."""
    out = bytearray((len(signs) + 7) // 8)
    for i, s in enumerate(signs):
        if s == 1:
            out[i >> 3] |= 1 << (i & 7)
        elif s != -1:
            raise Problem("signs", f"sign {i} is {s}, not +1 or -1")
    return bytes(out)


class ExpertFactors(Struct, **STRUCT_OPTIONS):  # type: ignore[call-arg]
    """Token-level decode-time factors: token_ids[i] gets sign(i) * scales[i // block_size].

    Signs are packed one bit per token (see pack_signs). Scales are float32 values, one per block of
    `block_size` consecutive token ids, held (and encoded, base64) as their little-endian bytes.
    """

    block_size: int
    scales_bytes: bytes = field(name="scales")
    signs: bytes
    token_ids: tuple[int, ...]
    tokenizer: str

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not 0 < len(self.tokenizer) <= MAX_NAME_CHARS:
            raise Problem("tokenizer", f"must have 1 to {MAX_NAME_CHARS} characters")
        check_clean(self.tokenizer, "tokenizer")
        if not 1 <= self.block_size <= MAX_FACTOR_TOKENS:
            raise Problem("block_size", f"must be between 1 and {MAX_FACTOR_TOKENS} (got {self.block_size})")
        if not 0 < n <= MAX_FACTOR_TOKENS:
            raise Problem("token_ids", f"must hold 1 to {MAX_FACTOR_TOKENS} token ids (got {n})")
        previous = -1
        for i, t in enumerate(self.token_ids):
            if not 0 <= t <= MAX_TOKEN_ID:
                raise Problem("token_ids", f"token id {t} at index {i} is outside [0, 2**32)")
            if t <= previous:
                raise Problem("token_ids", f"must be strictly increasing (sorted, unique); see index {i}")
            previous = t
        if len(self.signs) != (n + 7) // 8:
            raise Problem("signs", f"{len(self.signs)} bytes for {n} tokens, need {(n + 7) // 8}")
        if n % 8 and self.signs[-1] >> (n % 8):
            raise Problem("signs", "padding bits after the last token must be zero")
        if len(self.scales_bytes) % 4:
            raise Problem("scales", f"{len(self.scales_bytes)} bytes is not a whole number of float32 values")
        blocks = -(-n // self.block_size)
        scales = self.scales
        if len(scales) != blocks:
            raise Problem("scales", f"{len(scales)} values for {n} tokens in blocks of {self.block_size}; "
                                    f"need {blocks}")  # fmt: skip
        for i, s in enumerate(scales):
            _check_scale(i, s)

    @property
    def scales(self) -> tuple[float, ...]:
        return struct.unpack(f"<{len(self.scales_bytes) // 4}f", self.scales_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as Python values, what create() and parse() take back."""
        return {
            "tokenizer": self.tokenizer,
            "token_ids": self.token_ids,
            "signs": self.signs,
            "block_size": self.block_size,
            "scales": self.scales,
        }

    def sign_values(self) -> list[int]:
        """The signs unpacked to +1/-1, one per token id."""
        return [1 if self.signs[i >> 3] >> (i & 7) & 1 else -1 for i in range(len(self.token_ids))]

    @classmethod
    def create(cls, *, tokenizer: object, token_ids: object, signs: object, scales: object,
               block_size: object = 64) -> ExpertFactors:  # fmt: skip
        """Validate factors given as Python values: signs as packed bytes or a list of ±1, scales as
        numbers (rounded to float32)."""
        p = Problems()
        f = p.check(factors_from_mapping, {"tokenizer": tokenizer, "token_ids": token_ids, "signs": signs,
                               "scales": scales, "block_size": block_size})  # fmt: skip
        p.raise_if_any()
        return f

    @classmethod
    def parse(cls, data: object) -> ExpertFactors:
        """create() from a mapping (e.g. decoded JSON); unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ValidationError("factors", "must be an object")
        p = Problems()
        f = p.check(factors_from_mapping, data)
        p.raise_if_any()
        return f


_FACTOR_FIELDS = frozenset({"tokenizer", "token_ids", "signs", "scales", "block_size"})


def factors_from_mapping(data: Mapping[str, Any]) -> ExpertFactors:
    """Expert factors from a mapping of Python values; raises the first Problem."""
    unknown = sorted(str(k) for k in data if k not in _FACTOR_FIELDS)
    if unknown:
        raise Problem(unknown[0], "is not a field here (unknown fields are refused)")
    name = as_name(data.get("tokenizer"), "tokenizer")
    token_ids = data.get("token_ids")
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Iterable):
        raise Problem("token_ids", "must be a list of integers", token_ids)
    ids = tuple(token_ids)
    if not all(type(t) is int for t in ids):
        raise Problem("token_ids", "must hold only integers", token_ids)
    block_size = data.get("block_size", 64)
    if type(block_size) is not int:
        raise Problem("block_size", f"must be an integer (got {type(block_size).__name__})", block_size)
    return ExpertFactors(block_size=block_size, scales_bytes=_scales(data.get("scales")),
                         signs=_signs(data.get("signs")), token_ids=ids, tokenizer=name)  # fmt: skip


def _signs(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, list | tuple):
        if not all(type(s) is int for s in value):
            raise Problem("signs", "a list of signs must hold only the integers +1 and -1")
        return pack_signs(value)
    raise Problem("signs", "must be packed bits (bytes) or a list of +1/-1", value)


def _scales(value: object) -> bytes:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise Problem("scales", "must be a list of numbers", value)
    floats = []
    for i, s in enumerate(value):
        f = as_number(s, "scales")
        _check_scale(i, f)  # before packing: a finite float beyond float32's range cannot be packed
        floats.append(f)
    return struct.pack(f"<{len(floats)}f", *floats)


def _check_scale(i: int, s: float) -> None:
    if not math.isfinite(s):
        raise Problem("scales", f"scale {i} is not a finite number")
    # A scale is a mean |log-boost|: negative makes no sense, and beyond MAX_SCALE (e^100) it only serves
    # to overflow the float32 logits bias once weighted.
    if not 0.0 <= s <= MAX_SCALE:
        raise Problem("scales", f"scale {i} must be in [0, {MAX_SCALE:g}] (got {s:g})")
