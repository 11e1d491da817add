"""Generation backends: the real bundled model through the transformers backend, and the OpenAI
backend against a loopback server speaking the OpenAI protocol (a hosted API cannot be reached here)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from zoo.inference.backend_protocol import BackendError, BackendUnavailable, GenerationRequest, generate
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.openai_backend import OpenAIBackend
from zoo.inference.transformers_backend import TransformersBackend
from zoo.node.config import default_cache_dir

MSGS = [{"role": "user", "content": "What is the area of a triangle with base 4 and height 3?"}]


@pytest.fixture(scope="module")
def backend() -> TransformersBackend:
    import torch

    torch.set_num_threads(2)
    path = prepare_bundled_chat_model(default_cache_dir()).path
    return TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct")


def test_auto_dtype_is_float32_on_a_cpu_without_bf16_units(monkeypatch, backend) -> None:
    """`auto` loads bf16 only where the hardware computes it; an explicit dtype is kept as given."""
    import torch

    from zoo.inference import transformers_backend as tb

    # The loaded backend used this machine's own answer.
    assert backend.model.dtype == (torch.bfloat16 if tb._cpu_computes_bf16() else torch.float32)
    monkeypatch.setattr(tb, "_cpu_computes_bf16", lambda: False)
    assert tb.resolve_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(tb, "_cpu_computes_bf16", lambda: True)
    assert tb.resolve_dtype("auto", "cpu") == "bfloat16"
    assert tb.resolve_dtype("float16", "cpu") == "float16"
    assert tb.resolve_dtype("bfloat16", "cpu") == "bfloat16"


def collect(backend, request: GenerationRequest):
    async def run():
        deltas, result = [], None
        async for chunk in backend.stream(request):
            if chunk.result is not None:
                result = chunk.result
            else:
                deltas.append(chunk.delta)
        return deltas, result

    return asyncio.run(run())


def test_greedy_is_deterministic_and_stream_equals_unary(backend: TransformersBackend) -> None:
    a = asyncio.run(generate(backend, GenerationRequest(MSGS, max_tokens=24)))
    b = asyncio.run(generate(backend, GenerationRequest(MSGS, max_tokens=24)))
    deltas, streamed = collect(backend, GenerationRequest(MSGS, max_tokens=24))
    assert a.text and a.text == b.text
    assert "".join(deltas) == streamed.text == a.text
    assert len(deltas) > 1  # it really streamed
    assert a.completion_tokens <= 24 and a.prompt_tokens == backend.count_prompt_tokens(MSGS)
    assert a.finish_reason in ("length", "stop")


def test_seeded_sampling_reproducible(backend: TransformersBackend) -> None:
    def run(seed: int) -> str:
        req = GenerationRequest(MSGS, max_tokens=20, temperature=1.2, top_p=0.95, seed=seed)
        return asyncio.run(generate(backend, req)).text

    assert run(11) == run(11)
    assert len({run(s) for s in (1, 2, 3)}) > 1


def test_stop_string_cuts_and_reports_stop(backend: TransformersBackend) -> None:
    full = asyncio.run(generate(backend, GenerationRequest(MSGS, max_tokens=24))).text
    word = full.split()[2]
    r = asyncio.run(generate(backend, GenerationRequest(MSGS, max_tokens=24, stop=[word])))
    assert r.text == full[: full.find(word)]
    assert r.finish_reason == "stop"


def test_cancel_stops_generation_early(backend: TransformersBackend) -> None:
    req = GenerationRequest(MSGS, max_tokens=200)

    async def run() -> int:
        n = 0
        async for chunk in backend.stream(req):
            n += 1
            if n == 3:
                req.cancel.set()
            if chunk.result is not None:
                return chunk.result.completion_tokens
        raise AssertionError("no result")

    tokens = asyncio.run(run())
    assert tokens < 40


# --- OpenAI-compatible backend ---------------------------------------------------------------------


class _Server(BaseHTTPRequestHandler):
    """Speaks /v1/chat/completions with SSE the way OpenAI and vLLM servers do; records requests."""

    requests: ClassVar[list[dict]] = []
    fail_with: int | None = None
    delay_s: float = 0.0
    in_flight: ClassVar[list[int]] = [0, 0]  # now, most seen
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        with self.lock:
            self.in_flight[0] += 1
            self.in_flight[1] = max(self.in_flight[1], self.in_flight[0])
        try:
            time.sleep(type(self).delay_s)
            self._answer()
        finally:
            with self.lock:
                self.in_flight[0] -= 1

    def _answer(self) -> None:
        if type(self).fail_with:
            self.send_response(type(self).fail_with)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "model overloaded"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if type(self).requests[-1].get("tools"):  # a call streamed in fragments, as OpenAI's servers do
            parts = [
                {
                    "index": 0,
                    "id": "x1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": '},
                },
                {"index": 0, "function": {"arguments": '2, "b": 3}'}},
            ]
            for part in parts:
                event = {"choices": [{"delta": {"tool_calls": [part]}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(
                b'data: {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}\n\ndata: [DONE]\n\n'
            )
            return
        for piece in ["The area ", "is ", "6."]:
            event = {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n')
        usage = {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 3}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def openai_server() -> Iterator[str]:
    _Server.requests = []
    _Server.fail_with = None
    _Server.delay_s = 0.0
    _Server.in_flight[:] = [0, 0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_openai_streams_and_reports_usage(openai_server: str) -> None:
    b = OpenAIBackend(openai_server, "served-model", api_key="k-123")
    deltas, result = collect(b, GenerationRequest(MSGS, max_tokens=9, temperature=0.5, seed=3, stop=["\n"]))
    assert deltas == ["The area ", "is ", "6."]
    assert result.text == "The area is 6."
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (17, 3, "stop")
    sent = _Server.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer k-123"
    assert sent["model"] == "served-model" and sent["stream"] is True
    assert (sent["max_tokens"], sent["temperature"], sent["seed"], sent["stop"]) == (9, 0.5, 3, ["\n"])
    assert sent["messages"] == MSGS


def test_openai_errors_are_clear(openai_server: str, tmp_path: Path) -> None:
    _Server.fail_with = 503
    b = OpenAIBackend(openai_server, "m")
    with pytest.raises(BackendError, match=r"503.*model overloaded"):
        asyncio.run(generate(b, GenerationRequest(MSGS)))
    closed = OpenAIBackend("http://127.0.0.1:9", "m")
    with pytest.raises(BackendUnavailable, match="unreachable"):
        asyncio.run(generate(closed, GenerationRequest(MSGS)))


def test_openai_backend_bounds_requests_in_flight(openai_server: str) -> None:
    _Server.delay_s = 0.2
    b = OpenAIBackend(openai_server, "m", max_concurrency=2)

    async def run() -> list:
        return await asyncio.gather(*(generate(b, GenerationRequest(MSGS)) for _ in range(6)))

    results = asyncio.run(run())
    assert all(r.text == "The area is 6." for r in results)
    assert _Server.in_flight[1] == 2 and len(_Server.requests) == 6


def test_openai_backend_forwards_the_response_format(openai_server: str) -> None:
    from zoo.inference.backend_protocol import ResponseFormat

    b = OpenAIBackend(openai_server, "m")
    schema = '{"type":"object","properties":{"a":{"type":"integer"}}}'
    asyncio.run(generate(b, GenerationRequest(MSGS, response_format=ResponseFormat("json_schema", schema))))
    asyncio.run(generate(b, GenerationRequest(MSGS, response_format=ResponseFormat("json_object"))))
    sent = [r["response_format"] for r in _Server.requests]
    assert sent[0] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": json.loads(schema)},
    }
    assert sent[1] == {"type": "json_object"}


def test_openai_backend_forwards_tools_and_reads_streamed_calls(openai_server: str) -> None:
    from zoo.inference.tools import Tool, ToolSpec, parse_answer

    add = {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    }
    history = [
        *MSGS,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 1}}}
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "c0"},
    ]
    b = OpenAIBackend(openai_server, "m")
    request = GenerationRequest(
        history,
        tools=[{"type": "function", "function": add}],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    result = asyncio.run(generate(b, request))
    sent = _Server.requests[0]
    assert sent["tools"] == [{"type": "function", "function": add}]
    assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    assert (
        sent["messages"][-2]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 1}'
    )  # JSON text on the wire
    assert sent["messages"][-1] == {"role": "tool", "content": "2", "tool_call_id": "c0"}
    calls = parse_answer(result.text, ToolSpec((Tool("add", "", add["parameters"]),))).calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
