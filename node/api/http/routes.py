"""The endpoints of the HTTP API and what they share with the daemon (`ApiDeps`): generation through
the admission queue and the engine, whole or streamed as SSE, embeddings and models. A client that hangs
up cancels its request, which stops generation and frees the admission slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from zoo.inference.backend_protocol import BackendError, Chunk
from zoo.inference.engine import InferOutcome, InferParams
from zoo.inference.provenance.documents import sha256_hex
from zoo.inference.tools import render_turns
from zoo.node.api.admission import Admission
from zoo.node.api.http.error_bodies import ApiError, api_error_for, invalid, unsupported
from zoo.node.api.http.responses import SSE_DONE, Answer, ChatAnswer, CompletionAnswer, encode_vector, sse
from zoo.node.api.http.schemas import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Generation,
    ZooOptions,
    chat_field,
    chat_messages,
    check_chat,
    check_completion,
    completion_field,
    completion_prompt,
    embedding_inputs,
    parse_json,
    read_body,
    response_format,
    tool_spec,
)
from zoo.node.api.serving import (
    FieldNames,
    ModelNotServed,
    ServingRules,
    outcome_from_proto,
    params_to_request,
    validate_params,
)
from zoo.node.config import InferenceConfig
from zoo.node.credits.consent import SpendUnavailable
from zoo.node.credits.identity import Identify
from zoo.node.credits.signing import HEADER, SPEND_HEADER, SignatureError
from zoo.node.credits.verifier import ANONYMOUS, Client, TooManyNonces
from zoo.node.metrics import NodeMetrics
from zoo.node.provenance.receipts import REQUEST_SHA256
from zoo.registry.errors import Overloaded, ValidationError

if TYPE_CHECKING:
    from zoo.node.webapp.site import WebApp

T = TypeVar("T")

BUNDLED_EMBEDDER_ID = "all-MiniLM-L6-v2"
MAX_EMBED_REQUESTS = 32  # embedding requests running or waiting for the embedder; beyond: 429


def embedder_model_id(path: Path | None) -> str:
    """The id /v1/models lists for the embedder: its directory's name (the bundled one's hub name)."""
    if path is None:
        return BUNDLED_EMBEDDER_ID
    path = Path(path)
    return path.parent.name if path.name == "model" else path.name


@dataclass
class ApiDeps:
    """What the HTTP API shares with the rest of the daemon."""

    rules: ServingRules  # placement, readiness and priority, as gRPC applies them (node/api/serving.py)
    admission: Admission
    inference: InferenceConfig
    metrics: NodeMetrics
    model_id: str
    embedder: Callable[[], Any]  # the loaded Embedder, or None while it loads
    embedder_id: str
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    identify: Identify | None = None  # signed requests (node.credits); None: every client is anonymous
    model_sha256: str = ""  # the served weights' SHA-256; "" when unknown (a remote backend)
    adapter_sha256: Callable[[str], str] | None = None  # an adapter's SHA-256 by name (hashed once)
    webapp: WebApp | None = None  # the governance web app at / (http.app); None: not served


class OpenAIApi:
    """The endpoints; each answers OpenAI's error shape for every failure."""

    def __init__(self, deps: ApiDeps) -> None:
        self.deps = deps
        self.started = int(time.time())
        self._embedding_requests = 0

    # -- generation

    async def _signed_json(self, request: Request) -> tuple[dict[str, Any], Client]:
        """The JSON body and the client that sent it: its signer (and consent to spend), or anonymous (see
        node.credits). A signature covers the body's bytes as sent, so they are checked before parsing."""
        raw = await read_body(request, self.deps.max_body_bytes)
        REQUEST_SHA256.set(sha256_hex(raw))  # what an answer's receipt names as its request
        client = ANONYMOUS
        if self.deps.identify is not None:
            where = f"{request.method} {request.url.path}"
            try:
                client = self.deps.identify(
                    request.headers.get(HEADER), where, raw, request.headers.get(SPEND_HEADER)
                )
            except TooManyNonces as e:
                raise ApiError(429, str(e), type="rate_limit_error", code="rate_limit_exceeded") from None
            except SpendUnavailable as e:
                raise ApiError(503, str(e), type="server_error", code="spend_unavailable") from None
            except SignatureError as e:
                raise ApiError(
                    401, str(e), type="authentication_error", code=f"signature_{e.reason}"
                ) from None
        return parse_json(raw), client

    async def chat_completions(self, request: Request) -> Response:
        data, client = await self._signed_json(request)
        body = ChatRequest.model_validate(data)
        adapter, remote = self._placement(body.model)
        logprobs = check_chat(body)
        tools = tool_spec(body)
        conversation = chat_messages(body.messages)
        if tools is not None and tools.calls and body.response_format is not None:
            raise invalid("response_format", "cannot be combined with tools the model may call")
        names = CHAT_FIELDS
        if body.max_completion_tokens is not None:
            names = dataclasses.replace(names, max_tokens="max_completion_tokens")
        tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = self._params(
            body,
            names,
            messages=render_turns(conversation, tools),  # validated as the model will read them
            max_tokens=tokens,
            response_format=response_format(body.response_format),
            adapter=adapter,
            client=client,
        )
        n = self._choices(body)
        calls = tools if tools is not None and tools.calls else None
        params = dataclasses.replace(params, messages=conversation, logprobs=logprobs, n=n, tools=calls)
        answer = ChatAnswer(
            "chatcmpl-" + uuid.uuid4().hex,
            body.model,
            _include_usage(body),
            n=n,
            logprobs=logprobs is not None,
            tools=calls is not None,
        )
        return await self._answer(request, params, answer, body.stream, chat_field, remote)

    async def completions(self, request: Request) -> Response:
        data, client = await self._signed_json(request)
        body = CompletionRequest.model_validate(data)
        adapter, remote = self._placement(body.model)
        check_completion(body)
        prompt = completion_prompt(body.prompt)
        # A text prompt is one user turn of the chat template, with experiences; token ids (which no
        # template can wrap) and any echoed prompt are continued as given, so that the log-probabilities
        # that come back score exactly what the client sent.
        as_given = isinstance(prompt, list) or bool(body.echo)
        stand_in = prompt if isinstance(prompt, str) else f"[{len(prompt)} token ids]"
        params = self._params(
            body,
            COMPLETION_FIELDS,
            prompt=stand_in,
            max_tokens=body.max_tokens,
            adapter=adapter,
            client=client,
        )
        n = self._choices(body)
        params = dataclasses.replace(
            params, logprobs=body.logprobs, prompt=prompt if as_given else None, echo=bool(body.echo), n=n
        )
        answer = CompletionAnswer(
            "cmpl-" + uuid.uuid4().hex,
            body.model,
            _include_usage(body),
            n=n,
            logprobs=body.logprobs,
            echo=bool(body.echo),
        )
        return await self._answer(request, params, answer, body.stream, completion_field, remote)

    def _choices(self, body: Generation) -> int:
        n, limit = (1 if body.n is None else body.n), self.deps.inference.max_n
        if not 1 <= n <= limit:
            raise invalid("n", f"must be in [1, {limit}] (inference.max_n) (got {n})")
        return n

    def _params(
        self, body: Generation, names: FieldNames, client: Client = ANONYMOUS, **fields: Any
    ) -> InferParams:
        zoo = body.zoo or ZooOptions()
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        params = validate_params(
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
        return dataclasses.replace(
            params, client=client.address, spend=client.spend, receipt=zoo.receipt, proof=zoo.proof,
            request_sha256=REQUEST_SHA256.get(),
        )  # fmt: skip

    async def _answer(
        self,
        request: Request,
        params: InferParams,
        answer: Answer,
        stream: bool | None,
        rename: Callable[[str], str],
        remote: str = "",
    ) -> Response:
        """Generate (here, or at a peer serving `remote`); the engine's and backend's ValidationErrors name
        fields as gRPC does, `rename` maps them to this endpoint's JSON."""
        from zoo.node.p2p.routing import PeerRefused

        if remote:
            # The peer protocol carries none of these: refused rather than answered without them.
            for name, used in (
                ("logprobs", params.logprobs is not None),
                ("echo", params.echo),
                ("n", params.n > 1),
                ("tools", params.tools is not None),
            ):
                if used:
                    raise unsupported(
                        name, f"is not supported for {remote!r}, a model this node routes to a peer"
                    )
        try:
            if stream:
                return await self._stream(request, params, answer, remote)
            outcome, queue_ms = await unless_disconnected(request, self._complete(params, remote))
        except ValidationError as e:
            raise api_error_for(e, rename) from None
        except PeerRefused as e:
            raise ApiError(_HTTP_STATUS_OF_GRPC.get(e.code, 502), str(e), type="peer_error") from None
        return JSONResponse(answer.whole(outcome, queue_ms))

    async def _generate(
        self, params: InferParams, remote: str = ""
    ) -> AsyncGenerator[tuple[float, Chunk | InferOutcome], None]:
        """The engine's chunks and outcome, each with the queue wait, holding an admission slot throughout.
        With `remote` (a model a peer serves), the peer's, through the router (no local slot).

        Closing this generator closes the engine's stream, which stops generation.
        """
        if remote:
            async for chunk in self.deps.rules.router.infer_stream(params_to_request(params, remote)):
                if chunk.HasField("final"):
                    yield 0.0, outcome_from_proto(chunk.final)
                else:
                    yield 0.0, Chunk(delta=chunk.delta)
            return
        engine = self.deps.rules.engine()
        async with (
            self.deps.admission.slot(await self.deps.rules.prioritise(params)) as queue_ms,
            contextlib.aclosing(engine.stream(params)) as items,
        ):
            async for item in items:
                if isinstance(item, InferOutcome):
                    self.deps.rules.attest(item, params)
                yield queue_ms, item

    async def _complete(self, params: InferParams, remote: str = "") -> tuple[InferOutcome, float]:
        async with contextlib.aclosing(self._generate(params, remote)) as items:
            async for queue_ms, item in items:
                if isinstance(item, InferOutcome):
                    return item, queue_ms
        raise BackendError("the engine ended its stream without an outcome")

    async def _stream(self, request: Request, params: InferParams, answer: Answer, remote: str) -> Response:
        """An SSE answer. The first item is awaited before the response starts, so admission, loading and
        validation failures (queue full, prompt too long, unknown root) are plain HTTP errors."""
        items = self._generate(params, remote)

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
        data, _client = await self._signed_json(request)  # signed or anonymous alike; not metered
        body = EmbeddingRequest.model_validate(data)
        if not self.deps.embedder_id or body.model != self.deps.embedder_id:
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

    def _adapter_names(self) -> list[str]:
        return self.deps.rules.adapters()

    def _cards(self) -> list[dict[str, Any]]:
        """The models' cards; the served model's and each adapter's carry their weights' SHA-256 (an extra
        field OpenAI's clients ignore). Run in a thread: an adapter seen for the first time is hashed."""
        card = {"object": "model", "created": self.started, "owned_by": "zoo-node"}
        model, embedder = self.deps.model_id, self.deps.embedder_id
        sha256 = {"sha256": self.deps.model_sha256} if self.deps.model_sha256 else {}
        adapters = self._adapter_names()
        return [
            *([{"id": model, **card, **sha256}] if model else []),
            *([{"id": embedder, **card}] if embedder else []),
            # Adapters are models of their own, as OpenAI-compatible servers list LoRA adapters.
            *({"id": name, **card, "parent": model, **self._adapter_hash(name)} for name in adapters),
        ]

    def _adapter_hash(self, name: str) -> dict[str, str]:
        if self.deps.adapter_sha256 is None:
            return {}
        try:
            return {"sha256": self.deps.adapter_sha256(name)}
        except (OSError, ValidationError):
            return {}  # removed while the list was read: its card goes without a hash

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": await asyncio.to_thread(self._cards)})

    async def get_model(self, request: Request) -> Response:
        wanted = request.path_params["model"]
        cards = await asyncio.to_thread(self._cards)
        for card in cards:
            if card["id"] == wanted:
                return JSONResponse(card)
        raise _model_not_found(wanted, [c["id"] for c in cards])

    def _placement(self, model: str) -> tuple[str, str]:
        """(adapter, remote model) by serving.py's placement rule; a model nobody serves is OpenAI's 404
        model_not_found, as its clients expect."""
        if not model:  # proto3's "unset" means the base model over gRPC; in JSON "" names no model
            raise _model_not_found(model, [self.deps.model_id, *self._adapter_names()], "chat ")
        try:
            placement = self.deps.rules.place(model)
        except ModelNotServed as e:
            raise _model_not_found(model, e.served, "chat ") from None
        return placement.adapter, placement.remote


# A peer's refusal, passed on: the gRPC status it answered, as an HTTP status.
_HTTP_STATUS_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 502,  # this node's credentials at the peer, not the client's
    grpc.StatusCode.PERMISSION_DENIED: 502,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
}


def _include_usage(body: Generation) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _model_not_found(model: str, served: list[str], kind: str = "") -> ApiError:
    served = [s for s in served if s]  # a light node serves none
    if not served:
        here = f"it serves no {kind}model (a light node: model.backend = 'none')"
    elif len(served) > 1:
        here = f"its {kind}models are {', '.join(map(repr, served))}"
    else:
        here = f"its {kind}model is {served[0]!r}"
    message = f"the model {model[:200]!r} does not exist on this node; {here}"
    return ApiError(404, message, param="model", code="model_not_found")


async def _events(
    head: tuple[float, Chunk | InferOutcome],
    items: AsyncGenerator[tuple[float, Chunk | InferOutcome], None],
    answer: Answer,
) -> AsyncGenerator[bytes, None]:
    """SSE events of one answer; an error after the stream started is one `error` event, then the end."""
    try:
        for event in answer.opening():
            yield sse(event)
        queue_ms, item = head
        while not isinstance(item, InferOutcome):
            for event in answer.delta(item):
                yield sse(event)
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
