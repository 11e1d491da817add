"""The OpenAI-compatible HTTP API end to end: a real daemon on its devnet (genesis library), the bundled
model and embedder, spoken to with the official `openai` SDK and, for the wire details, with raw httpx."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import socket
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import openai
import pytest

from tests.conftest import NodeProcess, devnet_serving_node
from zoo.devnet.genesis import genesis_library
from zoo.inference.bundled_models import bundled_gguf
from zoo.node.client import NodeClient
from zoo.node.config_loading import ConfigError, effective_config, load_config
from zoo.registry.merkle import library_root
from zoo.v1 import inference_pb2 as pb

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDER = "all-MiniLM-L6-v2"
GEOMETRY = "How do I find the area of a triangle with base 6 and height 4?"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    with devnet_serving_node(tmp_path_factory.mktemp("http-node")) as n:
        yield n


def base_url(node: NodeProcess) -> str:
    return str(node.info["http"]) + "/v1"


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> openai.OpenAI:
    # No retries: a 429 or 5xx must reach the test as it is.
    return openai.OpenAI(base_url=base_url(node), api_key="unused", max_retries=0, timeout=120)


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def sse_events(lines: list[str]) -> list[str]:
    """The `data:` payloads of an SSE body, checking its framing: every event one line, then a blank."""
    events = []
    for i in range(0, len(lines), 2):
        assert lines[i].startswith("data: "), lines[i]
        assert lines[i + 1] == "", f"no blank line after event {i // 2}"
        events.append(lines[i].removeprefix("data: "))
    return events


# ---------------------------------------------------------------------------------------------- SDK


def test_models(client: openai.OpenAI, node: NodeProcess) -> None:
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {MODEL, EMBEDDER}
    assert all(m.owned_by == "zoo-node" for m in models.values())
    assert client.models.retrieve(MODEL).id == MODEL  # the id holds a slash
    # The served model's card names its weights by SHA-256 (an extra field), the GGUF's own bytes: what
    # `sha256sum` says of the file, and what GetStatus reports.
    gguf_sha256 = hashlib.sha256(bundled_gguf().read_bytes()).hexdigest()
    assert models[MODEL].model_extra == {"sha256": gguf_sha256}
    assert not (models[EMBEDDER].model_extra or {}).get("sha256")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    with NodeClient(node.address) as c:
        st = c.status()
    assert st.http_address == base_url(node) and st.model_sha256 == gguf_sha256


def test_chat_completion_with_experiences(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": GEOMETRY}],
        max_tokens=8,
        temperature=0,
        extra_body={"zoo": {"k": 2, "domain": "math"}},
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    zoo = r.to_dict()["zoo"]
    genesis = genesis_library()
    assert zoo["library_root"] == "0x" + library_root(genesis).hex() and zoo["library_version"] >= 1
    geometry = {e.id for e in genesis.experiences if e.domain == "math.geometry"}
    assert 0 < len(zoo["experiences"]) <= 2 and zoo["experiences"][0]["id"] in geometry
    assert set(zoo["experiences"][0]) == {"id", "kind", "score", "cited"}
    assert all(e["kind"] == "lesson" for e in zoo["experiences"])  # the genesis library holds lessons only
    assert set(zoo["cited"]) <= {e["id"] for e in zoo["experiences"]}
    assert zoo["queue_ms"] >= 0 and zoo["generation_ms"] > 0 and isinstance(zoo["seed"], int)


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kw = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a prime number."}]}],
        "max_completion_tokens": 16,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    final, usage = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason
    assert final.to_dict()["zoo"]["library_root"] == whole.to_dict()["zoo"]["library_root"]
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == whole.usage.completion_tokens


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "prompt": "Name a colour.", "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    assert "zoo" in whole.to_dict()
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    # A list of exactly one prompt is the same request.
    one = client.completions.create(**{**kw, "prompt": ["Name a colour."]})
    assert one.choices[0].text == whole.choices[0].text


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    whole = client.chat.completions.create(**kw, logprobs=True, top_logprobs=3, temperature=0)
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes or []).decode() == t.token
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token  # greedy
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    streamed = list(client.chat.completions.create(**kw, logprobs=True, top_logprobs=3, stream=True))
    tokens = [
        t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert [(t.token, t.logprob) for t in tokens] == [(t.token, t.logprob) for t in content]
    # Asked for none, none come back.
    plain = client.chat.completions.create(**kw)
    assert plain.choices[0].logprobs is None


def test_completions_echo_scores_the_prompt_as_sent(client: openai.OpenAI) -> None:
    # What log-likelihood harnesses send: the text to score, echo, one token, logprobs.
    prompt = "The capital of France is Paris"
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=2, temperature=0
    )
    choice = r.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert "".join(lp.tokens) == choice.text  # the prompt's tokens (no chat template), then the answer's
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert value is not None and value <= 0 and top[token] == value and len(top) <= 3
    paris = lp.tokens.index(" Paris")
    assert lp.token_logprobs[paris] > -1.0  # the model knows it
    assert r.to_dict()["zoo"]["experiences"] == []  # a scored prompt is the text as sent, nothing added
    # Streamed: the scored prompt first, then the answer; the same numbers.
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=2, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    values = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert values == lp.token_logprobs
    offsets = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset
    # The same prompt as token ids (what harnesses that tokenize themselves send): the same scores.
    ids = [int(t) for t in _token_ids(prompt)]
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=2, temperature=0
    )
    assert by_ids.choices[0].text == choice.text
    assert by_ids.choices[0].logprobs.token_logprobs == lp.token_logprobs
    # logprobs without echo: the answer's tokens only.
    r = client.completions.create(
        model=MODEL, prompt="Name a colour.", max_tokens=4, logprobs=0, temperature=0
    )
    lp = r.choices[0].logprobs
    assert lp is not None and "".join(lp.tokens) == r.choices[0].text and None not in lp.token_logprobs


def test_n_choices_whole_and_streamed(client: openai.OpenAI) -> None:
    kw = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something about the sea."}],
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 11,
    }
    whole = client.chat.completions.create(**kw, n=3, logprobs=True)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.message.content for c in whole.choices}) > 1  # a seed of its own for each choice
    tokens = [len(c.logprobs.content) for c in whole.choices]
    assert whole.usage.completion_tokens == sum(tokens)  # every choice's tokens, the prompt's once
    assert whole.to_dict()["zoo"]["seed"] == 11
    # The first choice is the answer n = 1 gives with that seed.
    one = client.chat.completions.create(**kw)
    assert one.choices[0].message.content == whole.choices[0].message.content
    streamed = list(client.chat.completions.create(**kw, n=3, stream=True))
    texts = {i: "" for i in range(3)}
    finished = set()
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2}
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    # Completions too, with echo: each choice carries the prompt, streamed before any of its text.
    kw = {"model": MODEL, "prompt": "Waves", "max_tokens": 4, "n": 2, "echo": True, "logprobs": 1, "seed": 3}
    r = client.completions.create(**kw, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1] and all(c.text.startswith("Waves") for c in r.choices)
    streamed = {0: "", 1: ""}
    for chunk in client.completions.create(**kw, temperature=1.0, stream=True):
        for c in chunk.choices:
            assert streamed[c.index] or c.text.startswith("Waves")  # the prompt leads
            streamed[c.index] += c.text
    assert all(t.startswith("Waves") and len(t) > len("Waves") for t in streamed.values())


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def test_required_and_named_tool_calls_always_parse_and_validate(client: openai.OpenAI) -> None:
    import jsonschema

    ask = [{"role": "user", "content": "What is the weather like in Lisbon today?"}]
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        r = client.chat.completions.create(
            model=MODEL, messages=ask, tools=[WEATHER, ADD], tool_choice=choice, max_tokens=60
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            tool = {"get_weather": WEATHER, "add": ADD}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        if isinstance(choice, dict):
            assert {call.function.name for call in c.message.tool_calls} == {"add"}
        assert r.to_dict()["zoo"]["library_version"] >= 0  # experiences still go in (the zoo extension)
    # Streamed: the calls arrive whole as deltas, and are the same calls.
    kw = {"model": MODEL, "messages": ask, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60}
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(e["name"], json.loads(e["arguments"])) for e in calls.values()] == [
        (w.function.name, json.loads(w.function.arguments)) for w in whole
    ]


def test_experiences_still_go_in_beside_tools(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": GEOMETRY}],
        tools=[ADD],
        tool_choice="required",
        max_tokens=60,
        extra_body={"zoo": {"k": 2, "domain": "math"}},
    )
    zoo = r.to_dict()["zoo"]
    geometry = {e.id for e in genesis_library().experiences if e.domain == "math.geometry"}
    assert r.choices[0].message.tool_calls and zoo["experiences"] and zoo["experiences"][0]["id"] in geometry
    assert set(zoo["cited"]) <= {e["id"] for e in zoo["experiences"]}


def test_a_call_without_arguments_in_the_history_is_taken(node: NodeProcess) -> None:
    ping = {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
    }
    history = [
        {"role": "user", "content": "Is the server up?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ping", "arguments": ""}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "pong"},
    ]
    body = {"model": MODEL, "messages": history, "tools": [ping], "max_tokens": 8}
    r = httpx.post(base_url(node) + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_a_tool_result_goes_back_and_the_model_answers(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
    first = client.chat.completions.create(
        model=MODEL, messages=ask, tools=[ADD], tool_choice="required", max_tokens=60
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[ADD], max_tokens=40)
    c = second.choices[0]
    # Under auto the model may answer or call again; either way the answer is well-formed.
    assert (c.finish_reason == "tool_calls") == bool(c.message.tool_calls)
    if not c.message.tool_calls:
        assert c.message.content
    # With tool_choice none it answers in text, the result in its context.
    third = client.chat.completions.create(
        model=MODEL, messages=history, tools=[ADD], tool_choice="none", max_tokens=40
    )
    assert third.choices[0].message.content and not third.choices[0].message.tool_calls


def test_an_openai_backend_reads_logprobs_from_a_node(node: NodeProcess) -> None:
    # The openai backend (a node in front of another OpenAI-compatible server) forwards logprobs; here the
    # server it forwards to is a real node.
    import asyncio

    from zoo.inference.backend_protocol import GenerationRequest, generate
    from zoo.inference.openai_backend import OpenAIBackend

    async def ask() -> tuple:
        backend = OpenAIBackend(str(node.info["http"]), MODEL)
        try:
            turns = [{"role": "user", "content": "Name a colour."}]
            with_logprobs = await generate(backend, GenerationRequest(turns, max_tokens=6, logprobs=2))
            return with_logprobs, await generate(backend, GenerationRequest(turns, max_tokens=6))
        finally:
            await backend.close()

    result, plain = asyncio.run(ask())
    assert result.logprobs and "".join(e.token for e in result.logprobs) == result.text
    assert all(len(e.top) == 2 and e.top[0][2] >= e.top[1][2] for e in result.logprobs)
    assert plain.logprobs is None and plain.text == result.text


def _token_ids(text: str) -> list[int]:
    from transformers import AutoTokenizer

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    tokenizer = AutoTokenizer.from_pretrained(prepare_bundled_chat_model(default_cache_dir()).path)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_an_openai_backend_forwards_tools_and_their_history_to_a_node(node: NodeProcess) -> None:
    # The openai backend sends tools, tool_choice and the conversation's calls and results as OpenAI's
    # fields; the server's calls come back written into the text, where the engine reads them.
    import asyncio

    from zoo.inference.backend_protocol import GenerationRequest, generate
    from zoo.inference.openai_backend import OpenAIBackend
    from zoo.inference.tools import Tool, ToolSpec, parse_answer, template_messages

    add = ADD["function"]
    spec = ToolSpec((Tool(add["name"], add["description"], add["parameters"]),), "required")
    ask = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]

    async def run() -> tuple:
        backend = OpenAIBackend(str(node.info["http"]), MODEL)
        try:
            first = await generate(
                backend, GenerationRequest(ask, max_tokens=60, tools=[ADD], tool_choice="required")
            )
            call = parse_answer(first.text, spec).calls[0]
            history = template_messages(
                [
                    *ask,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": call.id, "name": call.name, "arguments": call.arguments}],
                    },
                    {"role": "tool", "content": "5", "tool_call_id": call.id},
                ]
            )
            second = await generate(
                backend, GenerationRequest(history, max_tokens=30, tools=[ADD], tool_choice="none")
            )
            return call, second
        finally:
            await backend.close()

    call, second = asyncio.run(run())
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    assert second.text and "<tool_call>" not in second.text  # the node took the history and answered


def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    texts = ["The area of a triangle is half base times height.", "Compound interest grows."]
    as_float = client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    default = client.embeddings.create(model=EMBEDDER, input=texts)  # the SDK asks for base64
    assert as_float.model == EMBEDDER and [d.index for d in as_float.data] == [0, 1]
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens > 0
    for a, b in zip(as_float.data, default.data, strict=True):
        va, vb = np.array(a.embedding), np.array(b.embedding)
        assert va.shape == (384,) and abs(np.linalg.norm(va) - 1) < 1e-4
        assert np.allclose(va, vb, atol=1e-6)
    single = client.embeddings.create(model=EMBEDDER, input=texts[0], encoding_format="float")
    assert np.allclose(single.data[0].embedding, as_float.data[0].embedding, atol=1e-5)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL, input="x")


def test_json_schema_response_format_is_accepted(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2 + 2? Answer in JSON."}],
        max_tokens=24,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "sum", "schema": schema, "strict": True},
        },
    )
    assert isinstance(json.loads(r.choices[0].message.content)["answer"], int)
    # A schema the backend cannot compile is a 400 naming where the schema sits in the request.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "response_format.json_schema.schema"


def test_bad_requests_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=5
        )
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "temperature"
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert isinstance(nf.value.body, dict) and nf.value.body["code"] == "model_not_found"


# ---------------------------------------------------------------------------------------------- raw HTTP


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": 100000}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop[0]"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),  # beyond inference.max_n
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "call_x", "content": "1"},
                ]
            },
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs = true
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": "hi"}, "messages"),
        ({"temperature": "hot"}, "temperature"),
        ({"zoo": {"k": 500}}, "zoo.k"),
        ({"zoo": {"domain": "Bad Domain"}}, "zoo.domain"),
        ({"zoo": {"library_root": "0x12"}}, "zoo.library_root"),
        ({"zoo": {"kk": 1}}, "zoo.kk"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, None),
    ],
)
def test_bad_chat_requests_are_400(node: NodeProcess, change: dict, param: str | None) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **change}
    r = httpx.post(base_url(node) + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == (param or "response_format.json_schema.schema")
    assert err["message"].startswith(err["param"])


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -2, 3]}, "prompt"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),  # one prompt a request
        ({"prompt": [1, 10**9]}, "prompt"),  # outside the vocabulary
        ({"prompt": ""}, "prompt"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"echo": True, "prompt": "word " * 3000}, "prompt"),  # beyond the context, as given
        ({"suffix": "end"}, "suffix"),
    ],
)
def test_bad_completion_requests_are_400(node: NodeProcess, change: dict, param: str) -> None:
    r = httpx.post(
        base_url(node) + "/completions", json={"model": MODEL, "prompt": "hi", **change}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param


def test_bad_embedding_requests_are_400(node: NodeProcess) -> None:
    url = base_url(node) + "/embeddings"
    for body, param in [
        ({"input": [[1, 2, 3]]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": [""]}, "input[0]"),
        ({"input": ["x"] * 257}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ]:
        r = httpx.post(url, json={"model": EMBEDDER, **body}, timeout=60)
        assert r.status_code == 400, r.text
        assert error_of(r)["param"] == param


def test_sse_framing(node: NodeProcess) -> None:
    body = {"model": MODEL, "prompt": "Say hello.", "max_tokens": 6, "stream": True}
    with httpx.stream("POST", base_url(node) + "/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    events = sse_events(lines)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and "zoo" in chunks[-1]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_malformed_bodies_and_routes(node: NodeProcess) -> None:
    url = base_url(node)
    r = httpx.post(url + "/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error"
    r = httpx.post(url + "/chat/completions", json=[1, 2], timeout=30)
    assert r.status_code == 400 and "JSON object" in error_of(r)["message"]
    r = httpx.post(
        url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30
    )
    assert r.status_code == 400 and error_of(r)["param"] == "model"
    r = httpx.get(url + "/nothing-here", timeout=30)
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = httpx.get(url + "/chat/completions", timeout=30)
    assert r.status_code == 405 and error_of(r)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    r = httpx.post(url + "/chat/completions", json=big, timeout=60)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


@pytest.mark.parametrize("route", ["/chat/completions", "/completions", "/embeddings"])
def test_json_nested_beyond_any_limit_is_a_400_and_the_node_stays_healthy(
    node: NodeProcess, route: str
) -> None:
    url = base_url(node)
    for body in (
        b"[" * 50_000 + b"]" * 50_000,  # beyond the interpreter's recursion limit
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        ('{"model": "m", "messages": ' + "[" * 200 + "]" * 200 + "}").encode(),  # parses; too deep
    ):
        r = httpx.post(url + route, content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text
        assert error_of(r)["code"] == "invalid_json" and "nested deeper than" in error_of(r)["message"]
    nested_schema = {"type": "object"}
    for _ in range(100):
        nested_schema = {"type": "object", "properties": {"x": nested_schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_schema}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(url + "/chat/completions", json={**chat, "tools": [tool]}, timeout=60)
    assert r.status_code == 400, r.text
    arguments = "[" * 5000 + "]" * 5000
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "1"},
    ]
    r = httpx.post(url + "/chat/completions", json={**chat, "messages": history}, timeout=60)
    assert r.status_code == 400 and error_of(r)["param"] == "messages[1].tool_calls[0].function.arguments", (
        r.text
    )
    r = httpx.post(url + "/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text


def test_requests_are_counted_by_route(node: NodeProcess) -> None:
    httpx.get(base_url(node) + "/models", timeout=30)
    httpx.get(base_url(node) + "/no/such/route", timeout=30)
    httpx.post(base_url(node) + "/chat/completions", json={"model": MODEL, "messages": []}, timeout=30)
    text = httpx.get(node.metrics_url, timeout=30).text
    assert 'zoo_http_requests_total{route="/v1/models",status="200"}' in text
    assert 'zoo_http_requests_total{route="other",status="404"}' in text
    assert 'zoo_http_latency_seconds_count{route="/v1/chat/completions"}' in text


def test_signed_requests_through_the_sdk_and_replays_refused(node: NodeProcess) -> None:
    from eth_account import Account

    from zoo.node.client import SignedAuth

    account = Account.from_key("0x" + "77" * 32)
    with NodeClient(node.address) as c:
        node_address = c.status().node_address
    with httpx.Client(auth=SignedAuth(account, node_address), timeout=120) as http:
        sdk = openai.OpenAI(base_url=base_url(node), api_key="unused", max_retries=0, http_client=http)
        answer = sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": GEOMETRY}], max_tokens=3
        )
        assert answer.choices[0].message.content is not None
        # The same bytes under the same signature again: a replay.
        request = http.build_request(
            "POST", base_url(node) + "/completions", json={"model": MODEL, "prompt": "2+2=", "max_tokens": 2}
        )
        signed = next(SignedAuth(account, node_address).auth_flow(request))
        assert http.send(signed, auth=None).status_code == 200
        again = http.send(signed, auth=None)
    assert again.status_code == 401
    error = error_of(again)
    assert error["code"] == "signature_replayed" and "was used already" in error["message"]
    assert error["type"] == "authentication_error"
    # A signature for other bytes (the body was changed after signing) is forged.
    tampered = httpx.post(
        base_url(node) + "/completions",
        content=b'{"model": "%s", "prompt": "3+3=", "max_tokens": 2}' % MODEL.encode(),
        headers={"zoo-signature": signed.headers["zoo-signature"], "content-type": "application/json"},
        timeout=60,
    )
    assert tampered.status_code == 401 and error_of(tampered)["code"] == "signature_forged"


def test_a_spend_consent_over_http_is_checked_and_bad_ones_refused(node: NodeProcess) -> None:
    """The zoo-spend header through the OpenAI SDK: the consent GetStatus describes is accepted; one for
    another epoch, or signed by someone else, is a 401 naming why, before anything is generated."""
    from eth_account import Account

    from zoo.node.client import SignedAuth
    from zoo.registry.spend import sign_spend_authorization

    account = Account.from_key("0x" + "78" * 32)
    with NodeClient(node.address) as c:
        st = c.status()
    assert st.ledger_address and st.credit_epoch_seconds > 0 and st.chain_id > 0
    epoch = int(time.time()) // st.credit_epoch_seconds

    def consent(epoch: int, signer: object = account) -> object:
        signed = sign_spend_authorization(signer, st.chain_id, st.ledger_address, st.node_address, epoch, 50)
        return dataclasses.replace(signed, client=account.address)

    def ask(spend: object) -> httpx.Response:
        with httpx.Client(auth=SignedAuth(account, st.node_address, spend), timeout=120) as http:
            return http.post(
                base_url(node) + "/completions", json={"model": MODEL, "prompt": "2+2=", "max_tokens": 2}
            )

    assert ask(consent(epoch)).status_code == 200
    stale = ask(consent(epoch - 1))
    assert stale.status_code == 401 and error_of(stale)["code"] == "signature_stale", stale.text
    assert f"authorizes epoch {epoch - 1}" in error_of(stale)["message"]
    forged = ask(consent(epoch, Account.create()))
    assert forged.status_code == 401 and error_of(forged)["code"] == "signature_forged", forged.text
    alone = httpx.post(
        base_url(node) + "/completions",
        json={"model": MODEL, "prompt": "2+2=", "max_tokens": 2},
        headers={"zoo-spend": "epoch=1,units=2,signature=0x" + "00" * 65},
        timeout=60,
    )
    assert alone.status_code == 401 and "needs a zoo-signature header" in error_of(alone)["message"]


# ---------------------------------------------------------------------------------------------- other nodes


def test_api_key_is_required_when_set(start_node) -> None:
    n = start_node({"server": {"api_key": "sk-test-key"}}, name="keyed")
    url = str(n.info["http"]) + "/v1/models"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sk-test-key"}):
        r = httpx.get(url, headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert error_of(r)["type"] == "authentication_error"
    # The API key alone is enough: the gRPC admin token is never asked for.
    assert n.admin_token != "sk-test-key"
    r = httpx.get(url, headers={"Authorization": "Bearer sk-test-key"}, timeout=30)
    assert r.status_code == 200 and r.json()["data"]
    sdk = openai.OpenAI(base_url=str(n.info["http"]) + "/v1", api_key="sk-test-key", max_retries=0)
    assert {m.id for m in sdk.models.list()} == {MODEL, EMBEDDER}
    # The same key guards gRPC inference; status and health stay open.
    request = pb.InferRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=2))
    with NodeClient(n.address) as anonymous:
        assert anonymous.status().node_version
        with pytest.raises(grpc.RpcError) as e:
            anonymous.inference.Infer(request, timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "server.api_key" in e.value.details()
    n.wait_component("model", "SERVING", timeout_s=180)
    with NodeClient(n.address, api_key="sk-test-key") as keyed:
        assert keyed.inference.Infer(request, timeout=120).usage.completion_tokens > 0


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_n_choices_take_one_admission_slot(start_node) -> None:
    # One slot and no queue: were the choices counted apiece, the request would be refused (429).
    n = start_node({"inference": {"max_batch_size": 1, "max_queued": 0, "max_n": 4}}, name="onechoice")
    n.wait_component("model", "SERVING", timeout_s=180)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 8,
        "n": 4,
    }
    r = httpx.post(
        str(n.info["http"]) + "/v1/chat/completions", json={**body, "temperature": 1.0}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    r = httpx.post(str(n.info["http"]) + "/v1/chat/completions", json={**body, "n": 5}, timeout=60)
    assert (
        r.status_code == 400 and error_of(r)["param"] == "n" and "inference.max_n" in error_of(r)["message"]
    )


def test_full_queue_is_429_and_hanging_up_frees_slots(start_node) -> None:
    """One slot and one queue place: a started stream holds the slot, a request waits, a third is refused
    with 429. The waiter that hangs up leaves the queue, the stream that is closed frees the slot."""
    n = start_node({"inference": {"max_batch_size": 1, "max_queued": 1}}, name="tinyqueue")
    n.wait_component("model", "SERVING", timeout_s=180)
    url = str(n.info["http"]) + "/v1/chat/completions"
    hold = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 300,
        "stop": ["zzzz-never"],
        "stream": True,
        "zoo": {"disable_experiences": True},
    }
    quick = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with (
        httpx.Client(timeout=60) as http,
        NodeClient(n.address) as grpc_client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        serving = lambda: grpc_client.status().serving  # noqa: E731
        with http.stream("POST", url, json=hold) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # kept: dropping the iterator would close the connection
            assert next(lines).startswith("data: ")  # the stream has started: it holds the only slot
            # A streamed request waits in the queue (its response has not started), then gives up.
            waiter = pool.submit(httpx.post, url, json={**quick, "stream": True}, timeout=3)
            wait_until(lambda: serving().waiting == 1)
            r = http.post(url, json=quick)
            assert r.status_code == 429
            err = error_of(r)
            assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
            assert "queue is full" in err["message"]
            with pytest.raises(httpx.ReadTimeout):
                waiter.result()
            wait_until(lambda: serving().waiting == 0)
            assert serving().running == 1
        # Closing the stream stops its generation and frees the slot.
        wait_until(lambda: serving().running == 0)
        r = http.post(url, json=quick)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    metrics = httpx.get(n.metrics_url, timeout=30).text
    assert 'zoo_http_requests_total{route="/v1/chat/completions",status="429"} 1.0' in metrics
    assert "level=error" not in n.log()


def test_disabled_http_api(start_node) -> None:
    n = start_node({"http": {"enabled": False}}, name="nohttp")
    assert n.info["http"] == ""
    with NodeClient(n.address) as c:
        assert c.status().http_address == ""


def test_http_port_in_use_fails_startup(start_node) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        n = start_node({"http": {"listen": f"127.0.0.1:{port}"}}, name="portinuse", wait=False)
        assert n.proc.wait(120) != 0
    assert f"cannot serve the HTTP API on 127.0.0.1:{port}" in n.log()


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[http]\nlisten = "nohost"\n', "http.listen"),
        ('[http]\nlisten = "127.0.0.1:70000"\n', "out of range"),
        ("[http]\nmax_body_bytes = 10\n", "http.max_body_bytes"),
        ('[http]\nlisen = "x"\n', "http.lisen: unknown key"),
    ],
)
def test_bad_http_config_names_key_and_file(tmp_path: Path, toml: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(f, environ={})
    assert needle in str(e.value) and str(f) in str(e.value)


def test_http_config_defaults_and_masked_key() -> None:
    cfg = load_config(None, environ={})
    assert cfg.http.enabled and cfg.http.listen == "127.0.0.1:8080" and cfg.server.api_key is None
    cfg = load_config(None, environ={"ZOO_NODE_SERVER__API_KEY": "sk-secret"})
    assert cfg.server.api_key is not None and cfg.server.api_key.get_secret_value() == "sk-secret"
    assert effective_config(cfg)["server"]["api_key"] == "********"
    assert "sk-secret" not in repr(cfg)


# ---------------------------------------------------------------------------------------------- in process


class FakeEngine:
    """Streams fixed deltas, then fails or finishes, as the real engine's stream does."""

    def __init__(self, fail_after: BaseException | None = None, fail_before: BaseException | None = None):
        self.fail_after = fail_after
        self.fail_before = fail_before
        self.closed = False

    async def stream(self, params):
        from zoo.inference.backend_protocol import Chunk
        from zoo.inference.engine import InferOutcome

        try:
            if self.fail_before is not None:
                raise self.fail_before
            for word in ("Hello", " there"):
                yield Chunk(word)
            if self.fail_after is not None:
                raise self.fail_after
            yield InferOutcome(
                "Hello there", [], "", 0, MODEL, 3, 2, 0.1, 1.0, "cancelled", 8, 0.0, 1.0, 7, []
            )
        finally:
            self.closed = True


def call_app(engine, method: str, path: str, body: dict | None = None, embedder=None) -> httpx.Response:
    """One request to the API app in this process, with a fake engine behind it."""
    import asyncio

    from zoo.node.api.admission import Admission
    from zoo.node.api.http.routes import ApiDeps
    from zoo.node.api.http.server import build_app
    from zoo.node.api.serving import ServingRules
    from zoo.node.config import InferenceConfig
    from zoo.node.metrics import NodeMetrics

    deps = ApiDeps(
        ServingRules(lambda: engine, MODEL),
        Admission(1, 0, 1.0),
        InferenceConfig(),
        NodeMetrics("test"),
        MODEL,
        lambda: embedder,
        EMBEDDER,
    )

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(deps))
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as c:
            return await c.request(method, path, json=body)

    return asyncio.run(go())


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_error_after_the_stream_started_is_one_error_event() -> None:
    from zoo.inference.backend_protocol import BackendError

    engine = FakeEngine(fail_after=BackendError("the backend fell over"))
    r = call_app(engine, "POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.text.split("\n")[:-1])
    assert events[-1] != "[DONE]" and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["type"] == "server_error" and error["code"] is None
    assert "internal error (BackendError)" in error["message"]  # unexpected errors are not detailed
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "Hello"
    assert engine.closed


@pytest.mark.parametrize(
    ("engine", "status", "kind"),
    [
        (None, 503, "server_error"),
        ("unavailable", 503, "server_error"),
        ("not_found", 404, "invalid_request_error"),
        ("too_long", 400, "invalid_request_error"),
        ("bug", 500, "server_error"),
    ],
)
def test_errors_before_the_first_token_are_http_errors(engine, status: int, kind: str) -> None:
    from zoo.inference.backend_protocol import BackendUnavailable
    from zoo.inference.prompt import PromptTooLong
    from zoo.registry.errors import NotFound

    failures = {
        "unavailable": BackendUnavailable("the remote server is down"),
        "not_found": NotFound("this node does not hold that library root"),
        "too_long": PromptTooLong("messages", "too long"),
        "bug": ZeroDivisionError("secret detail"),
    }
    fake = None if engine is None else FakeEngine(fail_before=failures[engine])
    for stream in (False, True):
        r = call_app(fake, "POST", "/v1/chat/completions", {**CHAT, "stream": stream})
        assert r.status_code == status, r.text
        err = error_of(r)
        assert err["type"] == kind and "secret detail" not in err["message"]
    if engine == "too_long":
        r = call_app(fake, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi"})
        assert error_of(r)["param"] == "prompt"


def test_cancelled_generation_reads_as_stop_and_embedder_loading_is_503() -> None:
    r = call_app(FakeEngine(), "POST", "/v1/chat/completions", CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    r = call_app(FakeEngine(), "POST", "/v1/embeddings", {"model": EMBEDDER, "input": "x"})
    assert r.status_code == 503 and error_of(r)["type"] == "server_error"
