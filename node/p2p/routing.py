"""Routing (HLLM §5.4): answer a request for a model this node does not serve through a peer that does.

Candidates are peers with live capabilities naming the model, not banned, least loaded first (then best
score). A request pinned to a library root goes only to peers whose current root is that root, and a
peer's answer built on any other root is refused. The request is forwarded over the peer's public gRPC
API with a deadline; a transport failure (UNAVAILABLE, DEADLINE_EXCEEDED) tries one other peer, any
other status is the peer's verdict on the request and is passed back as it is. A forwarded request
carries the metadata `zoo-forwarded`, and a node never forwards such a request again: no loops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from zoo.inference.backend import BackendUnavailable
from zoo.node.logs import get_logger
from zoo.node.p2p.messages import Capabilities
from zoo.node.p2p.peers import PeerBook
from zoo.registry.errors import IntegrityError
from zoo.v1 import inference_pb2, inference_pb2_grpc

log = get_logger(__name__)

FORWARDED = "zoo-forwarded"
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
MAX_ATTEMPTS = 2  # the least-loaded peer, then one other


class NoCapablePeer(BackendUnavailable):
    """No peer that advertises the model (and the pinned root) could answer: UNAVAILABLE."""


class PeerRefused(Exception):
    """The peer answered with a non-retryable status; the servicer passes its code and message on."""

    def __init__(self, peer_id: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"peer {peer_id} answered {code.name}: {details}")
        self.peer_id, self.code, self.details = peer_id, code, details


class Router:
    def __init__(self, book: PeerBook, timeout_s: float = 60.0) -> None:
        self.book = book
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def candidates(self, model: str, library_root: str = "") -> list[tuple[str, Capabilities]]:
        found = [
            (record.peer_id, caps)
            for record, caps in self.book.capable()
            if model in caps.models and caps.grpc and (not library_root or caps.library_root == library_root)
        ]
        return sorted(found, key=lambda pc: (pc[1].load, -self.book.score(pc[0])))

    def _stub(self, address: str) -> inference_pb2_grpc.InferenceServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        return inference_pb2_grpc.InferenceServiceStub(channel)

    def _targets(self, request: inference_pb2.InferRequest) -> list[tuple[str, Capabilities]]:
        targets = self.candidates(request.model, request.library_root.lower())
        if not targets:
            pinned = f" with library root {request.library_root}" if request.library_root else ""
            raise NoCapablePeer(
                f"model {request.model!r} is not served by this node, and no peer that advertises it"
                f"{pinned} is known (see zoo-node peers)"
            )
        return targets[:MAX_ATTEMPTS]

    def _checked(self, peer_id: str, request: Any, response: inference_pb2.InferResponse) -> Any:
        if request.library_root and response.library_root.lower() != request.library_root.lower():
            raise IntegrityError(
                f"peer {peer_id} answered with library root {response.library_root}, not the pinned "
                f"{request.library_root}"
            )
        response.served_by = peer_id
        return response

    async def infer(self, request: inference_pb2.InferRequest) -> inference_pb2.InferResponse:
        problems = []
        for peer_id, caps in self._targets(request):
            try:
                response = await self._stub(caps.grpc).Infer(
                    request, timeout=self.timeout_s, metadata=((FORWARDED, "1"),)
                )
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRYABLE:
                    raise PeerRefused(peer_id, e.code(), e.details() or "") from None
                problems.append(f"{peer_id}: {e.code().name}")
                log.info("routed request failed; trying another peer", peer=peer_id, code=e.code().name)
                continue
            return self._checked(peer_id, request, response)
        raise NoCapablePeer(f"no peer serving model {request.model!r} answered: " + "; ".join(problems))

    async def infer_stream(self, request: inference_pb2.InferRequest) -> AsyncIterator[Any]:
        """The peer's chunks; another peer is tried only when the first fails before any chunk."""
        problems = []
        for peer_id, caps in self._targets(request):
            call = self._stub(caps.grpc).InferStream(
                request, timeout=self.timeout_s, metadata=((FORWARDED, "1"),)
            )
            started = False
            try:
                async for chunk in call:
                    started = True
                    if chunk.HasField("final"):
                        self._checked(peer_id, request, chunk.final)
                    yield chunk
                return
            except grpc.aio.AioRpcError as e:
                if started or e.code() not in RETRYABLE:
                    raise PeerRefused(peer_id, e.code(), e.details() or "") from None
                problems.append(f"{peer_id}: {e.code().name}")
        raise NoCapablePeer(f"no peer serving model {request.model!r} answered: " + "; ".join(problems))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def is_forwarded(metadata: Any) -> bool:
    return any(key == FORWARDED for key, _ in metadata or ())


LocalModels = Callable[[], set[str]]
