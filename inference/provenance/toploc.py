"""TOPLOC commitments to a model's last hidden states, and their check (Ong et al. 2025, "TOPLOC: a
locality sensitive hashing scheme for trustless verifiable inference", arXiv 2501.16007).

What is committed: the last hidden state (after the final norm, the input of the LM head) at every position
that produced a generated token, in chunks of CHUNK_TOKENS positions. Per chunk, the states are flattened
and the TOP_K entries of largest magnitude kept: their flat indices and their values rounded to bfloat16.

How (258 bytes a chunk): the polynomial P of degree < TOP_K over GF(PRIME) with P(index mod m) = the value's
bfloat16 bits for every kept entry, where m, the largest modulus from MAX_MODULUS down under which the kept
indices stay distinct, is stored first (2 bytes), then P's TOP_K coefficients (2 bytes each, little-endian).

How it is checked: whoever holds the same weights recomputes the hidden states with one prefill of prompt and
output, takes its own top entries per chunk and evaluates P at its own indices. Where its indices are the
prover's, P gives back the prover's values: their sign and exponent match, and their mantissas differ by the
rounding noise of another machine. Where they are not, P gives noise. A chunk is accepted when at least
`min_exponent_matches` of the TOP_K exponents match and the mantissa differences of those have a mean and
a median of at most `max_mantissa_mean` and `max_mantissa_median` (Thresholds; the paper's, for bf16 models
of 8B parameters: PAPER).

The paper's thresholds are tolerant because honest GPUs differ in their rounding. On the bundled
SmolLM2-135M through llama.cpp they are far too tolerant: its top entries sit in about 16 outlier channels
of 576, and another quantization (Q8_0 for Q4_1), a fine-tune, another prompt or a changed token all stay
within them (2-41 % of cheats caught over 100 each, ./zoo bench provenance). There, the prover decodes
a proving row exactly as the verifier's prefill computes it (inference.llamacpp.prefill), so on the same
kernels the states match bit for bit up to position 256 (past it, where llama.cpp's KV view doubles, a few
roundings flip: mantissa means up to 0.99 measured), and SAME_KERNELS leaves room for that alone;
the cheats' worst chunks have mantissa means of 2.3 and more. Another instruction set's
arithmetic (AVX2 against AVX-512: means up to 4.5) overlaps the cheats, so proofs are checked by the
kernels that made them (answer_proof). The transformers backend commits to the states of the verifier's own
prefill (inference.transformers_scheduler), which match bit for bit on the same kernels: SAME_KERNELS too.

Written by hand: the `toploc` package on PyPI ships C++ extensions built against one torch ABI (0.1.6 does not
import with torch 2.13), and the construction is a few dozen lines of modular arithmetic over numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zoo.registry.errors import ZooError

CHUNK_TOKENS = 32
TOP_K = 128
PRIME = 65521  # the largest prime below 2**16: coefficients fit two bytes; bf16 bits at or above it are NaNs
MAX_MODULUS = 65497
MIN_MODULUS = 1 << 15
CHUNK_BYTES = 2 + 2 * TOP_K


class ProofError(ZooError, ValueError):
    """Hidden states or proof bytes that cannot be committed or checked; the message says why."""


@dataclass(frozen=True)
class Thresholds:
    """When a chunk is accepted: at least `min_exponent_matches` of TOP_K sign-and-exponent matches, whose
    mantissa differences have at most this mean and median."""

    min_exponent_matches: int
    max_mantissa_mean: float
    max_mantissa_median: float


PAPER = Thresholds(90, 10.0, 8.0)  # the paper's, for bf16 models of 8B parameters
# The local backends', the same kernels verifying (module docstring; ./zoo bench provenance, 528 honest
# llama.cpp answers under both instruction sets): honest chunks match 125-128 of 128 with means 0-0.99
# (above 0 only past position 256); every cheat's worst chunk has a mean of 2.3 or more. Transformers:
# honest chunks match exactly (./zoo bench provenance --backend transformers).
SAME_KERNELS = Thresholds(120, 1.5, 1.0)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as their 16-bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.int64)


def top_entries(states: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, bf16 bits) of the k entries of `states` with the largest magnitude, largest first (ties
    by index)."""
    flat = np.ascontiguousarray(states, dtype=np.float32).reshape(-1)
    if flat.size < k:
        raise ProofError(f"a chunk of {flat.size} hidden values is smaller than top-k = {k}")
    if not np.isfinite(flat).all():
        raise ProofError("the hidden states hold NaN or infinite values")
    order = np.lexsort((np.arange(flat.size), -np.abs(flat)))[:k]
    return order.astype(np.int64), bf16_bits(flat[order])


def injective_modulus(indices: np.ndarray) -> int:
    """The largest m <= MAX_MODULUS under which `indices` stay distinct."""
    for m in range(MAX_MODULUS, MIN_MODULUS, -1):
        if np.unique(indices % m).size == indices.size:
            return m
    raise ProofError("no modulus keeps the top indices distinct")  # not seen for k = 128


def _inverse(a: np.ndarray) -> np.ndarray:
    """Modular inverses (Fermat: a ** (PRIME - 2)) of a vector of non-zero residues."""
    result, base, e = np.ones_like(a), a % PRIME, PRIME - 2
    while e:
        if e & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        e >>= 1
    return result


def interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Coefficients (lowest degree first) of the polynomial over GF(PRIME) through (xs, ys); xs distinct."""
    xs, coef = xs.astype(np.int64) % PRIME, ys.astype(np.int64) % PRIME
    n = xs.size
    for j in range(1, n):  # Newton's divided differences
        coef[j:] = (coef[j:] - coef[j - 1 : -1]) % PRIME * _inverse(xs[j:] - xs[: n - j]) % PRIME
    poly = np.zeros(n, dtype=np.int64)
    poly[0] = coef[n - 1]
    for j in range(n - 2, -1, -1):  # Newton form to monomials: poly = poly * (X - x_j) + c_j
        shifted = np.concatenate(([0], poly[:-1]))
        poly = (shifted - xs[j] * poly) % PRIME
        poly[0] = (poly[0] + coef[j]) % PRIME
    return poly


def evaluate(coefficients: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """P(x) mod PRIME for each x (Horner)."""
    xs = xs.astype(np.int64) % PRIME
    out = np.zeros_like(xs)
    for c in coefficients[::-1]:
        out = (out * xs + int(c)) % PRIME
    return out


def commit_chunk(states: np.ndarray) -> bytes:
    """The CHUNK_BYTES commitment to one chunk of hidden states (rows: positions)."""
    indices, values = top_entries(states)
    if (values >= PRIME).any():
        raise ProofError("a top hidden value rounds to a NaN pattern")
    m = injective_modulus(indices)
    coefficients = interpolate(indices % m, values)
    return m.to_bytes(2, "little") + coefficients.astype("<u2").tobytes()


def commit(states: np.ndarray) -> bytes:
    """Commitments to every chunk of CHUNK_TOKENS rows of `states` (positions x hidden size), concatenated."""
    states = np.asarray(states, dtype=np.float32)
    if states.ndim != 2 or states.shape[0] == 0:
        raise ProofError(f"hidden states must be a non-empty matrix of positions, not shape {states.shape}")
    return b"".join(commit_chunk(states[i : i + CHUNK_TOKENS]) for i in range(0, len(states), CHUNK_TOKENS))


@dataclass(frozen=True)
class ChunkCheck:
    """How one chunk's recomputed top values compare with what its commitment gives back."""

    exponent_matches: int
    mantissa_mean: float
    mantissa_median: float

    def accepted(self, t: Thresholds = PAPER) -> bool:
        return (
            self.exponent_matches >= t.min_exponent_matches
            and self.mantissa_mean <= t.max_mantissa_mean
            and self.mantissa_median <= t.max_mantissa_median
        )

    def describe(self, t: Thresholds = PAPER) -> str:
        return (
            f"{self.exponent_matches} of {TOP_K} exponents match (at least {t.min_exponent_matches}), "
            f"mantissa difference mean {self.mantissa_mean:.2f} (at most {t.max_mantissa_mean:g}) and median "
            f"{self.mantissa_median:.1f} (at most {t.max_mantissa_median:g})"
        )


def chunks_of(proof: bytes) -> list[tuple[int, np.ndarray]]:
    """(modulus, coefficients) of each chunk of `proof`; ProofError for bytes that are not a proof."""
    if not proof or len(proof) % CHUNK_BYTES:
        raise ProofError(f"a proof is a multiple of {CHUNK_BYTES} bytes, not {len(proof)}")
    out = []
    for at in range(0, len(proof), CHUNK_BYTES):
        m = int.from_bytes(proof[at : at + 2], "little")
        if not MIN_MODULUS < m <= MAX_MODULUS:
            raise ProofError(
                f"chunk {at // CHUNK_BYTES}: modulus {m} is outside ({MIN_MODULUS}, {MAX_MODULUS}]"
            )
        coefficients = np.frombuffer(proof[at + 2 : at + CHUNK_BYTES], dtype="<u2").astype(np.int64)
        if (coefficients >= PRIME).any():
            raise ProofError(f"chunk {at // CHUNK_BYTES}: a coefficient is not below {PRIME}")
        out.append((m, coefficients))
    return out


def check_chunk(states: np.ndarray, modulus: int, coefficients: np.ndarray) -> ChunkCheck:
    indices, mine = top_entries(states)
    theirs = evaluate(coefficients, indices % modulus)
    exponent_match = (mine >> 7) == (theirs >> 7)  # sign and exponent
    differences = np.abs((mine & 0x7F) - (theirs & 0x7F))[exponent_match]
    if differences.size == 0:
        return ChunkCheck(0, float("inf"), float("inf"))
    return ChunkCheck(int(exponent_match.sum()), float(differences.mean()), float(np.median(differences)))


def check(states: np.ndarray, proof: bytes) -> list[ChunkCheck]:
    """Each chunk of `proof` checked against the recomputed `states`; ProofError when they do not have the
    same number of chunks (another output length)."""
    states = np.asarray(states, dtype=np.float32)
    chunks = chunks_of(proof)
    expected = -(-states.shape[0] // CHUNK_TOKENS) if states.ndim == 2 else -1
    if len(chunks) != expected:
        raise ProofError(f"the proof has {len(chunks)} chunks; {states.shape[0]} positions make {expected}")
    return [
        check_chunk(states[i * CHUNK_TOKENS : (i + 1) * CHUNK_TOKENS], m, coefficients)
        for i, (m, coefficients) in enumerate(chunks)
    ]
