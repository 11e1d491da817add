"""Routing (HLLM §5.4): answer a request for a model this node does not serve through a peer that does.

Candidates are peers with live capabilities naming the model, not banned, least loaded first (then best
score). A request pinned to a library root goes only to peers whose current root is that root, and a peer's
answer built on any other root is refused. The request is forwarded over the peer's public gRPC API with a
deadline (over libp2p, p2p/tunnel.py, to a peer behind NAT with no public gRPC address); a transport failure
(UNAVAILABLE, DEADLINE_EXCEEDED) tries the next peer, up to MAX_ATTEMPTS peers in all, and any other status is
the peer's verdict on the request and is passed back as it is. A peer that failed in transport is asked after
every other candidate until it advertises its capabilities again (a killed node's capabilities outlive it by
up to their TTL; a restarted one re-advertises at once). A forwarded request carries the metadata
`zoo-forwarded`, and a node never forwards such a request again: no loops.

A request that asks for a proof of inference gets one from the peer or is not answered by it: the proof must
name the weights the peer advertises, and where they are this node's own, pass this node's check (one
prefill). A peer whose answer fails either is penalised as `wrong_model` (a ban at the second, as for
tampered content) and the next peer is asked; a stream that already sent text ends with DATA_LOSS.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from zoo.inference.backend_protocol import BackendUnavailable
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.answer_proof import AnswerProof, Verdict
from zoo.inference.provenance.toploc import ProofError
from zoo.node.logs import get_logger
from zoo.node.p2p.messages import Capabilities
from zoo.node.p2p.peers import PeerBook
from zoo.registry.errors import IntegrityError, ZooError
from zoo.v1 import inference_pb2, inference_pb2_grpc

log = get_logger(__name__)

FORWARDED = "zoo-forwarded"
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
MAX_ATTEMPTS = 3  # the least-loaded peer, then two others
MAX_CHANNELS = 32  # open gRPC channels to peers, least recently used closed first


class NoCapablePeer(BackendUnavailable):
    """No peer that advertises the model (and the pinned root) could answer: UNAVAILABLE."""


class _Refused(Exception):
    """A peer's answer this node refuses: from another library root than the pinned one, or without a proof
    that holds (the peer is penalised; try the next).

    Not a ZooError: a private signal of the router, which asks the next peer; it never leaves this module."""


class _Unreachable(Exception):
    """No way to the peer could be opened (the router asks the next peer, as after UNAVAILABLE).

    Not a ZooError: a private signal of the router, like _Refused; it never leaves this module."""


class PeerRefused(Exception):
    """The peer answered with a non-retryable status; the servicer passes its code and message on.

    Not a ZooError: it carries the peer's own status, which the servicers and the HTTP routes pass on as
    received, so no one row of node/api/status_codes.py's table fits it."""

    def __init__(self, peer_id: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"peer {peer_id} answered {code.name}: {details}")
        self.peer_id, self.code, self.details = peer_id, code, details


ProofCheck = Callable[[AnswerProof], Awaitable[Verdict | None]]  # None: this node cannot check it


def engine_check(engine: Callable[[], Any]) -> ProofCheck:
    """This node's check of a peer's proof with its engine (`engine()`: None while the model loads): None
    where it cannot check it (still loading; another llama.cpp build, too long a proof), so a peer on
    other hardware is not taken for a liar."""
    from zoo.inference.engine import Unsupported, WrongModel
    from zoo.registry.errors import ValidationError

    async def check(proof: AnswerProof) -> Verdict | None:
        loaded = engine()
        if loaded is None:
            return None
        try:
            return await loaded.verify(proof)
        except (Unsupported, WrongModel, ValidationError):
            return None

    return check


class Router:
    def __init__(
        self,
        book: PeerBook,
        timeout_s: float = 60.0,
        tunnel: Callable[[str, list[str]], str] | None = None,
        *,
        check_proof: ProofCheck | None = None,
        model_sha256: str = "",
    ) -> None:
        """check_proof: this node's own check of a proof (InferenceEngine.verify), for proofs of the weights
        it serves (`model_sha256`); None on a node without weights."""
        self.book = book
        self.check_proof = check_proof
        self.model_sha256 = model_sha256
        self.timeout_s = timeout_s
        self.tunnel = tunnel  # (peer id, its addrs) -> loopback address reaching its gRPC over libp2p
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._failed: OrderedDict[str, float] = OrderedDict()  # peer -> when it last failed in transport

    def candidates(self, model: str, library_root: str = "") -> list[tuple[str, Capabilities]]:
        """Peers that advertise `model` (by name, or "sha256:<hex>": by the hash of the weights they claim),
        and `library_root` when given; least loaded first, those that failed since they last advertised
        last."""
        by_hash = model.removeprefix("sha256:") if model.startswith("sha256:") else ""
        found = [
            (record, caps)
            for record, caps in self.book.capable()
            if (model in caps.models or (by_hash and caps.model_sha256 == by_hash))
            and (caps.grpc or (caps.grpc_over_p2p and self.tunnel is not None))
            and (not library_root or caps.library_root == library_root)
        ]
        failed = lambda record: self._failed.get(record.peer_id, 0.0) >= record.capabilities_at  # noqa: E731
        found.sort(key=lambda rc: (failed(rc[0]), rc[1].load, -rc[0].score))
        return [(record.peer_id, caps) for record, caps in found]

    def _transport_failed(self, peer_id: str) -> None:
        self._failed[peer_id] = time.time()
        self._failed.move_to_end(peer_id)
        while len(self._failed) > MAX_CHANNELS:
            self._failed.popitem(last=False)

    async def _stub_for(self, peer_id: str, caps: Capabilities) -> inference_pb2_grpc.InferenceServiceStub:
        """A stub on the peer's public gRPC address, or on a tunnel to it over libp2p."""
        if caps.grpc:
            return self._stub(caps.grpc)
        assert self.tunnel is not None
        try:
            return self._stub(await asyncio.to_thread(self.tunnel, peer_id, caps.addrs))
        except ZooError as e:  # the host stopped: as unreachable as a refused TCP connection
            raise _Unreachable(str(e)) from None

    def _stub(self, address: str) -> inference_pb2_grpc.InferenceServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
            while len(self._channels) > MAX_CHANNELS:
                _, old = self._channels.popitem(last=False)
                task = asyncio.get_running_loop().create_task(old.close(grace=5))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        self._channels.move_to_end(address)
        return inference_pb2_grpc.InferenceServiceStub(channel)

    def _timeout(self, remaining: float | None) -> float:
        """The router's deadline, or the client's own when that is sooner."""
        return self.timeout_s if remaining is None else max(0.001, min(self.timeout_s, remaining))

    def _targets(self, request: inference_pb2.InferRequest) -> list[tuple[str, Capabilities]]:
        targets = self.candidates(request.model, request.library_root.lower())
        if not targets:
            pinned = f" with library root {request.library_root}" if request.library_root else ""
            raise NoCapablePeer(
                f"model {request.model!r} is not served by this node, and no peer that advertises it"
                f"{pinned} is known (see zoo-node peers)"
            )
        return targets[:MAX_ATTEMPTS]

    async def _checked(
        self, peer_id: str, caps: Capabilities, request: Any, response: inference_pb2.InferResponse
    ) -> Any:
        """The peer's answer with served_by set; _Refused when it ignored the pinned root or its proof fails
        (the peer is penalised)."""
        if request.library_root and response.library_root.lower() != request.library_root.lower():
            self.book.penalise(peer_id, "wrong_root")
            raise _Refused(
                f"{peer_id}: answered from library root {response.library_root}, not the pinned one"
            )
        if request.proof:
            problem = await self._proof_problem(caps, response.proof)
            if problem is not None:
                self.book.penalise(peer_id, "wrong_model")
                log.warning("a peer's answer failed its proof", peer=peer_id, problem=problem)
                raise _Refused(f"{peer_id}: {problem}")
        response.served_by = peer_id
        return response

    async def _proof_problem(self, caps: Capabilities, text: str) -> str | None:
        """Why a peer's proof does not hold (None: it holds, or names weights this node cannot check)."""
        if not text:
            return "sent no proof of its answer, though one was asked for"
        try:
            proof = answer_proof.parse(text)
        except ProofError as e:
            return f"sent a proof that does not parse: {e}"
        if caps.model_sha256 and proof.model != "0x" + caps.model_sha256:
            return f"advertises the weights {caps.model_sha256}; its answer's proof names {proof.model}"
        if self.check_proof is None or proof.model != "0x" + self.model_sha256:
            return None  # other weights than this node's: the client checks it (zoo-node verify-answer)
        verdict = await self.check_proof(proof)
        if verdict is None or verdict.accepted:
            return None
        return f"its answer's proof was rejected: {verdict.reason}"

    async def infer(
        self, request: inference_pb2.InferRequest, remaining: float | None = None
    ) -> inference_pb2.InferResponse:
        problems = []
        for peer_id, caps in self._targets(request):
            try:
                stub = await self._stub_for(peer_id, caps)
                response = await stub.Infer(
                    request, timeout=self._timeout(remaining), metadata=((FORWARDED, "1"),)
                )
                return await self._checked(peer_id, caps, request, response)
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRYABLE:
                    raise PeerRefused(peer_id, e.code(), e.details() or "") from None
                problems.append(f"{peer_id}: {e.code().name}")
                self._transport_failed(peer_id)
                log.info("routed request failed; trying another peer", peer=peer_id, code=e.code().name)
            except _Unreachable as e:
                problems.append(f"{peer_id}: {e}")
                self._transport_failed(peer_id)
            except _Refused as e:
                problems.append(str(e))
        raise NoCapablePeer(f"no peer serving model {request.model!r} answered: " + "; ".join(problems))

    async def infer_stream(
        self, request: inference_pb2.InferRequest, remaining: float | None = None
    ) -> AsyncIterator[Any]:
        """The peer's chunks; another peer is tried only when the first fails before any chunk."""
        problems = []
        for peer_id, caps in self._targets(request):
            try:
                stub = await self._stub_for(peer_id, caps)
            except _Unreachable as e:
                problems.append(f"{peer_id}: {e}")
                self._transport_failed(peer_id)
                continue
            call = stub.InferStream(request, timeout=self._timeout(remaining), metadata=((FORWARDED, "1"),))
            started = False
            try:
                async for chunk in call:
                    if chunk.HasField("final"):
                        await self._checked(peer_id, caps, request, chunk.final)
                    started = True
                    yield chunk
                return
            except grpc.aio.AioRpcError as e:
                if started or e.code() not in RETRYABLE:
                    raise PeerRefused(peer_id, e.code(), e.details() or "") from None
                problems.append(f"{peer_id}: {e.code().name}")
                self._transport_failed(peer_id)
            except _Refused as e:
                if started:
                    raise IntegrityError(str(e)) from None
                problems.append(str(e))
            finally:
                call.cancel()  # a client that went away, or an error here, ends the peer's work too
        raise NoCapablePeer(f"no peer serving model {request.model!r} answered: " + "; ".join(problems))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def is_forwarded(metadata: Any) -> bool:
    return any(key == FORWARDED for key, _ in metadata or ())


LocalModels = Callable[[], set[str]]
