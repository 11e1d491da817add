"""The one server interceptor: admin authentication, signed requests, concurrency limit, error mapping
and metrics.

Servicers stay thin; everything that applies to every RPC lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc.aio import AbortError

from zoo.inference.provenance.documents import sha256_hex
from zoo.node.api.status_codes import status_for
from zoo.node.credits.identity import CLIENT, Identify
from zoo.node.credits.signing import HEADER, SPEND_HEADER, SignatureError
from zoo.node.logs import get_logger
from zoo.node.metrics import NodeMetrics
from zoo.node.provenance.receipts import REQUEST_SHA256
from zoo.registry.errors import ValidationError

log = get_logger(__name__)

# Admin services/methods: spend keys, write the library or run jobs.
ADMIN_PREFIXES = ("/zoo.v1.JobService/",)
# Health and reflection must answer load balancers and grpcurl even when the node is busy.
UNLIMITED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
# Generation RPCs pass the generic RPC limit: they queue in their own admission (node/api/admission.py),
# which waits for a slot instead of refusing at once.
SELF_ADMITTED = (
    "/zoo.v1.InferenceService/Infer",
    "/zoo.v1.InferenceService/InferStream",
    "/zoo.v1.InferenceService/VerifyAnswer",  # a prefill: it waits for a generation slot too
)
# Public inference: open, or guarded by server.api_key when one is set (the HTTP API checks the same key).
PUBLIC_PREFIXES = ("/zoo.v1.InferenceService/",)


class NodeInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        metrics: NodeMetrics,
        admin_token: str,
        max_concurrent: int,
        admin_methods: tuple[str, ...] = (),
        api_key: str | None = None,
        identify: Identify | None = None,
    ) -> None:
        self.metrics = metrics
        self._identify = identify  # signed requests (node.credits); None: every client is anonymous
        self._token = admin_token.encode()
        self._api_key = api_key.encode() if api_key else None
        self._slots = asyncio.Semaphore(max_concurrent)
        self._admin = ADMIN_PREFIXES + admin_methods

    def _authorized(self, metadata: tuple[Any, ...] | None, secret: bytes | None = None) -> bool:
        secret = self._token if secret is None else secret
        for key, value in metadata or ():
            if key == "authorization":
                scheme, _, token = (value if isinstance(value, str) else value.decode()).partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), secret)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if method.startswith(self._admin) and not self._authorized(details.invocation_metadata):
            self.metrics.rpc_rejected.labels(method, "unauthenticated").inc()
            return _replace(handler, _deny(grpc.StatusCode.UNAUTHENTICATED, _auth_message(method)))
        if (
            self._api_key is not None
            and method.startswith(PUBLIC_PREFIXES)
            and not self._authorized(details.invocation_metadata, self._api_key)
        ):
            self.metrics.rpc_rejected.labels(method, "unauthenticated").inc()
            message = f"{method} needs metadata 'authorization: Bearer <key>' with this node's server.api_key"
            return _replace(handler, _deny(grpc.StatusCode.UNAUTHENTICATED, message))
        if method.startswith(UNLIMITED_PREFIXES):
            return handler
        signature = spend = None
        public = self._identify is not None and method.startswith(PUBLIC_PREFIXES)
        if public:
            signature = _metadata(details.invocation_metadata, HEADER)
            spend = _metadata(details.invocation_metadata, SPEND_HEADER)
            if signature is None and not self._identify.allow_anonymous:
                try:
                    self._identify(None, method, b"")
                except SignatureError as e:
                    self.metrics.rpc_rejected.labels(method, "unauthenticated").inc()
                    return _replace(handler, _deny(grpc.StatusCode.UNAUTHENTICATED, str(e)))
        # A public call's bytes are kept: a signature covers them, and an answer's receipt names them.
        keep_raw = public
        return _replace(handler, self._wrap(method, handler, signature, spend), keep_raw=keep_raw)

    @contextlib.asynccontextmanager
    async def _accounted(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """One RPC's admission, error mapping and metrics, shared by unary and streaming handlers."""
        metrics = self.metrics
        limited = method not in SELF_ADMITTED
        if limited and self._slots.locked():
            metrics.rpc_rejected.labels(method, "overloaded").inc()
            metrics.rpc_requests.labels(method, "RESOURCE_EXHAUSTED").inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "node is at its concurrency limit")
        start = time.perf_counter()
        code = "OK"
        async with self._slots if limited else contextlib.nullcontext():
            try:
                yield
            except AbortError:
                code = _code_name(context)
                raise
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as e:
                status, message = _map_error(e, method)
                code = status.name
                await context.abort(status, message)
            finally:
                metrics.rpc_requests.labels(method, code).inc()
                metrics.rpc_latency.labels(method).observe(time.perf_counter() - start)

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler, signature: str | None, spend: str | None
    ) -> Callable[..., Any]:
        def admit(request: Any) -> Any:
            """The decoded request, once its signature (if any) checks out; CLIENT says who sent it."""
            if isinstance(request, _Received):
                _check_decoded(request.message, method)
                assert self._identify is not None
                CLIENT.set(self._identify(signature, method, request.raw, spend))
                REQUEST_SHA256.set(sha256_hex(request.raw))
                return request.message
            _check_decoded(request, method)
            return request

        if handler.unary_unary or handler.stream_unary:
            inner = handler.unary_unary or handler.stream_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with self._accounted(method, context):
                    return await inner(admit(request), context)

            return unary

        inner_stream = handler.unary_stream or handler.stream_stream

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            # Streams are forwarded item by item; the accounting covers the whole call.
            async with self._accounted(method, context):
                result = inner_stream(admit(request), context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:  # a coroutine that writes with context.write() (or aborts)
                    await result

        return streaming


def _auth_message(method: str) -> str:
    return (
        f"{method} is an admin RPC: send metadata 'authorization: Bearer <token>' "
        "(the token is server.admin_token, or DATA_DIR/admin.token when unset)"
    )


def _code_name(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _map_error(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    mapped = status_for(exc)
    if mapped is None:
        log.error("unhandled error in RPC", method=method, exc_info=exc)
        return (
            grpc.StatusCode.INTERNAL,
            f"internal error in {method} ({type(exc).__name__}); see the node log",
        )
    log.info("rpc refused", method=method, code=mapped[0].name, reason=mapped[1])
    return mapped


def _metadata(metadata: tuple[Any, ...] | None, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class _Received:
    """A request decoded together with its bytes as received (what a signature covers)."""

    def __init__(self, message: Any, raw: bytes) -> None:
        self.message = message
        self.raw = raw


class _Undecodable:
    """Stands in for a request whose bytes are not a valid message of the method's request type."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(
    deserializer: Callable[[bytes], Any] | None, keep_raw: bool = False
) -> Callable[[bytes], Any] | None:
    """A deserializer that hands bad bytes on as _Undecodable, so the RPC answers INVALID_ARGUMENT
    (grpc would answer UNKNOWN for a deserializer that raises); with keep_raw, as _Received with them."""
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            message = deserializer(data)
        except Exception as e:  # protobuf's DecodeError, or anything a custom deserializer raises
            message = _Undecodable(e)
        return _Received(message, bytes(data)) if keep_raw else message

    return parse


def _check_decoded(request: Any, method: str) -> None:
    if isinstance(request, _Undecodable):
        raise ValidationError(
            "request", f"the payload of {method} is not a valid protobuf message ({request.error})"
        )


def _deny(code: grpc.StatusCode, message: str) -> Callable[..., Any]:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    return deny


def _replace(
    handler: grpc.RpcMethodHandler, behaviour: Callable[..., Any], keep_raw: bool = False
) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serialisers as `handler`, running `behaviour`."""
    kw = {
        "request_deserializer": _lenient(handler.request_deserializer, keep_raw),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(behaviour, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(behaviour, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(behaviour, **kw)
    return grpc.stream_stream_rpc_method_handler(behaviour, **kw)
