"""InferenceService: validate requests, admit them through a bounded queue, run the engine, translate.

Admission (admission.py) bounds what runs and what waits. A client deadline or cancel cancels the
handler, which frees the request's row in the batch at the next decode step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from zoo.inference.adapters import check_adapter_name
from zoo.inference.backend import BackendUnavailable, ResponseFormat
from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams, UsedExperience
from zoo.inference.structured import parse_response_format
from zoo.node.api.admission import Admission
from zoo.node.config import InferenceConfig
from zoo.node.credits.book import CreditBook
from zoo.node.credits.identity import CLIENT
from zoo.registry.errors import NotFound, ValidationError
from zoo.registry.experience import DOMAIN_RE
from zoo.v1 import inference_pb2, inference_pb2_grpc, node_pb2

ROOT_RE = re.compile(r"0x[0-9a-fA-F]{64}")
ROLES = {"system", "user", "assistant"}
MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 200_000
MAX_STOP = 8
MAX_STOP_CHARS = 64


def serving_stats(admission: Admission, backend: Callable[[], Any]) -> node_pb2.ServingStats:
    """The generation load now: admission's slots and queue, and the batcher's steps when there is one."""
    a = admission.stats()
    batcher = getattr(backend(), "batcher", None)
    b = batcher.stats if batcher is not None else None
    return node_pb2.ServingStats(
        running=a.running,
        max_batch_size=a.slots,
        waiting=a.waiting,
        max_queued=a.max_queued,
        last_batch_size=b.last_batch if b else 0,
        admitted=a.admitted,
        queued_then_admitted=a.queued_then_admitted,
        refused_queue_full=a.refused_full,
        refused_wait_timeout=a.refused_timeout,
        mean_wait_ms=a.mean_wait_ms,
        decode_steps=b.steps if b else 0,
        decoded_tokens=b.tokens if b else 0,
        credit_holders_admitted=a.priority_admitted,
        reserved_slots=admission.reserved,
    )


def _check(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ValidationError(field, message)


@dataclass(frozen=True)
class FieldNames:
    """What validation errors call each field: the gRPC message's paths, or the HTTP API's JSON keys."""

    messages: str = "messages"
    prompt: str = "messages[0].content"
    k: str = "k"
    max_tokens: str = "sampling.max_tokens"
    temperature: str = "sampling.temperature"
    top_p: str = "sampling.top_p"
    seed: str = "sampling.seed"
    stop: str = "sampling.stop"
    domain: str = "domain"
    library_root: str = "library_root"
    adapter: str = "adapter"


GRPC_FIELDS = FieldNames()


def validate_params(
    cfg: InferenceConfig,
    *,
    messages: Sequence[Mapping[str, str]] = (),
    prompt: str = "",
    domain: str = "",
    k: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    disable_experiences: bool = False,
    library_root: str = "",
    use_expert_factors: bool = False,
    response_format: ResponseFormat | None = None,
    adapter: str = "",
    names: FieldNames = GRPC_FIELDS,
) -> InferParams:
    """Check a generation request's fields against the node's limits and build the engine's parameters.

    The one set of rules for gRPC and the HTTP API; `names` says what the caller calls each field, so a
    ValidationError (INVALID_ARGUMENT / HTTP 400) names the field as the client sent it. None means "not
    sent": the configured default (k, max_tokens), greedy decoding (temperature), 1.0 (top_p).
    """
    n = names
    _check(bool(messages) != bool(prompt), n.messages, "send either messages or prompt (exactly one)")
    content_field = (lambda _i: n.prompt) if prompt else (lambda i: f"{n.messages}[{i}].content")
    if prompt:
        turns = [{"role": "user", "content": prompt}]
    else:
        _check(len(messages) <= MAX_MESSAGES, n.messages, f"at most {MAX_MESSAGES} messages")
        turns = []
        for i, m in enumerate(messages):
            role = m["role"]
            _check(role in ROLES, f"{n.messages}[{i}].role", f"must be one of {sorted(ROLES)} (got {role!r})")
            turns.append({"role": role, "content": m["content"]})
    _check(any(m["role"] == "user" for m in turns), n.messages, "need at least one user message")
    for i, m in enumerate(turns):
        _check(0 < len(m["content"]) <= MAX_CONTENT_CHARS, content_field(i),
               f"must have 1 to {MAX_CONTENT_CHARS} characters")  # fmt: skip
    k_used = cfg.default_k if k is None else k
    _check(k_used >= 0, n.k, f"must not be negative (got {k})")
    _check(k_used <= cfg.max_k, n.k, f"must be at most {cfg.max_k} (got {k})")
    tokens = cfg.default_max_tokens if max_tokens is None else max_tokens
    _check(tokens >= 1, n.max_tokens, f"must be at least 1 (got {max_tokens})")
    _check(tokens <= cfg.max_tokens_limit, n.max_tokens,
           f"must be at most {cfg.max_tokens_limit} (got {max_tokens})")  # fmt: skip
    temp = 0.0 if temperature is None else temperature
    _check(math.isfinite(temp) and 0 <= temp <= 2, n.temperature, f"must be in [0, 2] (got {temp})")
    p = 1.0 if top_p is None else top_p
    _check(math.isfinite(p) and 0 <= p <= 1, n.top_p, f"must be in (0, 1] (got {p})")
    _check(seed is None or 0 <= seed < 2**64, n.seed, f"must be in [0, 2^64) (got {seed})")
    _check(len(stop) <= MAX_STOP, n.stop, f"at most {MAX_STOP} stop strings")
    for i, st in enumerate(stop):
        _check(0 < len(st) <= MAX_STOP_CHARS, f"{n.stop}[{i}]", f"must have 1 to {MAX_STOP_CHARS} characters")
    _check(not domain or bool(DOMAIN_RE.fullmatch(domain)), n.domain,
           f"must be a dotted lower-case prefix like math.geometry (got {domain[:80]!r})")  # fmt: skip
    _check(not library_root or bool(ROOT_RE.fullmatch(library_root)), n.library_root,
           "must be 0x followed by 64 hex digits")  # fmt: skip
    if adapter:
        check_adapter_name(adapter, n.adapter)
    return InferParams(
        messages=turns,
        domain=domain,
        k=k_used,
        max_tokens=tokens,
        temperature=temp,
        top_p=p or 1.0,
        seed=seed,
        stop=list(stop),
        disable_experiences=disable_experiences,
        library_root=library_root.lower(),
        use_expert_factors=use_expert_factors,
        response_format=response_format,
        adapter=adapter,
    )


def params_from_request(req: Any, cfg: InferenceConfig) -> InferParams:
    """Validate an InferRequest into engine parameters (INVALID_ARGUMENT naming the field otherwise).

    proto3 cannot tell 0 from unset, so 0 means "the default" for k, max_tokens and top_p.
    """
    s = req.sampling
    return validate_params(
        cfg,
        messages=[{"role": m.role, "content": m.content} for m in req.messages],
        prompt=req.prompt,
        domain=req.domain,
        k=req.k or None,
        max_tokens=s.max_tokens or None,
        temperature=s.temperature,
        top_p=s.top_p or None,
        seed=s.seed if s.HasField("seed") else None,
        stop=list(s.stop),
        disable_experiences=req.disable_experiences,
        library_root=req.library_root,
        use_expert_factors=req.use_expert_factors,
        response_format=parse_response_format(req.response_format.type, req.response_format.json_schema),
        adapter=req.adapter,
    )


def outcome_to_proto(o: InferOutcome, queue_ms: float) -> inference_pb2.InferResponse:
    return inference_pb2.InferResponse(
        text=o.text,
        experiences=[
            inference_pb2.UsedExperience(
                id=e.id, score=e.score, cited=e.cited, text=e.text, kind=e.kind, answer=e.answer
            )
            for e in o.experiences
        ],
        library_root=o.library_root,
        library_version=o.library_version,
        model_id=o.model_id,
        usage=inference_pb2.Usage(
            prompt_tokens=o.prompt_tokens,
            completion_tokens=o.completion_tokens,
            queue_ms=queue_ms,
            retrieval_ms=o.retrieval_ms,
            generation_ms=o.generation_ms,
        ),
        sampling=inference_pb2.SamplingParams(
            max_tokens=o.max_tokens, temperature=o.temperature, top_p=o.top_p, seed=o.seed, stop=o.stop
        ),
        finish_reason=o.finish_reason,
        adapter=o.adapter,
    )


def params_to_request(params: InferParams, model: str) -> inference_pb2.InferRequest:
    """The InferRequest a peer needs to answer `params` with `model` (routing from the HTTP API)."""
    rf = params.response_format
    return inference_pb2.InferRequest(
        messages=[inference_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in params.messages],
        domain=params.domain,
        k=params.k,
        sampling=inference_pb2.SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=params.stop,
        ),
        disable_experiences=params.disable_experiences,
        library_root=params.library_root,
        use_expert_factors=params.use_expert_factors,
        response_format=inference_pb2.ResponseFormat(type=rf.type, json_schema=rf.schema)
        if rf is not None
        else None,
        model=model,
    )


def outcome_from_proto(r: inference_pb2.InferResponse) -> InferOutcome:
    """A peer's answer as the engine's outcome (inverse of outcome_to_proto)."""
    return InferOutcome(
        text=r.text,
        experiences=[
            UsedExperience(id=e.id, score=e.score, cited=e.cited, text=e.text, kind=e.kind, answer=e.answer)
            for e in r.experiences
        ],
        library_root=r.library_root,
        library_version=r.library_version,
        model_id=r.model_id,
        prompt_tokens=r.usage.prompt_tokens,
        completion_tokens=r.usage.completion_tokens,
        retrieval_ms=r.usage.retrieval_ms,
        generation_ms=r.usage.generation_ms,
        finish_reason=r.finish_reason,
        max_tokens=r.sampling.max_tokens,
        temperature=r.sampling.temperature,
        top_p=r.sampling.top_p,
        seed=r.sampling.seed,
        stop=list(r.sampling.stop),
        adapter=r.adapter,
    )


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        engine: Callable[[], InferenceEngine | None],
        cfg: InferenceConfig,
        admission: Admission,
        *,
        base_model: str = "",
        adapters: Callable[[], list[str]] = list,
        router: Any = None,
        peer_id: Callable[[], str] = str,
        credits: CreditBook | None = None,
    ) -> None:
        self._engine = engine
        self.credits = credits  # credit holders wait ahead of everyone (node.credits); None: no ledger
        self.cfg = cfg
        self.admission = admission
        self.base_model = base_model
        self.adapters = adapters
        self.router = router  # a p2p Router when routing is on
        self.peer_id = peer_id

    def engine(self) -> InferenceEngine:
        engine = self._engine()
        if engine is None:
            raise BackendUnavailable("the model is still loading; retry shortly (see health of 'model')")
        return engine

    def _placed(self, request: inference_pb2.InferRequest, context: Any) -> tuple[InferParams, bool]:
        """Validated parameters, and whether the request must go to a peer (its model is not served here).

        A `model` naming one of this node's adapters decodes with it (as the HTTP API's "model" does).
        """
        client = CLIENT.get()
        params = dataclasses.replace(
            params_from_request(request, self.cfg), client=client.address, spend=client.spend
        )
        model = request.model
        if not model or model == self.base_model:
            return params, False
        _check(len(model) <= 256 and model.isprintable(), "model", "must be a printable name of at most 256")
        if model in self.adapters():
            _check(request.adapter in ("", model), "model", f"names adapter {model!r}; adapter names another")
            return dataclasses.replace(params, adapter=model), False
        from zoo.node.p2p.routing import is_forwarded

        if is_forwarded(context.invocation_metadata()):
            # Stale capabilities at the forwarder; UNAVAILABLE lets it try another peer. Never forward twice.
            raise BackendUnavailable(f"model {model!r} is not served by this node (a routed request)")
        if self.router is None:
            raise NotFound(
                f"model {model!r} is not served by this node (it serves {self.base_model!r}"
                f"{' and its adapters' if self.adapters() else ''}) and p2p routing is off"
            )
        return params, True

    async def _priority(self, params: InferParams) -> bool:
        """Whether the request is a credit holder's (admitted first, decoded ahead); marks `params`."""
        params.priority = self.credits is not None and await self.credits.is_holder(
            params.client, params.spend
        )
        return params.priority

    async def _peer_refused(self, context: Any, e: Exception) -> None:
        await context.abort(e.code, str(e))  # type: ignore[attr-defined]

    async def Infer(self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext) -> Any:
        params, remote = self._placed(request, context)
        if remote:
            from zoo.node.p2p.routing import PeerRefused

            try:
                return await self.router.infer(request, context.time_remaining())
            except PeerRefused as e:
                await self._peer_refused(context, e)
        engine = self.engine()
        async with self.admission.slot(await self._priority(params)) as queue_ms:
            outcome = None
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    outcome = item
            assert outcome is not None
            response = outcome_to_proto(outcome, queue_ms)
            response.served_by = self.peer_id()
            return response

    async def InferStream(
        self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.InferChunk]:
        params, remote = self._placed(request, context)
        if remote:
            from zoo.node.p2p.routing import PeerRefused

            try:
                async for chunk in self.router.infer_stream(request, context.time_remaining()):
                    yield chunk
            except PeerRefused as e:
                await self._peer_refused(context, e)
            return
        engine = self.engine()
        async with self.admission.slot(await self._priority(params)) as queue_ms:
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    final = outcome_to_proto(item, queue_ms)
                    final.served_by = self.peer_id()
                    yield inference_pb2.InferChunk(final=final)
                else:
                    yield inference_pb2.InferChunk(delta=item.delta)

    async def Retrieve(
        self, request: inference_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        _check(
            0 < len(request.query) <= MAX_CONTENT_CHARS,
            "query",
            f"must have 1 to {MAX_CONTENT_CHARS} characters",
        )
        k = request.k or self.cfg.default_k
        _check(k <= self.cfg.max_k, "k", f"must be at most {self.cfg.max_k} (got {request.k})")
        _check(not request.domain or bool(DOMAIN_RE.fullmatch(request.domain)), "domain",
               "must be a dotted lower-case prefix like math.geometry")  # fmt: skip
        _check(-1 <= request.min_score <= 1, "min_score", "must be in [-1, 1]")
        _check(not request.library_root or bool(ROOT_RE.fullmatch(request.library_root)), "library_root",
               "must be 0x followed by 64 hex digits")  # fmt: skip
        engine = self.engine()
        hits, root, version = await asyncio.to_thread(
            engine.retrieve,
            request.query,
            k,
            request.domain,
            request.min_score or -1.0,
            request.library_root.lower(),
        )
        return inference_pb2.RetrieveResponse(
            experiences=[
                inference_pb2.UsedExperience(
                    id=h.experience.id,
                    score=h.score,
                    text=h.experience.text,
                    kind=h.experience.kind,
                    answer=h.experience.answer or "",
                )
                for h in hits
            ],
            library_root=root,
            library_version=version,
        )
