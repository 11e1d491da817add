"""Map domain exceptions to precise gRPC status codes (never everything to INTERNAL).

Domain code raises the exceptions of its own layer (zoo.registry.errors and friends); the interceptor
asks `status_for` which code a client should see. Unknown exceptions are INTERNAL and logged with
their traceback; their text is not sent to the client.
"""

from __future__ import annotations

import grpc

from zoo.inference.adapters import AdapterLoadError
from zoo.inference.backend import BackendUnavailable
from zoo.inference.engine import Unsupported
from zoo.node.credits.consent import SpendUnavailable
from zoo.node.credits.signing import SignatureError
from zoo.node.credits.verifier import TooManyNonces
from zoo.registry import errors as reg


class Unimplemented(reg.ZooError):
    """The RPC exists in the API but this node does not implement it yet."""


_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (reg.ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (reg.NotFound, grpc.StatusCode.NOT_FOUND),
    (reg.IntegrityError, grpc.StatusCode.DATA_LOSS),
    (reg.IpfsUnavailable, grpc.StatusCode.UNAVAILABLE),
    (reg.IpfsTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (reg.IpfsError, grpc.StatusCode.UNAVAILABLE),
    (reg.Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyNonces, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (SpendUnavailable, grpc.StatusCode.UNAVAILABLE),
    (SignatureError, grpc.StatusCode.UNAUTHENTICATED),
    (Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    (AdapterLoadError, grpc.StatusCode.FAILED_PRECONDITION),
    (BackendUnavailable, grpc.StatusCode.UNAVAILABLE),
    (PermissionError, grpc.StatusCode.PERMISSION_DENIED),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ConnectionError, grpc.StatusCode.UNAVAILABLE),
]


def register(exc_type: type[BaseException], code: grpc.StatusCode) -> None:
    """Let a layer added later (inference, jobs) map its own exceptions; earlier entries win."""
    _CODES.append((exc_type, code))


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status code and client-facing message for a domain error, or None for an unexpected one."""
    for exc_type, code in _CODES:
        if isinstance(exc, exc_type):
            return code, str(exc)
    return None
