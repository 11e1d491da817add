"""Proofs of inference on the transformers backend and the bundled model: an answer's proof commits to the
states a verifier's prefill recomputes, bit for bit, whether the answer was decoded alone or in a busy
batch, greedy or sampled; a verifier's prefill runs on the batcher's thread while it serves others; and
another prompt or a changed token is caught."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from zoo.inference.backend_protocol import GenerationRequest, generate
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.provenance import answer_proof
from zoo.inference.transformers_backend import TransformersBackend, kernels
from zoo.node.config import default_cache_dir

pytestmark = pytest.mark.numerics

QUESTIONS = ["Why is the sea salty?", "Name a long river.", "Write a haiku about hills.", "What is a delta?"]
SYSTEM = "Rivers, mountains and seas shape where people live, what they grow and how they travel."


@pytest.fixture(scope="module")
def backend() -> TransformersBackend:
    torch.set_num_threads(2)
    path = prepare_bundled_chat_model(default_cache_dir()).path
    b = TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct", max_batch_size=8)
    yield b
    asyncio.run(b.close())


def conversation(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def answers(backend: TransformersBackend, requests: list[GenerationRequest]) -> list:
    return list(await asyncio.gather(*(generate(backend, r) for r in requests)))


def proof_of(result, request: GenerationRequest) -> answer_proof.AnswerProof:
    h = result.hidden
    return answer_proof.make("ab" * 32, h.prompt_ids, h.output_ids, h.states,
                             temperature=request.temperature, top_p=request.top_p)  # fmt: skip


async def check(backend: TransformersBackend, proof: answer_proof.AnswerProof) -> answer_proof.Verdict:
    states, logits = await backend.recompute(*proof.prefill())
    return answer_proof.verify(proof, states, logits, backend.proof_thresholds)


def test_proofs_made_alone_or_in_a_busy_batch_recompute_bit_for_bit(backend: TransformersBackend) -> None:
    requests = [
        GenerationRequest(conversation(q), max_tokens=40, temperature=t, seed=i, proof=i % 2 == 0)
        for i, (q, t) in enumerate(zip(QUESTIONS * 2, [0.0, 0.7] * 4, strict=True))
    ]
    alone = GenerationRequest(conversation(QUESTIONS[0]), max_tokens=40, proof=True)

    async def go() -> tuple[list, object]:
        batch = await answers(backend, requests)
        (single,) = await answers(backend, [alone])
        return batch, single

    batch, single = asyncio.run(go())
    for request, result in [*zip(requests, batch, strict=True), (alone, single)]:
        if not request.proof:
            assert result.hidden is None
            continue
        h = result.hidden
        assert h.states.shape == (len(h.output_ids), backend.model.config.hidden_size)
        assert len(h.output_ids) == result.completion_tokens
        states, logits = asyncio.run(backend.recompute(*proof_of(result, request).prefill()))
        assert np.array_equal(states, h.states)  # the verifier's prefill is the prover's
        verdict = answer_proof.verify(proof_of(result, request), states, logits, backend.proof_thresholds)
        assert verdict.accepted, verdict.reason
        assert all(c.exponent_matches == 128 and c.mantissa_mean == 0 for c in verdict.chunks)


def test_a_verifier_prefill_runs_beside_answers_being_decoded(backend: TransformersBackend) -> None:
    async def go() -> tuple[list, list]:
        (first,) = await answers(
            backend, [GenerationRequest(conversation(QUESTIONS[1]), max_tokens=32, proof=True)]
        )
        proof = answer_proof.make("ab" * 32, first.hidden.prompt_ids, first.hidden.output_ids,
                                  first.hidden.states, temperature=0.0, top_p=1.0)  # fmt: skip
        busy = [GenerationRequest(conversation(q), max_tokens=48) for q in QUESTIONS]
        served = asyncio.gather(*(generate(backend, r) for r in busy))
        await asyncio.sleep(0.3)  # the batch is decoding
        verdicts = await asyncio.gather(*(check(backend, proof) for _ in range(3)))
        return verdicts, await served

    verdicts, served = asyncio.run(go())
    assert all(v.accepted for v in verdicts), [v.reason for v in verdicts]
    assert all(r.completion_tokens > 0 for r in served)


def test_another_prompt_or_a_changed_token_is_refused(backend: TransformersBackend) -> None:
    request = GenerationRequest(conversation(QUESTIONS[0]), max_tokens=40, proof=True)
    (result,) = asyncio.run(answers(backend, [request]))
    proof = proof_of(result, request)
    other = backend._chat_ids(conversation(QUESTIONS[2]), None)
    verdict = asyncio.run(
        check(backend, answer_proof.AnswerProof(**{**proof.__dict__, "prompt_ids": tuple(other)}))
    )
    assert not verdict.accepted and "do not match their commitment" in verdict.reason
    changed = list(proof.output_ids)
    changed[5] = (changed[5] + 1000) % backend.vocab_size
    verdict = asyncio.run(
        check(backend, answer_proof.AnswerProof(**{**proof.__dict__, "output_ids": tuple(changed)}))
    )
    assert not verdict.accepted


def test_the_states_are_what_the_lm_head_reads(backend: TransformersBackend) -> None:
    ids = backend._chat_ids(conversation(QUESTIONS[3]), None)
    states, logits = asyncio.run(backend.recompute(ids, len(ids) - 20))
    head = backend.model.get_output_embeddings()
    with torch.inference_mode():
        again = head(torch.from_numpy(states).to(backend.model.dtype)).float().numpy()
    assert states.shape == (20, backend.model.config.hidden_size) and np.array_equal(again, logits)


def test_kernels_name_what_computes_the_states(backend: TransformersBackend) -> None:
    named = kernels(backend.model, "cpu")
    assert backend.proof_kernels == named
    assert str(backend.model.dtype).removeprefix("torch.") in named
    assert torch.backends.cpu.get_cpu_capability() in named and "transformers " in named


def test_a_prefill_outside_the_tokens_is_refused_and_the_batcher_goes_on(
    backend: TransformersBackend,
) -> None:
    with pytest.raises(ValueError, match="outside"):
        asyncio.run(backend.recompute([1, 2, 3], 3))
    (result,) = asyncio.run(answers(backend, [GenerationRequest(conversation("hi"), max_tokens=4)]))
    assert result.completion_tokens > 0
