"""Proofs of inference on the llama.cpp backend and the bundled GGUF: the hidden states a row keeps while it
is decoded in a busy batch are the ones a verifier's prefill recomputes, bit for bit on the same build (so
the check's only noise is another machine's arithmetic), and what changes them is caught."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by ./zoo setup; its build failed here")
from zoo.inference.backend_protocol import GenerationRequest, generate
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend
from zoo.inference.provenance import answer_proof

pytestmark = pytest.mark.numerics

CONTEXT = "Rivers, mountains and seas shape where people live, what they grow and how they travel. " * 3
QUESTIONS = ["Why is the sea salty?", "Name a long river.", "Write a haiku about hills.", "What is a delta?"]


@pytest.fixture(scope="module")
def backend() -> LlamaCppBackend:
    b = LlamaCppBackend.load(bundled_gguf(), "local", max_batch_size=8, context_length=1024, threads=2)
    yield b
    asyncio.run(b.close())


def conversation(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": CONTEXT}, {"role": "user", "content": question}]


def answer(backend: LlamaCppBackend, requests: list[GenerationRequest]) -> list:
    async def go() -> list:
        return list(await asyncio.gather(*(generate(backend, r) for r in requests)))

    return asyncio.run(go())


def recompute(backend: LlamaCppBackend, prompt_ids: list[int], output_ids: list[int]):
    ids = [*prompt_ids, *output_ids[:-1]]
    return asyncio.run(backend.recompute(ids, len(prompt_ids) - 1))


def test_states_kept_in_a_busy_batch_are_what_a_prefill_recomputes(backend: LlamaCppBackend) -> None:
    # A cache holding the shared prefix (made in a large ubatch, the arithmetic a proof must not inherit),
    # then proofs decoded beside rows without them, every prompt longer than one ubatch of a proof (32).
    answer(backend, [GenerationRequest(conversation("Hello."), max_tokens=4)])
    reused = backend.scheduler.reused_tokens
    requests = [
        GenerationRequest(conversation(q), max_tokens=40, temperature=t, seed=i, proof=i % 2 == 0)
        for i, (q, t) in enumerate(zip(QUESTIONS * 2, [0.0, 0.7] * 4, strict=True))
    ]
    results = answer(backend, requests)
    assert backend.scheduler.reused_tokens > reused  # rows without proofs took the cached prefix
    for request, result in zip(requests, results, strict=True):
        if not request.proof:
            assert result.hidden is None
            continue
        hidden = result.hidden
        assert len(hidden.prompt_ids) > 64 and hidden.states.shape == (len(hidden.output_ids), 576)
        assert len(hidden.output_ids) == result.completion_tokens
        states, logits = recompute(backend, hidden.prompt_ids, hidden.output_ids)
        assert np.array_equal(states, hidden.states)  # the same build: the same numbers
        proof = answer_proof.make("ab" * 32, hidden.prompt_ids, hidden.output_ids, hidden.states,
                                  temperature=request.temperature, top_p=1.0)  # fmt: skip
        verdict = answer_proof.verify(proof, states, logits, backend.proof_thresholds)
        assert verdict.accepted, verdict.reason
        assert all(c.exponent_matches == 128 and c.mantissa_mean == 0 for c in verdict.chunks)


def test_another_prompt_or_a_changed_token_does_not_recompute_the_committed_states(
    backend: LlamaCppBackend,
) -> None:
    (result,) = answer(backend, [GenerationRequest(conversation(QUESTIONS[0]), max_tokens=40, proof=True)])
    hidden = result.hidden
    proof = answer_proof.make("ab" * 32, hidden.prompt_ids, hidden.output_ids, hidden.states,
                              temperature=0.0, top_p=1.0)  # fmt: skip
    other = backend._chat_ids(conversation(QUESTIONS[1]), None)
    claimed = answer_proof.AnswerProof(**{**proof.__dict__, "prompt_ids": tuple(other)})
    states, logits = recompute(backend, other, hidden.output_ids)
    assert not answer_proof.verify(claimed, states, logits, backend.proof_thresholds).accepted
    changed = [*hidden.output_ids]
    changed[5] = (changed[5] + 1000) % backend.vocab_size
    tampered = answer_proof.AnswerProof(**{**proof.__dict__, "output_ids": tuple(changed)})
    states, logits = recompute(backend, hidden.prompt_ids, changed)
    verdict = answer_proof.verify(tampered, states, logits, backend.proof_thresholds)
    assert not verdict.accepted
