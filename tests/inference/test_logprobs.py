"""Log-probabilities on both local backends, checked against a forward pass made without the scheduler:
transformers' model over the whole sequence at once, and llama-cpp-python's own `Llama` (its high-level
API, a separate context) for the GGUF. Generated tokens, the alternatives, a scored (echoed) prompt, what a
stop string cuts, a grammar-masked distribution and the stream all agree."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from zoo.inference.backend_protocol import GenerationRequest, ResponseFormat, generate
from zoo.inference.bundled_models import bundled_gguf, prepare_bundled_chat_model
from zoo.node.config import default_cache_dir, llamacpp_installed

pytestmark = pytest.mark.numerics

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = [{"role": "user", "content": "Name three prime numbers."}]
TEXT = "The capital of France is Paris. The capital of Italy is Rome."


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (
        x.max(-1, keepdims=True) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    )


class Reference:
    """A backend and a forward pass over a whole token sequence that does not go through its scheduler."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "transformers":
            import torch

            from zoo.inference.transformers_backend import TransformersBackend

            path = prepare_bundled_chat_model(default_cache_dir()).path
            # float32: the full-sequence pass and incremental decoding then agree to ~1e-5.
            self.backend: Any = TransformersBackend.load(path, MODEL_ID, max_batch_size=4, dtype="float32")
            model = self.backend.model

            def forward(ids: list[int]) -> np.ndarray:
                with torch.no_grad():
                    return model(torch.tensor([ids])).logits[0].float().numpy()

            self.encode = lambda r: self.backend._prompt_ids(r)
        else:
            from llama_cpp import Llama

            from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

            self.backend = LlamaCppBackend.load(
                bundled_gguf(), MODEL_ID, max_batch_size=4, context_length=512, threads=2
            )
            # Flash attention, as the scheduler's context picks on a CPU (without it the two differ by
            # up to 0.1: a different attention kernel, not different logits plumbing).
            llm = Llama(
                str(bundled_gguf()), n_ctx=512, logits_all=True, n_threads=2, verbose=False, flash_attn=True
            )
            self._llm = llm

            def forward(ids: list[int]) -> np.ndarray:
                llm.reset()
                llm.eval(ids)
                return np.array(llm.scores[: len(ids)], dtype=np.float32)

            self.encode = lambda r: self.backend._prompt_ids(r)
        self.forward = forward
        # The GGUF's two passes differ only by their batches' shapes in the quantized kernels.
        self.tolerance = 1e-3 if name == "transformers" else 0.005

    def token_id(self, text: str) -> int:
        if self.name == "transformers":
            return int(self.backend.tokenizer.convert_tokens_to_ids(self.backend.tokenizer.tokenize(text))[0])
        return self.backend.gguf.tokenize(text)[0]


BACKENDS = ["transformers", *(["llamacpp"] if llamacpp_installed() else [])]


@pytest.fixture(scope="module", params=BACKENDS)
def ref(request: pytest.FixtureRequest) -> Iterator[Reference]:
    r = Reference(request.param)
    yield r
    asyncio.run(r.backend.close())


def run(ref: Reference, request: GenerationRequest):
    return asyncio.run(generate(ref.backend, request))


def test_generated_tokens_carry_the_forward_passes_log_probabilities(ref: Reference) -> None:
    request = GenerationRequest(PROMPT, max_tokens=12, logprobs=5)
    result = run(ref, request)
    entries = result.logprobs
    assert entries is not None and len(entries) == result.completion_tokens
    assert "".join(e.token for e in entries) == result.text
    prompt_ids = ref.encode(request)
    ids = prompt_ids + [e.id for e in entries]
    rows = log_softmax(ref.forward(ids)[len(prompt_ids) - 1 : -1])
    for entry, row in zip(entries, rows, strict=True):
        assert entry.logprob == pytest.approx(float(row[entry.id]), abs=ref.tolerance)
        # Greedy: the chosen token heads its alternatives, which are the pass's most likely, in order.
        assert entry.top[0][0] == entry.token and entry.top[0][2] == entry.logprob
        values = [lp for _t, _b, lp in entry.top]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert values == pytest.approx(np.sort(row)[::-1][:5].tolist(), abs=ref.tolerance)
        assert entry.bytes.decode() == entry.token


def test_an_echoed_prompt_is_scored_token_by_token(ref: Reference) -> None:
    request = GenerationRequest(PROMPT, max_tokens=1, logprobs=2, prompt=TEXT, echo=True)
    result = run(ref, request)
    scored = result.prompt_logprobs
    ids = ref.encode(request)
    assert scored is not None and [e.id for e in scored] == ids and result.prompt_tokens == len(ids)
    assert "".join(e.token for e in scored) == TEXT  # no chat template: the text as sent
    assert scored[0].logprob is None and scored[0].top == ()
    rows = log_softmax(ref.forward(ids)[:-1])
    for entry, row in zip(scored[1:], rows, strict=True):
        assert entry.logprob == pytest.approx(float(row[entry.id]), abs=ref.tolerance)
        assert len(entry.top) == 2
    # Facts the model knows score far above a coin flip; the one it must guess does not.
    paris = next(e for e in scored if e.token == " Paris")
    assert paris.logprob is not None and paris.logprob > math.log(0.5)
    # Scoring costs the prompt its cache reuse, not its answer: the same text without echo answers alike.
    plain = run(ref, GenerationRequest(PROMPT, max_tokens=1, prompt=TEXT))
    assert plain.text == result.text and plain.prompt_logprobs is None and plain.logprobs is None


def test_a_stop_string_leaves_its_own_tokens_out(ref: Reference) -> None:
    request = GenerationRequest(
        [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        max_tokens=40,
        logprobs=0,
        stop=["5"],
    )
    result = run(ref, request)
    assert result.finish_reason == "stop" and "5" not in result.text
    entries = result.logprobs
    assert entries and all(e.top == () for e in entries)
    joined = "".join(e.token for e in entries)
    assert joined.startswith(result.text)
    # Every token whose text reached the answer is there, and none that only spelled the stop string.
    starts = np.cumsum([0, *(len(e.token) for e in entries)])[:-1]
    assert all(start < len(result.text) for start in starts)


def test_a_grammar_masked_distribution_is_what_the_logprobs_score(ref: Reference) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = ResponseFormat("json_schema", json.dumps(schema))
    result = run(ref, GenerationRequest(PROMPT, max_tokens=16, logprobs=5, response_format=fmt))
    assert isinstance(json.loads(result.text)["n"], int)
    entries = result.logprobs
    assert entries
    # The first token must open the object: the mask leaves the few tokens that can most of the mass,
    # which the raw logits of a chat model asked for primes never give them, and lists no other.
    assert entries[0].token.lstrip().startswith("{") and entries[0].logprob > math.log(0.5)
    assert 1 <= len(entries[0].top) <= 5 and all(t.strip().startswith("{") for t, _b, _lp in entries[0].top)
    for entry in entries:
        assert all(math.isfinite(lp) for _t, _b, lp in entry.top)
        assert math.fsum(math.exp(lp) for _t, _b, lp in entry.top) <= 1 + 1e-6


def test_streamed_logprobs_add_up_to_the_results(ref: Reference) -> None:
    async def collect():
        pieces, result = [], None
        async for chunk in ref.backend.stream(GenerationRequest(PROMPT, max_tokens=10, logprobs=1)):
            pieces.extend(chunk.logprobs)
            result = chunk.result or result
        return pieces, result

    pieces, result = asyncio.run(collect())
    assert result is not None and [e.id for e in pieces] == [e.id for e in result.logprobs]


def test_without_logprobs_nothing_is_computed(ref: Reference) -> None:
    result = run(ref, GenerationRequest(PROMPT, max_tokens=4))
    assert result.logprobs is None and result.prompt_logprobs is None


def test_the_end_of_sequence_token_is_listed_last_and_marked(ref: Reference) -> None:
    request = GenerationRequest(
        [{"role": "user", "content": "Reply with the single word: yes"}], max_tokens=40, logprobs=2
    )
    result = run(ref, request)
    assert result.finish_reason == "stop" and result.completion_tokens < 40  # ended by the model's EOS
    entries = result.logprobs
    assert entries is not None and len(entries) == result.completion_tokens  # one per generated token
    assert entries[-1].eos and not any(e.eos for e in entries[:-1])
    assert entries[-1].logprob is not None and entries[-1].logprob <= 0
    assert "".join(e.token for e in entries[:-1]) == result.text  # its text is not the answer's


def test_choice_seeds_fit_a_signed_64_bit_integer() -> None:
    from zoo.inference.engine import choice_seed

    for seed in (0, 1, 2**63 - 1, 2**64 - 1, 12345):
        assert choice_seed(seed, 0) == seed
        derived = [choice_seed(seed, i) for i in range(1, 9)]
        assert all(0 <= s < 2**63 for s in derived) and len(set(derived)) == 8
