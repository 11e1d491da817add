"""Thin gRPC servicers: translate proto <-> domain objects; validation errors surface as domain errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor as _descriptor
from google.protobuf.timestamp_pb2 import Timestamp

from zoo.node import __version__
from zoo.node.components.library import LibraryComponent
from zoo.node.components.probes import ChainComponent, ModelComponent
from zoo.node.components.supervisor import Supervisor
from zoo.node.lifecycle import State
from zoo.v1 import inference_pb2, jobs_pb2, library_pb2, node_pb2, node_pb2_grpc

_STATE_TO_PROTO = {
    State.STARTING: node_pb2.COMPONENT_STATE_STARTING,
    State.SERVING: node_pb2.COMPONENT_STATE_SERVING,
    State.DEGRADED: node_pb2.COMPONENT_STATE_DEGRADED,
    State.FAILED: node_pb2.COMPONENT_STATE_FAILED,
    State.DISABLED: node_pb2.COMPONENT_STATE_DISABLED,
}


def _no_address() -> str:
    return ""


@dataclass(eq=False)
class NodeServicer(node_pb2_grpc.NodeServiceServicer):
    """The NodeService: the node's status (components, serving, library, credits, peers) and health.

    usage: the UsageMeter; node_address: the node's account; ledger_address and credit_epoch_s: the
    UsageLedger whose credits the node takes ("" and 0: none); serving: the generation load now;
    min_similarity: the relevance gate retrieval applies; role: "full", or "light" (it serves no model);
    model_sha256: the served weights' SHA-256 ("" when unknown: a remote backend, a light node)."""

    supervisor: Supervisor
    data_dir: str
    listen: Callable[[], str]
    model_id: str
    _: KW_ONLY
    usage: Any = None
    node_address: str = ""
    allows_anonymous: bool = True
    ledger_address: str = ""
    credit_epoch_s: int = 0
    serving: Callable[[], node_pb2.ServingStats] | None = None
    min_similarity: float = -1.0
    role: str = "full"  # "light": model.backend = 'none'
    model_sha256: str = ""
    started: float = field(default_factory=time.monotonic, init=False)
    # Known once the HTTP API has bound and p2p has started: set by the daemon then.
    http_address: Callable[[], str] = field(default_factory=lambda: _no_address, init=False)
    p2p: Any = field(default=None, init=False)

    async def GetStatus(self, request: node_pb2.GetStatusRequest, context: grpc.aio.ServicerContext) -> Any:
        comps = self.supervisor.components
        chain = comps.get("chain")
        library = comps.get("library")
        components = []
        for status in self.supervisor.statuses.values():
            ts = Timestamp()
            ts.FromNanoseconds(int(status.since * 1e9))
            components.append(
                node_pb2.Component(
                    name=status.name,
                    state=_STATE_TO_PROTO[status.state],
                    detail=status.detail,
                    last_change=ts,
                )
            )
        lib = node_pb2.LibraryInfo()
        if isinstance(library, LibraryComponent):
            lib = node_pb2.LibraryInfo(
                root=library.root,
                version=library.version,
                cid=library.cid,
                experience_count=library.experience_count,
            )
        model = comps.get("model")
        usage = await asyncio.to_thread(self.usage.experience_counts) if self.usage is not None else {}
        return node_pb2.NodeStatus(
            node_version=__version__,
            uptime_seconds=time.monotonic() - self.started,
            data_dir=self.data_dir,
            chain_id=chain.chain_id if isinstance(chain, ChainComponent) else 0,
            library=lib,
            model_id=self.model_id if isinstance(model, ModelComponent) else "",
            components=components,
            listen_address=self.listen(),
            experience_usage=usage,
            serving=self.serving() if self.serving is not None else None,
            http_address=self.http_address(),
            peers=self._peer_counts(),
            node_address=self.node_address,
            allows_anonymous=self.allows_anonymous,
            ledger_address=self.ledger_address,
            credit_epoch_seconds=self.credit_epoch_s,
            min_similarity=self.min_similarity,
            role=self.role,
            model_sha256=self.model_sha256 if isinstance(model, ModelComponent) else "",
        )

    def _peer_counts(self) -> node_pb2.PeerCounts:
        if self.p2p is None:
            return node_pb2.PeerCounts()
        peers = self.p2p.peers()
        return node_pb2.PeerCounts(
            peer_id=self.p2p.peer_id,
            connected=sum(p["connected"] for p in peers),
            known=len(peers),
            capable=sum(p["capabilities"] is not None and not p["banned"] for p in peers),
            banned=sum(p["banned"] for p in peers),
        )

    async def ListPeers(self, request: node_pb2.ListPeersRequest, context: grpc.aio.ServicerContext) -> Any:
        if self.p2p is None:
            return node_pb2.ListPeersResponse()
        host = self.p2p.host
        return node_pb2.ListPeersResponse(
            peer_id=self.p2p.peer_id,
            listen_addrs=host.addrs if host is not None else [],
            peers=[_peer(p) for p in self.p2p.peers()],
        )


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _peer(p: dict[str, Any]) -> node_pb2.Peer:
    caps = p["capabilities"]
    capabilities = None
    if caps is not None:
        capabilities = node_pb2.PeerCapabilities(
            models=caps["models"],
            backend=caps["backend"],
            gpu=caps["gpu"],
            library_version=caps["library_version"],
            library_root=caps["library_root"],
            job_types=caps["job_types"],
            grpc_address=caps["grpc"],
            http_address=caps["http"],
            load=caps["load"],
            sent_at=_timestamp(caps["sent_at"]),
            model_sha256=caps.get("model_sha256", ""),
        )
    return node_pb2.Peer(
        peer_id=p["peer_id"],
        connected=p["connected"],
        addrs=p["addrs"],
        last_seen=_timestamp(p["last_seen"]),
        score=p["score"],
        banned=p["banned"],
        capabilities=capabilities,
    )


# Services defined in proto/ whose implementation arrives with later work; they answer UNIMPLEMENTED.
PLANNED = {
    "zoo.v1.InferenceService": (inference_pb2, "retrieval-augmented inference"),
    "zoo.v1.LibraryService": (library_pb2, "library queries and Merkle proofs"),
    "zoo.v1.JobService": (jobs_pb2, "learning jobs: TF-GRPO and GSPO"),
}


def unimplemented_handler(full_name: str, module: Any, what: str) -> grpc.GenericRpcHandler:
    """Handlers for every RPC of a service that answer UNIMPLEMENTED with a message, never crash."""
    service: _descriptor.ServiceDescriptor = module.DESCRIPTOR.services_by_name[full_name.rsplit(".", 1)[1]]
    handlers = {}
    for method in service.methods:
        message = f"{full_name}/{method.name} is not implemented by zoo-node {__version__} yet ({what})"
        req_cls = _message_class(method.input_type)
        resp_cls = _message_class(method.output_type)

        async def abort(request: Any, context: grpc.aio.ServicerContext, _m: str = message) -> Any:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, _m)

        factory = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = factory(
            abort, request_deserializer=req_cls.FromString, response_serializer=resp_cls.SerializeToString
        )
    return grpc.method_handlers_generic_handler(full_name, handlers)


def _message_class(desc: _descriptor.Descriptor) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)
