"""Serving the HTTP API: the ASGI app (FastAPI routes behind a gate that checks the API key and counts
every request) and uvicorn in the daemon's own event loop, on a socket the daemon binds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zoo.node.api.http.error_bodies import ApiError, api_error_for, invalid, loc
from zoo.node.api.http.routes import ApiDeps, OpenAIApi
from zoo.node.config import HttpConfig, parse_listen
from zoo.node.logs import get_logger
from zoo.node.metrics import NodeMetrics

log = get_logger(__name__)


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
    if deps.webapp is not None:
        deps.webapp.add_routes(app)
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
    return invalid(loc(tuple(first["loc"])[1:]) or "body", str(first["msg"])).response()


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
        "missing or wrong API key: send 'Authorization: Bearer <key>' (the key is server.api_key)",
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
    deps = dataclasses.replace(deps, max_body_bytes=cfg.max_body_bytes)
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
