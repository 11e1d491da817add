"""Errors of the HTTP API in OpenAI's shape, {"error": {"message", "type", "param", "code"}}: domain
errors by node/api/status_codes.py's table (their gRPC code's HTTP status), body-validation errors by
the field they name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError as BodyError

from zoo.node.api.status_codes import HTTP, status_for
from zoo.node.logs import get_logger

log = get_logger(__name__)


class ApiError(Exception):
    """An error answer in OpenAI's shape.

    Not a ZooError: it is the HTTP answer itself and carries its own status, so no one row of
    node/api/status_codes.py's table fits it; it never leaves the HTTP API."""

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
    """The OpenAI error for an exception: domain errors by `status_for` and `HTTP`, anything else (INTERNAL)
    a logged 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BodyError):
        return _body_error(exc)
    mapped = status_for(exc)
    if mapped is None:
        log.error("unhandled error in HTTP request", exc_info=exc)
        return ApiError(500, f"internal error ({type(exc).__name__}); see the node log", type="server_error")
    grpc_code, message = mapped
    status, kind, code = HTTP[grpc_code]
    field = getattr(exc, "field", None)
    if not field:
        return ApiError(status, message, type=kind, code=code)
    param = rename(field)
    message = param + message.removeprefix(field) if message.startswith(field) else message
    return ApiError(status, message, type=kind, param=param, code=code)


def _body_error(exc: BodyError) -> ApiError:
    first = exc.errors()[0]
    param = loc(first["loc"])
    return invalid(param or "body", first["msg"].removeprefix("Value error, "))


def loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
