"""InferenceService: validate requests, admit them through a bounded queue, run the engine, translate.

Admission: at most `concurrency` requests generate at once and at most `max_queue` wait; a request
beyond that gets RESOURCE_EXHAUSTED at once, so memory never grows with load. A client deadline or
cancel cancels the handler, which stops generation at the next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from zoo.inference.backend import BackendUnavailable
from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams
from zoo.node.config import InferenceConfig
from zoo.node.errors import Overloaded
from zoo.registry.errors import ValidationError
from zoo.registry.experience import DOMAIN_RE
from zoo.v1 import inference_pb2, inference_pb2_grpc

ROOT_RE = re.compile(r"0x[0-9a-fA-F]{64}")
ROLES = {"system", "user", "assistant"}
MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 200_000
MAX_STOP = 8
MAX_STOP_CHARS = 64


class Admission:
    """Bounded concurrency plus a bounded wait queue."""

    def __init__(self, concurrency: int, max_queue: int) -> None:
        self.concurrency = concurrency
        self.max_queue = max_queue
        self._slots = asyncio.Semaphore(concurrency)
        self.inflight = 0  # running + waiting

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        if self.inflight >= self.concurrency + self.max_queue:
            raise Overloaded(
                f"inference queue is full ({self.concurrency} running, {self.max_queue} waiting); retry later"
            )
        self.inflight += 1
        start = time.perf_counter()
        try:
            async with self._slots:
                yield (time.perf_counter() - start) * 1000
        finally:
            self.inflight -= 1


def _check(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ValidationError(field, message)


def params_from_request(req: Any, cfg: InferenceConfig) -> InferParams:
    """Validate an InferRequest into engine parameters (INVALID_ARGUMENT naming the field otherwise)."""
    _check(bool(req.messages) != bool(req.prompt), "messages", "send either messages or prompt (exactly one)")
    if req.prompt:
        messages = [{"role": "user", "content": req.prompt}]
    else:
        _check(len(req.messages) <= MAX_MESSAGES, "messages", f"at most {MAX_MESSAGES} messages")
        messages = []
        for i, m in enumerate(req.messages):
            _check(m.role in ROLES, f"messages[{i}].role", f"must be one of {sorted(ROLES)} (got {m.role!r})")
            messages.append({"role": m.role, "content": m.content})
    _check(any(m["role"] == "user" for m in messages), "messages", "need at least one user message")
    for i, m in enumerate(messages):
        _check(0 < len(m["content"]) <= MAX_CONTENT_CHARS, f"messages[{i}].content",
               f"must have 1 to {MAX_CONTENT_CHARS} characters")  # fmt: skip
    k = req.k or cfg.default_k
    _check(k <= cfg.max_k, "k", f"must be at most {cfg.max_k} (got {req.k})")
    s = req.sampling
    max_tokens = s.max_tokens or cfg.default_max_tokens
    _check(max_tokens <= cfg.max_tokens_limit, "sampling.max_tokens",
           f"must be at most {cfg.max_tokens_limit} (got {s.max_tokens})")  # fmt: skip
    _check(math.isfinite(s.temperature) and 0 <= s.temperature <= 2, "sampling.temperature",
           f"must be in [0, 2] (got {s.temperature})")  # fmt: skip
    _check(
        math.isfinite(s.top_p) and 0 <= s.top_p <= 1, "sampling.top_p", f"must be in (0, 1] (got {s.top_p})"
    )
    _check(len(s.stop) <= MAX_STOP, "sampling.stop", f"at most {MAX_STOP} stop strings")
    for i, st in enumerate(s.stop):
        _check(
            0 < len(st) <= MAX_STOP_CHARS,
            f"sampling.stop[{i}]",
            f"must have 1 to {MAX_STOP_CHARS} characters",
        )
    _check(not req.domain or bool(DOMAIN_RE.fullmatch(req.domain)), "domain",
           f"must be a dotted lower-case prefix like math.geometry (got {req.domain[:80]!r})")  # fmt: skip
    _check(not req.library_root or bool(ROOT_RE.fullmatch(req.library_root)), "library_root",
           "must be 0x followed by 64 hex digits")  # fmt: skip
    return InferParams(
        messages=messages,
        domain=req.domain,
        k=k,
        max_tokens=max_tokens,
        temperature=s.temperature,
        top_p=s.top_p or 1.0,
        seed=s.seed if s.HasField("seed") else None,
        stop=list(s.stop),
        disable_experiences=req.disable_experiences,
        library_root=req.library_root.lower(),
        use_expert_factors=req.use_expert_factors,
    )


def outcome_to_proto(o: InferOutcome, queue_ms: float) -> inference_pb2.InferResponse:
    return inference_pb2.InferResponse(
        text=o.text,
        experiences=[
            inference_pb2.UsedExperience(id=e.id, score=e.score, cited=e.cited, text=e.text)
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
    )


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, engine: Callable[[], InferenceEngine | None], cfg: InferenceConfig) -> None:
        self._engine = engine
        self.cfg = cfg
        self.admission = Admission(cfg.concurrency, cfg.max_queue)

    def engine(self) -> InferenceEngine:
        engine = self._engine()
        if engine is None:
            raise BackendUnavailable("the model is still loading; retry shortly (see health of 'model')")
        return engine

    async def Infer(self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext) -> Any:
        params = params_from_request(request, self.cfg)
        engine = self.engine()
        async with self.admission.slot() as queue_ms:
            outcome = None
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    outcome = item
            assert outcome is not None
            return outcome_to_proto(outcome, queue_ms)

    async def InferStream(
        self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.InferChunk]:
        params = params_from_request(request, self.cfg)
        engine = self.engine()
        async with self.admission.slot() as queue_ms:
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    yield inference_pb2.InferChunk(final=outcome_to_proto(item, queue_ms))
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
                inference_pb2.UsedExperience(id=h.experience.id, score=h.score, text=h.experience.text)
                for h in hits
            ],
            library_root=root,
            library_version=version,
        )
