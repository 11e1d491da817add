"""Answer proofs (zoo.inference.provenance.answer_proof) on synthetic states and logits: the document's
round trip and hash, every malformed shape refused in words, and the verdict's two checks (commitments,
tokens). On the bundled model: tests/inference/llamacpp/test_proofs.py; through a node:
tests/node/provenance."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.answer_proof import GREEDY_MARGIN, AnswerProof
from zoo.inference.provenance.toploc import PAPER, ProofError

HIDDEN, VOCAB = 576, 300
MODEL = "ab" * 32


def answer(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """States, logits and the greedy tokens they give."""
    rng = np.random.default_rng(seed)
    states = (rng.standard_normal((n, HIDDEN)) * 3).astype(np.float32)
    logits = (rng.standard_normal((n, VOCAB)) * 4).astype(np.float32)
    return states, logits, [int(t) for t in logits.argmax(axis=1)]


def proof_of(states: np.ndarray, tokens: list[int], **sampling: float) -> AnswerProof:
    return answer_proof.make(
        MODEL, [1, 2, 3], tokens, states, temperature=sampling.get("temperature", 0.0),
        top_p=sampling.get("top_p", 1.0),
    )  # fmt: skip


def test_the_document_round_trips_and_its_hash_names_it() -> None:
    states, _, tokens = answer()
    proof = proof_of(states, tokens)
    text = json.dumps(proof.to_json())
    again = answer_proof.parse(text)
    assert again == proof and again.sha256() == proof.sha256()
    assert proof.model == "0x" + MODEL and len(proof.commitments) == 2 * 258
    other = answer_proof.make(MODEL, [1, 2, 4], tokens, states, temperature=0.0, top_p=1.0)
    assert other.sha256() != proof.sha256()


def test_an_honest_answer_is_accepted() -> None:
    states, logits, tokens = answer()
    noisy = states * (1 + 1e-3 * np.random.default_rng(5).standard_normal(states.shape)).astype(np.float32)
    verdict = answer_proof.verify(proof_of(states, tokens), noisy, logits, PAPER)
    assert verdict.accepted, verdict.reason
    assert len(verdict.chunks) == 2 and verdict.tokens is not None and verdict.tokens.shortfall == 0


def test_other_states_are_rejected_naming_the_chunk() -> None:
    states, logits, tokens = answer()
    other, _, _ = answer(seed=9)
    mixed = np.concatenate([states[:32], other[32:]])
    verdict = answer_proof.verify(proof_of(states, tokens), mixed, logits, PAPER)
    assert not verdict.accepted and "output tokens 32-39" in verdict.reason


def test_a_greedy_token_the_model_would_not_choose_is_rejected() -> None:
    states, logits, tokens = answer()
    row = logits[-1]
    second = int(np.argsort(row)[-2])
    tampered = [*tokens[:-1], second]  # the last token: no committed state reads it
    verdict = answer_proof.verify(proof_of(states, tampered), states, logits, PAPER)
    gap = float(row.max() - row[second])
    assert verdict.accepted == (gap <= GREEDY_MARGIN)
    worst = int(np.argmin(row))
    verdict = answer_proof.verify(proof_of(states, [*tokens[:-1], worst]), states, logits, PAPER)
    assert not verdict.accepted and "output token 39" in verdict.reason and f"id {worst}" in verdict.reason


def test_a_sampled_token_is_held_to_the_log_probability_floor() -> None:
    states, logits, tokens = answer()
    logits[-1, 7] = logits[-1].max() - 5  # likely enough at temperature 1
    proof = proof_of(states, [*tokens[:-1], 7], temperature=1.0)
    assert answer_proof.verify(proof, states, logits, PAPER).accepted
    logits[-1, 7] = logits[-1].max() - 60  # e^-60: no sampler picks it
    verdict = answer_proof.verify(proof, states, logits, PAPER)
    assert not verdict.accepted and "log-probability" in verdict.reason


def test_a_token_outside_the_nucleus_is_rejected() -> None:
    states, logits, tokens = answer()
    row = logits[-1]
    row[:] = -10.0
    row[[5, 6, 7]] = [10.0, 9.5, 0.0]  # at temperature 1: 5 and 6 hold nearly all of the mass
    assert answer_proof.verify(proof_of(states, [*tokens[:-1], 6], temperature=1.0, top_p=0.9), states,
                               logits, PAPER).accepted  # fmt: skip
    verdict = answer_proof.verify(
        proof_of(states, [*tokens[:-1], 7], temperature=1.0, top_p=0.9), states, logits, PAPER
    )
    assert not verdict.accepted and "outside the top-p 0.9 nucleus" in verdict.reason
    # At top-p 0.95 the slack never reaches the whole mass: a token nothing can sample stays out.
    verdict = answer_proof.verify(
        proof_of(states, [*tokens[:-1], 7], temperature=1.0, top_p=0.95), states, logits, PAPER
    )
    assert not verdict.accepted and verdict.tokens is not None and verdict.tokens.limit == 0.999
    # At top-p 1 the same token is one a sampler may pick (e^-10.5): only the floor applies.
    assert answer_proof.verify(proof_of(states, [*tokens[:-1], 7], temperature=1.0), states, logits,
                               PAPER).accepted  # fmt: skip


def good() -> dict:
    states, _, tokens = answer()
    return proof_of(states, tokens).to_json()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.pop("commitments"), "missing: ['commitments']"),
        (lambda d: d.update(extra=1), "unknown: ['extra']"),
        (lambda d: d.update(format="zoo.answer-proof/9"), "is not 'zoo.answer-proof/1'"),
        (lambda d: d.update(model="0x1234"), "proof.model must be a SHA-256"),
        (lambda d: d.update(output_ids=[1, -2]), "proof.output_ids must be a list of token ids"),
        (lambda d: d.update(output_ids=[]), "at least one prompt token and one output token"),
        (lambda d: d.update(temperature=float("nan")), "proof.temperature must be a number"),
        (lambda d: d.update(top_p=2), "proof.top_p must be a number"),
        (lambda d: d.update(constrained="yes"), "proof.constrained must be true or false"),
        (lambda d: d.update(kernels="x" * 300), "proof.kernels must be printable text"),
        (lambda d: d.update(commitments="%%%"), "proof.commitments is not base64"),
        (lambda d: d.update(commitments=base64.b64encode(b"x" * 258).decode()), "make 2 chunks of 258"),
        (lambda d: d.update(prompt_ids=[0] * 40_000), "at most 32768 tokens"),
    ],
)
def test_malformed_proofs_are_refused_in_words(change, says: str) -> None:
    doc = good()
    change(doc)
    with pytest.raises(ProofError, match=None) as e:
        answer_proof.parse(json.dumps(doc))
    assert says in str(e.value)


def test_text_that_is_not_a_proof_is_refused() -> None:
    for text, says in (
        ("not json", "a proof is JSON"),
        ("[1]", "a JSON object"),
        ("x" * (2 << 20), "at most"),
    ):
        with pytest.raises(ProofError) as e:
            answer_proof.parse(text)
        assert says in str(e.value)


def test_states_and_tokens_must_agree_in_number() -> None:
    states, _, tokens = answer()
    with pytest.raises(ProofError, match="39 hidden states for 40 output tokens"):
        answer_proof.make(MODEL, [1], tokens, states[:39], temperature=0.0, top_p=1.0)
