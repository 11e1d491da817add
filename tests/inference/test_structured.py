"""Structured output with the real bundled model: grammar-constrained decoding (xgrammar) makes the
TF-GRPO operations reply always parse and fit its schema, every lesson in it one the library accepts; bad
formats are refused with the reason."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from zoo.inference.backend_protocol import GenerationRequest, ResponseFormat, generate
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.structured import parse_response_format
from zoo.inference.transformers_backend import TransformersBackend
from zoo.node.config import default_cache_dir
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.trainer.tfgrpo.critic import JsonStats, OperationsReply, ask_json, operations_schema
from zoo.trainer.tfgrpo.llm import LLM

IDS = ["exp-0123456789abcdef", "exp-fedcba9876543210"]
LESSON_IDS = IDS[:1]  # the other one is a worked example: the critic may neither rewrite nor delete it


@pytest.fixture(scope="module")
def backend() -> TransformersBackend:
    torch.set_num_threads(2)
    path = prepare_bundled_chat_model(default_cache_dir()).path
    return TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct", max_batch_size=8)


def run_all(backend: TransformersBackend, requests: list[GenerationRequest]) -> list:
    async def go() -> list:
        return await asyncio.gather(*(generate(backend, r) for r in requests))

    return asyncio.run(go())


def ops_request(seed: int = 0, temperature: float = 0.0) -> GenerationRequest:
    messages = [
        {"role": "system", "content": "You improve a library of short lessons. Reply with JSON operations."},
        {
            "role": "user",
            "content": "Attempt A (reward 1): 3*4=12. Attempt B (reward 0): 3*4=7. "
            f"Library: [{IDS[0]}] When multiplying, check the table. [{IDS[1]}] When adding, carry.",
        },
    ]
    schema = json.dumps(operations_schema(LESSON_IDS, max_ops=3))
    return GenerationRequest(
        messages, max_tokens=200, temperature=temperature, seed=seed,
        response_format=ResponseFormat("json_schema", schema),
    )  # fmt: skip


def check_operations(text: str) -> OperationsReply:
    reply = OperationsReply.model_validate(json.loads(text))  # parses, and has the pydantic shape
    assert len(reply.operations) <= 3
    for op in reply.operations:
        assert op.id in (("",) if op.op == "add" else LESSON_IDS)  # a worked example is not the critic's
        if op.op != "delete":  # a lesson the registry accepts: trigger first, 3 to 32 words
            Experience.create(text=op.text, domain="math", confidence=0.5, author="job:t", base_model="m")
    return reply


def test_operations_reply_always_parses_and_fits_the_schema(backend: TransformersBackend) -> None:
    greedy = asyncio.run(generate(backend, ops_request()))
    assert greedy.finish_reason == "stop"
    check_operations(greedy.text)
    sampled = run_all(backend, [ops_request(seed, 1.0) for seed in range(4)])  # at once, sampled
    for r in sampled:
        assert r.finish_reason == "stop", r.text
        check_operations(r.text)


def test_a_constrained_reply_cut_by_the_token_limit_gives_its_finished_operations(
    backend: TransformersBackend,
) -> None:
    # The schema bounds each lesson's length, not the sum of three: a small model writing long texts ran
    # into the critic's token limit, its cut reply did not parse, and both retries were cut the same way
    # (TF-GRPO on code.functions: 7 of 14 compare requests given up on one seed).
    request = ops_request()
    whole = asyncio.run(generate(backend, request))
    first = OperationsReply.model_validate(json.loads(whole.text)).operations
    assert first, whole.text

    # A limit that ends inside the second operation (or the first, if it is the only one).
    def tokens(text: str) -> int:
        return len(backend.tokenizer(text)["input_ids"])

    one = json.dumps({"operations": [first[0].model_dump(exclude_defaults=True)]})
    cut_at = min(tokens(one) + 2, tokens(whole.text) - 2)
    llm = LLM(backend)
    stats = JsonStats()
    reply = asyncio.run(
        ask_json(llm, request.messages, OperationsReply, "{}", role="compare", stats=stats, max_retries=2,
                 max_tokens=cut_at, seed=0, schema=json.loads(request.response_format.schema))
    )  # fmt: skip
    assert reply is not None
    assert (stats.cut, stats.retries, stats.failures, llm.ledger.calls) == (1, 0, 0, 1)
    assert 0 < len(reply.operations) < len(first) or (len(first) == 1 and reply.operations == [])
    for op in reply.operations:  # finished operations only, each exactly as the model wrote it
        assert op in first
    check_operations(json.dumps(reply.model_dump()))


def test_unconstrained_model_does_not_manage_it_alone(backend: TransformersBackend) -> None:
    """What the constraint buys: the same request without it is not usable JSON."""
    free = ops_request()
    free.response_format, free.max_tokens = None, 80
    text = asyncio.run(generate(backend, free)).text
    with pytest.raises((ValueError, TypeError)):
        check_operations(text)


def test_json_object_gives_an_object(backend: TransformersBackend) -> None:
    r = asyncio.run(
        generate(
            backend,
            GenerationRequest(
                [{"role": "user", "content": "Describe a cat as JSON with its name and age."}],
                max_tokens=80,
                response_format=ResponseFormat("json_object"),
            ),
        )
    )
    assert isinstance(json.loads(r.text), dict)


def test_constrained_and_free_requests_share_a_batch(backend: TransformersBackend) -> None:
    free = GenerationRequest([{"role": "user", "content": "Name a prime number."}], max_tokens=20)
    alone = asyncio.run(generate(backend, free)).text
    together = run_all(backend, [ops_request(), GenerationRequest(free.messages, max_tokens=20)])
    check_operations(together[0].text)
    assert together[1].text == alone


@pytest.mark.parametrize(
    "schema",
    [
        '{"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}',
        '{"type": "integer", "minimum": 5, "maximum": 1}',
    ],
)
def test_a_schema_that_cannot_compile_is_refused(backend: TransformersBackend, schema: str) -> None:
    fmt = parse_response_format("json_schema", schema)
    request = GenerationRequest([{"role": "user", "content": "hi"}], max_tokens=4, response_format=fmt)
    with pytest.raises(ValidationError) as e:
        asyncio.run(generate(backend, request))
    assert e.value.field == "response_format.json_schema"


@pytest.mark.parametrize(
    ("kind", "schema", "field"),
    [
        ("xml", "", "response_format.type"),
        ("json_schema", "", "response_format.json_schema"),
        ("json_schema", "{not json", "response_format.json_schema"),
        ("json_schema", "[1, 2]", "response_format.json_schema"),
        ("json_schema", "{}" + " " * 70_000, "response_format.json_schema"),
        ("text", '{"type": "object"}', "response_format.json_schema"),
    ],
)
def test_bad_response_formats_name_the_field(kind: str, schema: str, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_response_format(kind, schema)
    assert e.value.field == field


def test_good_response_formats() -> None:
    assert parse_response_format("", "") is None and parse_response_format("text", "") is None
    assert parse_response_format("json_object", "") == ResponseFormat("json_object")
    fmt = parse_response_format("json_schema", '{"type": "object",  "required": []}')
    assert fmt is not None and json.loads(fmt.schema) == {"type": "object", "required": []}


def test_compiled_grammars_are_kept_within_a_byte_bound_and_nowhere_else(
    backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every distinct schema compiles a grammar of several MB (token-mask tables over the vocabulary).
    # xgrammar's own compiler cache is unbounded by default: a node fed a new schema per request grew
    # without limit (a benchmark process reached 24 GB). Only the node's cache may hold them, within bounds.
    from zoo.inference import structured

    vocab = int(backend.model.config.vocab_size)
    cache = structured.GrammarCache(structured.hf_tokenizer_info(backend.tokenizer, vocab), vocab)
    one = cache.compile(ResponseFormat("json_schema", json.dumps(operations_schema(["exp-a"], 3))))
    monkeypatch.setattr(structured, "CACHE_BYTES", int(2.5 * one.memory_size_bytes))
    formats = [
        ResponseFormat("json_schema", json.dumps(operations_schema([f"exp-{i:04d}"], 3))) for i in range(6)
    ]
    for fmt in formats:
        cache.compile(fmt)
        assert cache.bytes <= structured.CACHE_BYTES
    assert len(cache) == 2  # the two most recently used
    assert cache.bytes == sum(g.memory_size_bytes for g in cache._compiled.values())
    assert cache._compiler.get_cache_size_bytes() == 0
    assert cache.compile(formats[-1]) is cache.compile(formats[-1])  # a kept grammar is reused
    again = cache.compile(formats[0])  # an evicted one compiles again and still constrains
    constraint = structured.JsonConstraint(again, cache.vocab_size)
    assert not constraint.is_terminated()
