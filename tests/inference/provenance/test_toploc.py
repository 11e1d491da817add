"""TOPLOC commitments (zoo.inference.provenance.toploc) on synthetic hidden states: sizes, the polynomial,
tolerance of rounding noise, rejection of other states, and malformed proofs. On a real model's hidden
states: tests/inference/llamacpp/test_proofs.py and `./zoo bench provenance`."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.inference.provenance import toploc
from zoo.inference.provenance.toploc import CHUNK_BYTES, CHUNK_TOKENS, PRIME, TOP_K, ProofError

HIDDEN = 576  # SmolLM2-135M's hidden size


def states(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, HIDDEN)) * 3).astype(np.float32)


def noisy(h: np.ndarray, relative: float, seed: int = 1) -> np.ndarray:
    return (h * (1 + relative * np.random.default_rng(seed).standard_normal(h.shape))).astype(np.float32)


def test_a_proof_is_258_bytes_per_32_positions() -> None:
    assert CHUNK_BYTES == 258
    for n in (1, 32, 33, 70):
        assert len(toploc.commit(states(n))) == CHUNK_BYTES * -(-n // CHUNK_TOKENS)


def test_the_polynomial_gives_back_every_committed_value() -> None:
    indices, values = toploc.top_entries(states(32))
    m = toploc.injective_modulus(indices)
    coefficients = toploc.interpolate(indices % m, values)
    assert coefficients.size == TOP_K and (coefficients < PRIME).all()
    assert (toploc.evaluate(coefficients, indices % m) == values).all()


def test_bf16_rounding_is_to_nearest_even() -> None:
    # bf16's step at 1.0 is 2**-7: above half a step rounds up, half a step goes to the even neighbour.
    values = np.array([1 + 2**-8 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, -2.0], dtype=np.float32)
    assert [hex(b) for b in toploc.bf16_bits(values)] == ["0x3f81", "0x3f80", "0x3f82", "0x3f80", "0xc000"]


@pytest.mark.parametrize("relative", [0.0, 1e-3, 1e-2])
def test_the_same_states_with_another_machine_s_rounding_are_accepted(relative: float) -> None:
    h = states(70)
    checks = toploc.check(noisy(h, relative), toploc.commit(h))
    assert len(checks) == 3 and all(c.accepted() for c in checks), [c.describe() for c in checks]


def test_other_states_are_rejected_chunk_by_chunk() -> None:
    h, other = states(64), states(64, seed=7)
    assert [c.accepted() for c in toploc.check(other, toploc.commit(h))] == [False, False]
    # Only the second chunk differs: only it is rejected.
    mixed = np.concatenate([h[:32], other[32:]])
    checks = toploc.check(mixed, toploc.commit(h))
    assert [c.accepted() for c in checks] == [True, False] and checks[1].exponent_matches < 40


def test_values_scaled_a_little_fail_on_the_mantissa() -> None:
    h = states(32)
    (c,) = toploc.check(h * np.float32(1.08), toploc.commit(h))
    assert not c.accepted() and c.mantissa_mean > toploc.PAPER.max_mantissa_mean


@pytest.mark.parametrize(
    ("proof", "words"),
    [
        (b"", "multiple of 258"),
        (b"\x00" * 257, "multiple of 258"),
        ((1000).to_bytes(2, "little") + b"\x00" * 256, "modulus 1000"),
        ((65497).to_bytes(2, "little") + b"\xff\xff" * 128, "coefficient"),
    ],
)
def test_bytes_that_are_no_proof_are_refused_in_words(proof: bytes, words: str) -> None:
    with pytest.raises(ProofError, match=words):
        toploc.check(states(32), proof)


def test_a_proof_for_another_output_length_or_unusable_states_is_refused() -> None:
    proof = toploc.commit(states(40))
    with pytest.raises(ProofError, match="2 chunks; 70 positions make 3"):
        toploc.check(states(70), proof)
    bad = states(32)
    bad[3, 5] = np.nan
    with pytest.raises(ProofError, match="NaN"):
        toploc.commit(bad)
    with pytest.raises(ProofError, match="matrix"):
        toploc.commit(np.zeros((0, HIDDEN), dtype=np.float32))
