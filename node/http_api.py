"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

It runs in the daemon's own process and event loop (uvicorn on a socket the daemon binds) and shares
what gRPC uses: the inference engine, the admission queue (node/admission.py), the validation rules
(`validate_params`), the domain-error mapping (`status_for`) and the metrics. What is zoo-specific
travels in a `zoo` object: retrieval options in requests, the experiences used and the timings in
responses. Errors always have OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import json
import logging
import re
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import grpc
import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as BodyError
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zoo.inference.backend import BackendError, BackendUnavailable, Chunk, ResponseFormat
from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams
from zoo.inference.structured import parse_response_format
from zoo.node.admission import Admission
from zoo.node.config import HttpConfig, InferenceConfig, parse_listen
from zoo.node.errors import Overloaded, status_for
from zoo.node.inference_service import FieldNames, validate_params
from zoo.node.logs import get_logger
from zoo.node.metrics import NodeMetrics
from zoo.registry.errors import ValidationError

log = get_logger(__name__)

T = TypeVar("T")

BUNDLED_EMBEDDER_ID = "all-MiniLM-L6-v2"
MAX_EMBED_INPUTS = 256
MAX_EMBED_CHARS = 32_768
MAX_EMBED_REQUESTS = 32  # embedding requests running or waiting for the embedder; beyond: 429
DRAIN_FACTOR = 4  # an oversized body is read (and dropped) up to this many times the limit, then cut off

CHAT_FIELDS = FieldNames(
    messages="messages",
    prompt="prompt",
    k="zoo.k",
    max_tokens="max_tokens",
    temperature="temperature",
    top_p="top_p",
    seed="seed",
    stop="stop",
    domain="zoo.domain",
    library_root="zoo.library_root",
)
COMPLETION_FIELDS = dataclasses.replace(CHAT_FIELDS, messages="prompt")

# gRPC status of a domain error -> (HTTP status, OpenAI error type, OpenAI error code).
_HTTP_OF: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", "unsupported"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", None),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error", "not_implemented"),
}


# ---------------------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answer in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


def unsupported(param: str, what: str = "is not supported by this node") -> ApiError:
    return invalid(param, what, code="unsupported_parameter")


def api_error_for(exc: BaseException, rename: Callable[[str], str] = lambda f: f) -> ApiError:
    """The OpenAI error for an exception: domain errors by `status_for`, anything else a logged 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BodyError):
        return _body_error(exc)
    mapped = status_for(exc)
    if mapped is None:
        log.error("unhandled error in HTTP request", exc_info=exc)
        return ApiError(500, f"internal error ({type(exc).__name__}); see the node log", type="server_error")
    grpc_code, message = mapped
    status, kind, code = _HTTP_OF.get(grpc_code, (500, "server_error", None))
    field = getattr(exc, "field", None)
    if not field:
        return ApiError(status, message, type=kind, code=code)
    param = rename(field)
    message = param + message.removeprefix(field) if message.startswith(field) else message
    return ApiError(status, message, type=kind, param=param, code=code)


def _body_error(exc: BodyError) -> ApiError:
    first = exc.errors()[0]
    param = _loc(first["loc"])
    return invalid(param or "body", first["msg"].removeprefix("Value error, "))


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---------------------------------------------------------------------------------------------- bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send vendor fields; ignore what we do not know


class ZooOptions(BaseModel):
    """The zoo extension of a generation request: what to retrieve and how to use it."""

    model_config = ConfigDict(extra="forbid")
    domain: str = ""
    k: int | None = None
    library_root: str = ""
    disable_experiences: bool = False
    use_expert_factors: bool = False


class StreamOptions(_Body):
    include_usage: bool = False


class _Generation(_Body):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored
    zoo: ZooOptions | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Generation):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None


class CompletionRequest(_Generation):
    prompt: Any = None  # a string, or a list of exactly one string
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None


class EmbeddingRequest(_Body):
    model: str
    input: Any = None  # a string or a list of strings
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


# ---------------------------------------------------------------------------------------------- shapes


@dataclass
class _Answer:
    """How one generation endpoint's answers look, whole or as a stream of chunks."""

    id: str
    model: str
    include_usage: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    object: str = ""
    chunk_object: str = ""

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, o: InferOutcome, queue_ms: float) -> dict[str, Any]:
        return {
            **self.head(self.object),
            "choices": [self.choice(o.text, finish_reason(o))],
            "usage": usage(o),
            "zoo": zoo_extension(o, queue_ms),
        }

    def chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        out = {**self.head(self.chunk_object), "choices": [choice], **extra}
        if self.include_usage:
            out.setdefault("usage", None)
        return out

    def opening(self) -> list[dict[str, Any]]:
        return []

    def delta(self, text: str) -> dict[str, Any]:
        return self.chunk(self.chunk_choice(text, None))

    def closing(self, o: InferOutcome, queue_ms: float) -> list[dict[str, Any]]:
        events = [self.chunk(self.chunk_choice(None, finish_reason(o)), zoo=zoo_extension(o, queue_ms))]
        if self.include_usage:
            events.append({**self.head(self.chunk_object), "choices": [], "usage": usage(o)})
        return events

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class ChatAnswer(_Answer):
    object: str = "chat.completion"
    chunk_object: str = "chat.completion.chunk"

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> list[dict[str, Any]]:
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return [self.chunk({**first, "finish_reason": None})]


@dataclass
class CompletionAnswer(_Answer):
    object: str = "text_completion"
    chunk_object: str = "text_completion"

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}


def finish_reason(o: InferOutcome) -> str:
    """OpenAI knows "stop" and "length"; a generation ended early by cancellation reads as "stop"."""
    return "length" if o.finish_reason == "length" else "stop"


def usage(o: InferOutcome) -> dict[str, int]:
    total = o.prompt_tokens + o.completion_tokens
    return {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens, "total_tokens": total}


def zoo_extension(o: InferOutcome, queue_ms: float) -> dict[str, Any]:
    """What the answer was built from: the library version, the experiences used, timings, the seed."""
    return {
        "library_root": o.library_root,
        "library_version": o.library_version,
        "experiences": [{"id": e.id, "score": float(e.score), "cited": e.cited} for e in o.experiences],
        "cited": [e.id for e in o.experiences if e.cited],
        "queue_ms": float(queue_ms),
        "retrieval_ms": float(o.retrieval_ms),
        "generation_ms": float(o.generation_ms),
        "seed": o.seed,
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------------- parsing


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Plain {"role", "content"} turns; text parts are joined, "developer" is the system role."""
    if not messages:
        raise invalid("messages", "must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": _text_of(m.content, f"messages[{i}].content")})
    return out


def _text_of(content: str | list[dict[str, Any]] | None, field: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(
                f"{field}[{j}]",
                f"only text parts are supported (got type {str(part.get('type'))[:40]!r})",
                code="unsupported_content",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt", "must be a string (or a list of exactly one string)")
    if not prompt:
        raise invalid("prompt", "must not be empty")
    return prompt


def response_format(rf: dict[str, Any] | None) -> ResponseFormat | None:
    """OpenAI's response_format, checked by the same rules as gRPC's (`parse_response_format`)."""
    if rf is None:
        return None
    kind = rf.get("type")
    if not isinstance(kind, str):
        raise invalid("response_format.type", "must be one of 'text', 'json_object', 'json_schema'")
    schema = ""
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise invalid("response_format.json_schema.schema", "must be a JSON Schema object")
        schema = json.dumps(spec["schema"])
    try:
        return parse_response_format(kind, schema)
    except ValidationError as e:  # gRPC's json_schema is the schema text; here it sits in json_schema.schema
        raise api_error_for(e, _chat_field) from None


def _check_generation(body: _Generation) -> None:
    """Refuse the OpenAI parameters this node cannot honour instead of silently ignoring them."""
    if body.n not in (None, 1):
        raise invalid("n", "only n = 1 is supported", code="unsupported_value")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0):
            raise unsupported(name, "is not supported by this node (only 0)")
    if body.logit_bias:
        raise unsupported("logit_bias")


def _check_chat(body: ChatRequest) -> None:
    _check_generation(body)
    if body.logprobs or body.top_logprobs:
        raise unsupported("logprobs" if body.logprobs else "top_logprobs")
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise unsupported(name, "tool calling is not supported by this node")
    for name in ("tool_choice", "function_call"):
        if getattr(body, name) not in (None, "none"):
            raise unsupported(name, "tool calling is not supported by this node")


def _check_completion(body: CompletionRequest) -> None:
    _check_generation(body)
    if body.echo:
        raise unsupported("echo")
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "only best_of = 1 is supported")
    if body.logprobs is not None:
        raise unsupported("logprobs")
    if body.suffix:
        raise unsupported("suffix")


def embedding_inputs(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise invalid("input", "must be a non-empty string or a non-empty list of strings")
    if len(texts) > MAX_EMBED_INPUTS:
        raise invalid("input", f"at most {MAX_EMBED_INPUTS} inputs per request")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise invalid(f"input[{i}]", "must be a string (token-id arrays are not supported)")
        if not 0 < len(t) <= MAX_EMBED_CHARS:
            raise invalid(f"input[{i}]", f"must have 1 to {MAX_EMBED_CHARS} characters")
    return texts


def encode_vector(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32 bytes, what OpenAI's clients decode
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


def embedder_model_id(path: Path | None) -> str:
    """The id /v1/models lists for the embedder: its directory's name (the bundled one's hub name)."""
    if path is None:
        return BUNDLED_EMBEDDER_ID
    path = Path(path)
    return path.parent.name if path.name == "model" else path.name


def _read_limit(content_length: str | None, limit: int) -> None:
    if content_length and content_length.isdigit() and int(content_length) > limit * DRAIN_FACTOR:
        raise _too_large(limit)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limit} bytes (http.max_body_bytes)",
        code="request_too_large",
    )


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object: 413 beyond `limit` bytes, 400 when it is not a JSON object."""
    _read_limit(request.headers.get("content-length"), limit)
    body = bytearray()
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit * DRAIN_FACTOR:
            raise _too_large(limit)
        if size <= limit:
            body += piece
    if size > limit:  # read to the end, so the client gets the answer instead of a reset connection
        raise _too_large(limit)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return data


# ---------------------------------------------------------------------------------------------- the API


@dataclass
class ApiDeps:
    """What the HTTP API shares with the rest of the daemon."""

    engine: Callable[[], InferenceEngine | None]
    admission: Admission
    inference: InferenceConfig
    metrics: NodeMetrics
    model_id: str
    embedder: Callable[[], Any]  # the loaded Embedder, or None while it loads
    embedder_id: str
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024


class OpenAIApi:
    """The endpoints; each answers OpenAI's error shape for every failure."""

    def __init__(self, deps: ApiDeps) -> None:
        self.deps = deps
        self.started = int(time.time())
        self._embedding_requests = 0

    # -- generation

    async def chat_completions(self, request: Request) -> Response:
        body = ChatRequest.model_validate(await read_json(request, self.deps.max_body_bytes))
        self._check_model(body.model)
        _check_chat(body)
        names = CHAT_FIELDS
        if body.max_completion_tokens is not None:
            names = dataclasses.replace(names, max_tokens="max_completion_tokens")
        tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = self._params(
            body,
            names,
            messages=chat_messages(body.messages),
            max_tokens=tokens,
            response_format=response_format(body.response_format),
        )
        answer = ChatAnswer("chatcmpl-" + uuid.uuid4().hex, self.deps.model_id, _include_usage(body))
        return await self._answer(request, params, answer, body.stream, _chat_field)

    async def completions(self, request: Request) -> Response:
        body = CompletionRequest.model_validate(await read_json(request, self.deps.max_body_bytes))
        self._check_model(body.model)
        _check_completion(body)
        prompt = completion_prompt(body.prompt)
        params = self._params(body, COMPLETION_FIELDS, prompt=prompt, max_tokens=body.max_tokens)
        answer = CompletionAnswer("cmpl-" + uuid.uuid4().hex, self.deps.model_id, _include_usage(body))
        return await self._answer(request, params, answer, body.stream, _completion_field)

    def _params(self, body: _Generation, names: FieldNames, **fields: Any) -> InferParams:
        zoo = body.zoo or ZooOptions()
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return validate_params(
            self.deps.inference,
            domain=zoo.domain,
            k=zoo.k,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=stop,
            disable_experiences=zoo.disable_experiences,
            library_root=zoo.library_root,
            use_expert_factors=zoo.use_expert_factors,
            names=names,
            **fields,
        )

    async def _answer(
        self,
        request: Request,
        params: InferParams,
        answer: _Answer,
        stream: bool | None,
        rename: Callable[[str], str],
    ) -> Response:
        """Generate; the engine's and backend's ValidationErrors name fields as gRPC does, `rename` maps
        them to this endpoint's JSON."""
        try:
            if stream:
                return await self._stream(request, params, answer)
            outcome, queue_ms = await unless_disconnected(request, self._complete(params))
        except ValidationError as e:
            raise api_error_for(e, rename) from None
        return JSONResponse(answer.whole(outcome, queue_ms))

    def _engine(self) -> InferenceEngine:
        engine = self.deps.engine()
        if engine is None:
            raise BackendUnavailable("the model is still loading; retry shortly (see health of 'model')")
        return engine

    async def _generate(
        self, params: InferParams
    ) -> AsyncGenerator[tuple[float, Chunk | InferOutcome], None]:
        """The engine's chunks and outcome, each with the queue wait, holding an admission slot throughout.

        Closing this generator closes the engine's stream, which stops generation.
        """
        engine = self._engine()
        async with (
            self.deps.admission.slot() as queue_ms,
            contextlib.aclosing(engine.stream(params)) as items,
        ):
            async for item in items:
                yield queue_ms, item

    async def _complete(self, params: InferParams) -> tuple[InferOutcome, float]:
        async with contextlib.aclosing(self._generate(params)) as items:
            async for queue_ms, item in items:
                if isinstance(item, InferOutcome):
                    return item, queue_ms
        raise BackendError("the engine ended its stream without an outcome")

    async def _stream(self, request: Request, params: InferParams, answer: _Answer) -> Response:
        """An SSE answer. The first item is awaited before the response starts, so admission, loading and
        validation failures (queue full, prompt too long, unknown root) are plain HTTP errors."""
        items = self._generate(params)

        async def first() -> tuple[float, Chunk | InferOutcome]:
            return await anext(items)

        try:
            head = await unless_disconnected(request, first())
        except BaseException:
            if not items.ag_running:  # still running only while this handler itself is being cancelled
                await items.aclose()
            raise
        return EventStream(_events(head, items, answer))

    # -- embeddings and models

    async def embeddings(self, request: Request) -> Response:
        body = EmbeddingRequest.model_validate(await read_json(request, self.deps.max_body_bytes))
        if body.model != self.deps.embedder_id:
            raise _model_not_found(body.model, [self.deps.embedder_id], "embedding ")
        texts = embedding_inputs(body.input)
        embedder = self.deps.embedder()
        if embedder is None:
            raise ApiError(
                503,
                "the embedding model is still loading; retry shortly",
                type="server_error",
                code="unavailable",
            )
        if body.dimensions is not None and body.dimensions != embedder.dim:
            raise unsupported("dimensions", f"must be {embedder.dim} (this model's dimension) or absent")
        with self._embedding_slot():
            vectors = await asyncio.to_thread(embedder.embed, texts)
        fmt = body.encoding_format or "float"
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, fmt)}
            for i, v in enumerate(vectors)
        ]
        # Token counts are approximate: whitespace-separated words, not the embedder's tokenizer.
        tokens = sum(len(t.split()) for t in texts)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": self.deps.embedder_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @contextlib.contextmanager
    def _embedding_slot(self) -> Iterator[None]:
        if self._embedding_requests >= MAX_EMBED_REQUESTS:
            raise Overloaded(
                f"{MAX_EMBED_REQUESTS} embedding requests are already running or waiting; retry later"
            )
        self._embedding_requests += 1
        try:
            yield
        finally:
            self._embedding_requests -= 1

    def _cards(self) -> list[dict[str, Any]]:
        return [
            {"id": model, "object": "model", "created": self.started, "owned_by": "zoo-node"}
            for model in (self.deps.model_id, self.deps.embedder_id)
        ]

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self._cards()})

    async def get_model(self, request: Request) -> Response:
        wanted = request.path_params["model"]
        for card in self._cards():
            if card["id"] == wanted:
                return JSONResponse(card)
        raise _model_not_found(wanted, [c["id"] for c in self._cards()])

    def _check_model(self, model: str) -> None:
        if model != self.deps.model_id:
            raise _model_not_found(model, [self.deps.model_id], "chat ")


def _chat_field(field: str) -> str:
    return "response_format.json_schema.schema" if field == "response_format.json_schema" else field


def _completion_field(field: str) -> str:
    return "prompt" if field.startswith("messages") else field


def _include_usage(body: _Generation) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _model_not_found(model: str, served: list[str], kind: str = "") -> ApiError:
    return ApiError(
        404,
        f"the model {model[:200]!r} does not exist on this node; "
        f"its {kind}model is {', '.join(map(repr, served))}",
        param="model",
        code="model_not_found",
    )


async def _events(
    head: tuple[float, Chunk | InferOutcome],
    items: AsyncGenerator[tuple[float, Chunk | InferOutcome], None],
    answer: _Answer,
) -> AsyncGenerator[bytes, None]:
    """SSE events of one answer; an error after the stream started is one `error` event, then the end."""
    try:
        for event in answer.opening():
            yield sse(event)
        queue_ms, item = head
        while not isinstance(item, InferOutcome):
            yield sse(answer.delta(item.delta))
            queue_ms, item = await anext(items)
        for event in answer.closing(item, queue_ms):
            yield sse(event)
        yield SSE_DONE
    except Exception as e:
        yield sse(api_error_for(e).body())
    finally:
        await items.aclose()


class EventStream(StreamingResponse):
    """An SSE response that closes its event generator however the response ends (a client that hangs
    up cancels the send; closing the generator then stops generation and frees the admission slot)."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._events.ag_running:
                await self._events.aclose()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client hangs up first (a cancelled generation stops)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieve)
        task.cancel()
        raise
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait({task})  # let it unwind: the generation stops and its slot is freed
        _retrieve(task)
        raise ApiError(499, "the client closed the request", code="client_closed_request")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume a cancelled task's outcome, so an error raised while it stopped is not reported as lost."""
    if not task.cancelled():
        task.exception()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---------------------------------------------------------------------------------------------- the app


def build_app(deps: ApiDeps) -> ASGIApp:
    """The ASGI app: FastAPI routes behind a gate that authenticates and counts every request."""
    api = OpenAIApi(deps)
    app = FastAPI(title="zoo-node OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    routes: list[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = [
        ("POST", "/v1/chat/completions", api.chat_completions),
        ("POST", "/v1/completions", api.completions),
        ("POST", "/v1/embeddings", api.embeddings),
        ("GET", "/v1/models", api.list_models),
        ("GET", "/v1/models/{model:path}", api.get_model),
    ]
    for method, path, handler in routes:
        app.add_api_route(path, _guarded(handler), methods=[method], response_model=None)
    app.add_exception_handler(HTTPException, _http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_exception)  # type: ignore[arg-type]
    return Gate(app, deps.metrics, deps.api_key)


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as e:
            error = api_error_for(e)
            if error.status != 499:
                log.info(
                    "http request refused", path=request.url.path, status=error.status, reason=error.message
                )
            return error.response()

    return endpoint


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = f"{request.method} {request.url.path} is not a route of this API (see GET /v1/models)"
        return ApiError(404, message, code="not_found").response()
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 405:
        message = (
            f"{request.method} is not allowed on {request.url.path} (use {headers.get('Allow', 'POST')})"
        )
    return ApiError(exc.status_code, message, code="method_not_allowed", headers=headers).response()


async def _validation_exception(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    return invalid(_loc(tuple(first["loc"])[1:]) or "body", str(first["msg"])).response()


class Gate:
    """Outermost layer: API-key check for /v1/*, and per-route request counts and latency (to the last
    byte of a stream). Routes are labelled by their template; anything else is "other"."""

    def __init__(self, app: FastAPI, metrics: NodeMetrics, api_key: str | None) -> None:
        self.app = app
        self.metrics = metrics
        self._key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._route(scope)
        status = 500
        start = time.perf_counter()

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if scope["path"].startswith("/v1/") and not self._authorized(scope):
                await _unauthorized().response()(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            self.metrics.http_requests.labels(route, str(status)).inc()
            self.metrics.http_latency.labels(route).observe(time.perf_counter() - start)

    def _route(self, scope: Scope) -> str:
        for r in self.app.router.routes:
            match, _ = r.matches(scope)
            if match is not Match.NONE:
                return re.sub(r":\w+}", "}", getattr(r, "path", "other"))
        return "other"

    def _authorized(self, scope: Scope) -> bool:
        if self._key is None:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False


def _unauthorized() -> ApiError:
    return ApiError(
        401,
        "missing or wrong API key: send 'Authorization: Bearer <key>' (the key is http.api_key)",
        type="authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


# ---------------------------------------------------------------------------------------------- serving


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the daemon owns SIGINT/SIGTERM and stops the server itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class HttpServer:
    """The running HTTP API: its base address (http://HOST:PORT) and how to stop it."""

    address: str
    server: uvicorn.Server
    task: asyncio.Task[None]

    async def stop(self, grace_s: float) -> None:
        """Stop accepting connections; requests in flight get `grace_s` to finish, then are cancelled."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace_s + 5)
        except TimeoutError:
            self.server.force_exit = True
            self.task.cancel()
            await asyncio.wait({self.task})
        except Exception as e:  # the server failed while stopping: the node stops all the same
            log.error("the HTTP API server failed", exc_info=e)


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on HOST:PORT (port 0: any free port); OSError when it cannot be bound."""
    host, port = parse_listen(listen)
    family, kind, proto, _, addr = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def start_http_api(cfg: HttpConfig, deps: ApiDeps, grace_s: float) -> HttpServer:
    """Bind cfg.listen and serve the API in this event loop; OSError when the address cannot be bound."""
    sock = bind(cfg.listen)
    host, _ = parse_listen(cfg.listen)
    port = sock.getsockname()[1]
    deps = dataclasses.replace(
        deps,
        api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
        max_body_bytes=cfg.max_body_bytes,
    )
    logging.getLogger("uvicorn").setLevel(max(logging.WARNING, logging.getLogger().level))
    config = uvicorn.Config(
        build_app(deps),
        log_config=None,
        access_log=False,
        lifespan="off",
        http="h11",
        ws="none",
        server_header=False,
        timeout_graceful_shutdown=max(1, round(grace_s)),
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="http-api")
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        task.result()  # raises what made it fail
        raise OSError("the HTTP server stopped during start-up")
    return HttpServer(f"http://{host}:{port}", server, task)
