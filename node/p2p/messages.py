"""What nodes say to each other on gossip topics: library announcements and capabilities.

A message is compact JSON of one pydantic model. Receivers validate everything: unknown fields are
ignored (a newer node may add some), oversized or malformed messages raise MessageError with the
reason, which the p2p component counts per reason in metrics. Nothing in a message is trusted: an
announcement is only a hint that the receiver checks against its own chain client, and capabilities
only decide where a node *tries* to route.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from zoo.registry import untrusted_json
from zoo.registry.cids import cid_problem
from zoo.registry.errors import ZooError

LIBRARY_TOPIC = "/zoo/library/1"
CAPABILITIES_TOPIC = "/zoo/capabilities/1"
MAX_MESSAGE_BYTES = 4096  # both kinds are a few hundred bytes; anything near this is abuse

Root = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-f]{64}$")]
Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")]
# host:port, or a URL for the HTTP API; loopback and private addresses are the operator's business.
Endpoint = Annotated[str, StringConstraints(max_length=256, pattern=r"^[\x21-\x7e]*$")]


class MessageError(ZooError, ValueError):
    """A message that is not well-formed; `reason` is a short metrics label (oversized, malformed, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, str_strip_whitespace=False)


class Announcement(_Message):
    """A node activated this library version; receivers check `root` on their own chain first."""

    version: int = Field(ge=1, le=2**63)
    root: Root
    cid: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    chain_id: int = Field(ge=1, le=2**63)
    registry: Address

    def model_post_init(self, _context: Any) -> None:
        problem = cid_problem(self.cid)
        if problem is not None:
            raise ValueError(f"cid: {problem}")


class Capabilities(_Message):
    """What a node serves and accepts, refreshed periodically; stale ones expire (see PeerBook)."""

    models: list[Name] = Field(default_factory=list, max_length=64)
    # The SHA-256 of the weights its first model names (zoo.inference.provenance.weights); "" when the node
    # cannot know it (a remote backend) or serves none. A claim, as all of this is, until an answer proves it.
    model_sha256: Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{64})?$")] = ""
    backend: Name
    gpu: bool = False
    library_version: int = Field(0, ge=0, le=2**63)
    library_root: Annotated[str, StringConstraints(pattern=r"^(0x[0-9a-f]{64})?$")] = ""
    job_types: list[Name] = Field(default_factory=list, max_length=16)
    grpc: Endpoint = ""
    grpc_over_p2p: bool = False  # its gRPC API answers over libp2p (p2p/tunnel.py): routable behind NAT
    http: Endpoint = ""
    addrs: list[Annotated[str, StringConstraints(max_length=256, pattern=r"^/[\x21-\x7e]*$")]] = Field(
        default_factory=list, max_length=8
    )  # the node's libp2p listen and relayed (/p2p-circuit) multiaddrs: peers dial these
    load: float = Field(0.0, ge=0, le=1e6)  # requests waiting or running per batch slot
    chain_id: int = Field(0, ge=0, le=2**63)
    sent_at: float = Field(default_factory=time.time, ge=0)


M = TypeVar("M", bound=_Message)


def encode(message: _Message) -> bytes:
    data = message.model_dump_json().encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError("oversized", f"{len(data)} bytes, more than {MAX_MESSAGE_BYTES}")
    return data


def decode(kind: type[M], data: bytes) -> M:
    """Parse and validate one message; MessageError (never anything else) when it is not acceptable."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError("oversized", f"{len(data)} bytes, more than {MAX_MESSAGE_BYTES}")
    try:
        raw = untrusted_json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MessageError("malformed", f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise MessageError("malformed", f"a JSON {type(raw).__name__}, not an object")
    try:
        return kind.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or kind.__name__
        raise MessageError("invalid", f"{where}: {first['msg']}") from None


__all__ = [
    "CAPABILITIES_TOPIC",
    "LIBRARY_TOPIC",
    "MAX_MESSAGE_BYTES",
    "Announcement",
    "Capabilities",
    "MessageError",
    "decode",
    "encode",
]
