"""Proofs of inference: what a node sends beside an answer so that any holder of the same weights can check,
with one prefill, that these tokens came from these weights given this prompt (docs/security.md, "Proofs").

A proof (`zoo.answer-proof/1`, JSON) names the weights' SHA-256, the kernels that computed it (a verifier
checks only proofs its own kernels made: another instruction set moves the states as much as another
quantization), the prompt as the model saw it (token ids, experiences and chat template included), every
generated token (an ending EOS included), the sampling that chose them, and TOPLOC commitments (toploc.py)
to the last hidden state at each position that produced a generated token: 258 bytes per 32 tokens.

The verifier feeds prompt and output through its own copy of the weights in one prefill and, at each of
those positions, reads the last hidden state and the logits. It accepts when both hold:

- every chunk's commitment matches its recomputed states (toploc.check_chunk, this backend's thresholds):
  binds the weights, the prompt and every output token but the last to the states;
- every output token is one the stated sampler could have chosen from the recomputed logits (the rule
  "greedy": the most likely token, within GREEDY_MARGIN of it, for a greedy unconstrained request;
  "nucleus": inside the top-p nucleus at the stated temperature, within NUCLEUS_SLACK of probability mass;
  "sampled", for top-p 1 or a constrained request: a token the verifier's logits give at least MIN_LOGPROB
  at the stated temperature). This is what binds the last token, which no committed state reads.

`verify` takes the recomputed states and logits; the backend computes them (inference.llamacpp.prefill).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo.inference.provenance import toploc
from zoo.inference.provenance.toploc import CHUNK_BYTES, CHUNK_TOKENS, ChunkCheck, ProofError, Thresholds

FORMAT = "zoo.answer-proof/1"
MAX_PROOF_CHARS = 1 << 20  # 1 MiB of JSON: a 2,048-token context's proof is about 30 KB
MAX_TOKENS = 32_768  # prompt and output together
# New tokens a proof is made for at most. Measured (`./zoo bench provenance`, llama.cpp, AVX-512, 2
# threads): 0 false rejections in 528 answers of up to 64 tokens; with up to 256, 8 of 48 honest answers
# refused, their chunks past the fourth drifting to mantissa means of 3.0 (Q8_0's start at 2.2), so no
# threshold keeps both the honest and the cheats apart there.
MAX_PROVEN_TOKENS = 64
# Greedy: the logit of the chosen token may trail the verifier's best by this much. Two honest machines can
# disagree on the argmax only where the two best logits are this close (measured: ./zoo bench provenance).
GREEDY_MARGIN = 0.5
# Top-p below 1: the probability mass of the tokens more likely than the chosen one may exceed top-p by
# this much (the two machines' logits differ a little near the nucleus's edge; measured as GREEDY_MARGIN).
NUCLEUS_SLACK = 0.05
MAX_NUCLEUS_MASS = 0.999  # ...but never up to all of it: a token no sampler can reach has mass 1 above it
# Top-p 1, or constrained: the token's log-probability at the stated temperature, under the verifier's raw
# logits (before a grammar mask or expert factors), must be at least this. The whole mass below it is at
# most vocabulary size x e^-30 (under 1e-8 for 49,152 tokens): an honest sample falls there at that rate.
MIN_LOGPROB = -30.0
_FIELDS = ("format", "model", "adapter", "kernels", "prompt_ids", "output_ids", "temperature", "top_p",
           "constrained", "commitments")  # fmt: skip
MAX_KERNELS_CHARS = 200


@dataclass(frozen=True)
class AnswerProof:
    """One answer's proof: hashes as 0x hex (adapter zero: none), token ids, sampling, commitments."""

    model: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    temperature: float
    top_p: float
    commitments: bytes
    constrained: bool = False  # a grammar (JSON, tools) or expert factors shaped the logits
    adapter: str = "0x" + "00" * 32
    kernels: str = (
        ""  # what computed the states (inference.llamacpp.prefill.kernels): a verifier's must match
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "adapter": self.adapter,
            "kernels": self.kernels,
            "prompt_ids": list(self.prompt_ids),
            "output_ids": list(self.output_ids),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "constrained": self.constrained,
            "commitments": base64.b64encode(self.commitments).decode(),
        }

    def sha256(self) -> str:
        """0x SHA-256 of the proof's canonical JSON (sorted keys, no spaces): what a receipt names."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return "0x" + hashlib.sha256(text.encode()).hexdigest()

    @property
    def positions(self) -> int:
        """Committed positions: one per output token."""
        return len(self.output_ids)

    def prefill(self) -> tuple[list[int], int]:
        """What a verifier prefills (the prompt and every output token but the last, which no position
        reads) and the first position whose state and logits it checks (the prompt's last)."""
        return [*self.prompt_ids, *self.output_ids[:-1]], len(self.prompt_ids) - 1


def make(
    model: str,
    prompt_ids: list[int],
    output_ids: list[int],
    states: np.ndarray,
    *,
    temperature: float,
    top_p: float,
    constrained: bool = False,
    adapter: str = "",
    kernels: str = "",
) -> AnswerProof:
    """The proof of an answer from the states that produced each of its tokens (one row per output token)."""
    if len(states) != len(output_ids):
        raise ProofError(f"{len(states)} hidden states for {len(output_ids)} output tokens")
    return AnswerProof(
        model=_hex32("model", model),
        adapter=_hex32("adapter", adapter) if adapter else "0x" + "00" * 32,
        prompt_ids=tuple(prompt_ids),
        output_ids=tuple(output_ids),
        temperature=float(temperature),
        top_p=float(top_p),
        constrained=constrained,
        commitments=toploc.commit(states),
        kernels=kernels,
    )


def _hex32(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ProofError(f"proof.{name} must be a string")
    text = value.lower() if value.startswith("0x") else "0x" + value.lower()
    if len(text) != 66 or any(c not in "0123456789abcdef" for c in text[2:]):
        raise ProofError(f"proof.{name} must be a SHA-256: 64 hex digits, not {value[:80]!r}")
    return text


def _ids(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or any(type(t) is not int or not 0 <= t < 2**31 for t in value):
        raise ProofError(f"proof.{name} must be a list of token ids (integers from 0 to 2**31 - 1)")
    return tuple(value)


def parse(data: dict[str, Any] | str | bytes) -> AnswerProof:
    """A proof from its JSON (text or a decoded object); ProofError saying what is wrong with it."""
    if isinstance(data, str | bytes):
        if len(data) > MAX_PROOF_CHARS:
            raise ProofError(f"a proof is at most {MAX_PROOF_CHARS} bytes of JSON, not {len(data)}")
        try:
            data = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProofError(f"a proof is JSON: {e}") from None
    if not isinstance(data, dict):
        raise ProofError("a proof is a JSON object")
    unknown, missing = set(data) - set(_FIELDS), set(_FIELDS) - set(data)
    if unknown or missing:
        raise ProofError(f"proof fields unknown: {sorted(unknown)}, missing: {sorted(missing)}")
    if data["format"] != FORMAT:
        raise ProofError(f"proof.format {str(data['format'])[:40]!r} is not {FORMAT!r}")
    prompt_ids, output_ids = _ids("prompt_ids", data["prompt_ids"]), _ids("output_ids", data["output_ids"])
    if not prompt_ids or not output_ids:
        raise ProofError("a proof needs at least one prompt token and one output token")
    if len(prompt_ids) + len(output_ids) > MAX_TOKENS:
        raise ProofError(
            f"a proof covers at most {MAX_TOKENS} tokens, not {len(prompt_ids) + len(output_ids)}"
        )
    sampling = {}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = data[name]
        if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
            raise ProofError(f"proof.{name} must be a number from {low:g} to {high:g}")
        sampling[name] = float(value)
    kernels = data["kernels"]
    if not isinstance(kernels, str) or len(kernels) > MAX_KERNELS_CHARS or not kernels.isprintable():
        raise ProofError(f"proof.kernels must be printable text of at most {MAX_KERNELS_CHARS} characters")
    if type(data["constrained"]) is not bool:
        raise ProofError("proof.constrained must be true or false")
    if not isinstance(data["commitments"], str):
        raise ProofError("proof.commitments must be base64 text")
    try:
        commitments = base64.b64decode(data["commitments"], validate=True)
    except ValueError:
        raise ProofError("proof.commitments is not base64") from None
    chunks = -(-len(output_ids) // CHUNK_TOKENS)
    if len(commitments) != chunks * CHUNK_BYTES:
        raise ProofError(
            f"proof.commitments holds {len(commitments)} bytes; {len(output_ids)} output tokens make "
            f"{chunks} chunks of {CHUNK_BYTES}"
        )
    toploc.chunks_of(commitments)  # each chunk's modulus and coefficients in range
    return AnswerProof(
        model=_hex32("model", data["model"]),
        adapter=_hex32("adapter", data["adapter"]),
        prompt_ids=prompt_ids,
        output_ids=output_ids,
        commitments=commitments,
        constrained=data["constrained"],
        kernels=kernels,
        **sampling,
    )


@dataclass(frozen=True)
class TokenCheck:
    """How the worst output token fares against the verifier's logits."""

    index: int  # the output token's position in the answer (-1: none checked)
    token: int
    shortfall: float  # greedy: best logit minus the token's; nucleus: the mass of more likely tokens;
    # sampled: -(its log-probability)
    limit: float
    rule: str  # "greedy" | "nucleus" | "sampled"

    @property
    def accepted(self) -> bool:
        return self.shortfall <= self.limit


@dataclass(frozen=True)
class Verdict:
    """accept or reject, and why: each chunk's check and the worst token's."""

    accepted: bool
    reason: str
    chunks: list[ChunkCheck] = field(default_factory=list)
    tokens: TokenCheck | None = None


def check_tokens(proof: AnswerProof, logits: np.ndarray) -> TokenCheck:
    """The output token that the stated sampler was least likely to choose, and by how much."""
    logits = np.asarray(logits, dtype=np.float64)
    chosen = np.asarray(proof.output_ids, dtype=np.int64)
    if logits.shape[0] != len(chosen) or (chosen >= logits.shape[1]).any():
        raise ProofError(f"the output holds a token id outside the vocabulary of {logits.shape[1]} tokens")
    rows = np.arange(len(chosen))
    mine = logits[rows, chosen]
    if proof.temperature <= 0 and not proof.constrained:
        shortfall, limit, rule = logits.max(axis=1) - mine, GREEDY_MARGIN, "greedy"
    else:
        z = logits / max(proof.temperature, 1e-3)
        top = z.max(axis=1)
        logprob = z[rows, chosen] - top - np.log(np.exp(z - top[:, None]).sum(axis=1))
        if proof.top_p < 1 and not proof.constrained:
            p = np.exp(z - top[:, None])
            p /= p.sum(axis=1, keepdims=True)
            above = np.where(p > p[rows, chosen][:, None], p, 0).sum(axis=1)
            shortfall, limit, rule = above, min(proof.top_p + NUCLEUS_SLACK, MAX_NUCLEUS_MASS), "nucleus"
        else:
            shortfall, limit, rule = -logprob, -MIN_LOGPROB, "sampled"
    worst = int(np.argmax(shortfall))
    return TokenCheck(worst, int(chosen[worst]), float(shortfall[worst]), limit, rule)


def verify(
    proof: AnswerProof, states: np.ndarray, logits: np.ndarray, thresholds: Thresholds = toploc.PAPER
) -> Verdict:
    """Accept or reject `proof` given the verifier's states and logits at its output positions."""
    checks = toploc.check(states, proof.commitments)
    tokens = check_tokens(proof, logits)
    for i, chunk in enumerate(checks):
        if not chunk.accepted(thresholds):
            first, last = i * CHUNK_TOKENS, min((i + 1) * CHUNK_TOKENS, proof.positions) - 1
            return Verdict(
                False,
                f"the hidden states of output tokens {first}-{last} do not match their commitment: "
                f"{chunk.describe(thresholds)}. Other weights, another prompt or other tokens made them.",
                checks,
                tokens,
            )
    if not tokens.accepted:
        what = {
            "greedy": f"trails the most likely token's logit by {tokens.shortfall:.2f} (at most "
            f"{tokens.limit:g} for a greedy answer)",
            "nucleus": f"lies outside the top-p {proof.top_p:g} nucleus (tokens more likely than it hold "
            f"{tokens.shortfall:.3f} of the probability; at most {tokens.limit:g})",
            "sampled": f"has log-probability {-tokens.shortfall:.1f} at temperature {proof.temperature:g} "
            f"(at least {-tokens.limit:g})",
        }[tokens.rule]
        reason = f"output token {tokens.index} (id {tokens.token}) {what}: not what this model chose"
        return Verdict(False, reason, checks, tokens)
    return Verdict(True, f"{len(checks)} chunks and {proof.positions} tokens match", checks, tokens)
