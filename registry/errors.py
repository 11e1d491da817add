"""ZooError, the root of zoo-node's exceptions, and the domain exceptions of the registry layer;
node/api/status_codes.py maps each class to one gRPC status code and one HTTP status."""

from __future__ import annotations


class ZooError(Exception):
    """Base of zoo-node's exceptions; `values` keeps the offending values for logs and error details.

    Every exception class of the packages derives from it, or says in its docstring why it must not ("Not a
    ZooError: ..."); node/api/status_codes.py gives each one gRPC code and one HTTP status."""

    def __init__(self, message: str, **values: object) -> None:
        super().__init__(message)
        self.message = message
        self.values = values


class ValidationError(ZooError, ValueError):
    """Input that breaks the schema or a limit; `field` names where (e.g. `experiences[3].confidence`)."""

    def __init__(self, field: str, message: str, **values: object) -> None:
        super().__init__(f"{field}: {message}", **values)
        self.field = field


class NotFound(ZooError, LookupError):
    """A requested item (experience id, library version, ...) does not exist."""


class Overloaded(ZooError):
    """A node (its inference queue, its job queue) is at capacity; the client should retry later."""


class IntegrityError(ZooError):
    """Content does not match the Merkle root or CID that should commit to it."""


class IpfsError(ZooError):
    """The IPFS daemon refused or failed a request; the message carries the daemon's own words."""


class IpfsUnavailable(IpfsError):
    """The IPFS daemon's RPC API cannot be reached."""


class IpfsTimeout(IpfsError):
    """An IPFS request ran out of time (e.g. `cat` of content no reachable peer has)."""


class ContentTooLarge(IpfsError):
    """Content is bigger than the caller's limit; fetching it again would not help."""
