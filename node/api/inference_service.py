"""InferenceService: validate requests, place them (serving.py: the rules the HTTP API shares), admit them
through a bounded queue, run the engine, translate.

Admission (admission.py) bounds what runs and what waits. A client deadline or cancel cancels the
handler, which frees the request's row in the batch at the next decode step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from zoo.inference.engine import InferOutcome, InferParams, Unsupported
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.documents import sha256_hex
from zoo.inference.structured import parse_response_format
from zoo.inference.tools import Tool, render_turns
from zoo.node.api.admission import Admission
from zoo.node.api.serving import (
    MAX_CONTENT_CHARS,
    ROOT_RE,
    ServingRules,
    check_field,
    check_tool_history,
    proof_text,
    receipt_to_proto,
    sampling_to_proto,
    tool_spec_of,
    validate_params,
)
from zoo.node.config import InferenceConfig
from zoo.node.credits.identity import CLIENT
from zoo.node.provenance.receipts import REQUEST_SHA256
from zoo.registry import untrusted_json
from zoo.registry.errors import ValidationError
from zoo.registry.experience import DOMAIN_RE
from zoo.v1 import inference_pb2, inference_pb2_grpc, node_pb2


def serving_stats(admission: Admission, backend: Callable[[], Any]) -> node_pb2.ServingStats:
    """The generation load now: admission's slots and queue, and the local scheduler's steps when there is
    one (not for a remote backend)."""
    a = admission.stats()
    scheduler = getattr(backend(), "scheduler", None)
    b = scheduler.stats if scheduler is not None else None
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


def params_from_request(req: Any, cfg: InferenceConfig) -> InferParams:
    """Validate an InferRequest into engine parameters (INVALID_ARGUMENT naming the field otherwise).

    proto3 cannot tell 0 from unset, so 0 means "the default" for k, max_tokens and top_p.
    """
    s = req.sampling
    turns = [
        {
            "role": m.role,
            "content": m.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls],
            "tool_call_id": m.tool_call_id,
        }
        for m in req.messages
    ]
    check_tool_history(turns)
    tools = tool_spec_of(
        [_tool(t, i) for i, t in enumerate(req.tools)],
        req.tool_choice or None,
        req.parallel_tool_calls if req.HasField("parallel_tool_calls") else None,
        path="tools[{i}].{key}",
    )
    prompt = req.prompt
    if not turns and prompt and tools is not None and tools.calls:  # the prompt is the user's turn
        turns, prompt = [{"role": "user", "content": prompt}], ""
    params = validate_params(
        cfg,
        messages=render_turns(turns, tools) if turns else [],
        prompt=prompt,
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
    params = dataclasses.replace(
        params, receipt=req.receipt, proof=req.proof, request_sha256=_request_sha256(req)
    )
    if turns:  # the engine renders calls and results (by the model's template where it knows tools)
        params = dataclasses.replace(params, messages=turns)
    if tools is not None and tools.calls:
        check_field(
            params.response_format is None,
            "response_format",
            "cannot be combined with tools the model may call",
        )
        params = dataclasses.replace(params, tools=tools)
    return params


def _tool(t: Any, i: int) -> Tool:
    try:
        parameters = untrusted_json.loads(t.parameters or '{"type": "object", "properties": {}}')
    except json.JSONDecodeError as e:
        raise ValidationError(f"tools[{i}].parameters", f"is not valid JSON: {e}") from None
    check_field(isinstance(parameters, dict), f"tools[{i}].parameters", "must be a JSON Schema object")
    return Tool(t.name, t.description, parameters)


def outcome_to_proto(o: InferOutcome, queue_ms: float) -> inference_pb2.InferResponse:
    calls = o.choices[0].tool_calls if o.choices else []
    return inference_pb2.InferResponse(
        text=(o.choices[0].content or "") if calls else o.text,
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
        sampling=sampling_to_proto(o),
        finish_reason=o.finish_reason,
        adapter=o.adapter,
        tool_calls=[inference_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls],
        receipt=receipt_to_proto(o.receipt) if o.receipt is not None else None,
        proof=proof_text(o.proof) if o.proof is not None else "",
    )


def _request_sha256(request: inference_pb2.InferRequest) -> str:
    """The request's bytes as received (kept by the interceptor), else as this node serialises it."""
    return REQUEST_SHA256.get() or sha256_hex(request.SerializeToString())


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        rules: ServingRules,
        cfg: InferenceConfig,
        admission: Admission,
        *,
        peer_id: Callable[[], str] = str,
    ) -> None:
        self.rules = rules  # placement, readiness and priority, as the HTTP API applies them (serving.py)
        self.cfg = cfg
        self.admission = admission
        self.peer_id = peer_id

    async def VerifyAnswer(
        self, request: inference_pb2.VerifyAnswerRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        proof = answer_proof.parse(request.proof)  # ProofError: INVALID_ARGUMENT, saying why
        if not self.rules.base_model:
            raise Unsupported(f"a light node serves no model: a node serving {proof.model} checks this proof")
        engine = self.rules.engine()
        t0 = time.perf_counter()
        async with self.admission.slot(False):  # a prefill: it takes a slot as an answer does
            verdict = await engine.verify(proof)
        tokens = verdict.tokens
        return inference_pb2.VerifyAnswerResponse(
            accepted=verdict.accepted,
            reason=verdict.reason,
            chunks=[
                inference_pb2.ChunkCheck(
                    exponent_matches=c.exponent_matches,
                    mantissa_mean=c.mantissa_mean,
                    mantissa_median=c.mantissa_median,
                    accepted=c.accepted(engine.backend.proof_thresholds),  # type: ignore[attr-defined]
                )
                for c in verdict.chunks
            ],
            worst_token_index=max(tokens.index, 0) if tokens else 0,
            worst_token_id=tokens.token if tokens else 0,
            worst_token_shortfall=tokens.shortfall if tokens else 0.0,
            worst_token_limit=tokens.limit if tokens else 0.0,
            model_sha256=engine.model_sha256,
            verify_ms=(time.perf_counter() - t0) * 1000,
        )

    def _placed(self, request: inference_pb2.InferRequest, context: Any) -> tuple[InferParams, bool]:
        """Validated parameters, and whether the request goes to a peer (serving.py's placement rule).

        A `model` naming one of this node's adapters decodes with it (as the HTTP API's "model" does).
        """
        from zoo.node.p2p.routing import is_forwarded

        client = CLIENT.get()
        params = dataclasses.replace(
            params_from_request(request, self.cfg), client=client.address, spend=client.spend
        )
        placement = self.rules.place(request.model, forwarded=is_forwarded(context.invocation_metadata()))
        if placement.adapter:
            check_field(
                request.adapter in ("", placement.adapter),
                "model",
                f"names adapter {placement.adapter!r}; adapter names another",
            )
            return dataclasses.replace(params, adapter=placement.adapter), False
        return params, bool(placement.remote)

    async def _peer_refused(self, context: Any, e: Exception) -> None:
        await context.abort(e.code, str(e))  # type: ignore[attr-defined]

    async def Infer(self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext) -> Any:
        params, remote = self._placed(request, context)
        if remote:
            from zoo.node.p2p.routing import PeerRefused

            try:
                return await self.rules.router.infer(request, context.time_remaining())
            except PeerRefused as e:
                await self._peer_refused(context, e)
        engine = self.rules.engine()
        async with self.admission.slot(await self.rules.prioritise(params)) as queue_ms:
            outcome = None
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    outcome = item
            assert outcome is not None
            self.rules.attest(outcome, params)
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
                async for chunk in self.rules.router.infer_stream(request, context.time_remaining()):
                    yield chunk
            except PeerRefused as e:
                await self._peer_refused(context, e)
            return
        engine = self.rules.engine()
        async with self.admission.slot(await self.rules.prioritise(params)) as queue_ms:
            async for item in engine.stream(params):
                if isinstance(item, InferOutcome):
                    self.rules.attest(item, params)
                    final = outcome_to_proto(item, queue_ms)
                    final.served_by = self.peer_id()
                    yield inference_pb2.InferChunk(final=final)
                else:
                    yield inference_pb2.InferChunk(delta=item.delta)

    async def Retrieve(
        self, request: inference_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        check_field(
            0 < len(request.query) <= MAX_CONTENT_CHARS,
            "query",
            f"must have 1 to {MAX_CONTENT_CHARS} characters",
        )
        k = request.k or self.cfg.default_k
        check_field(k <= self.cfg.max_k, "k", f"must be at most {self.cfg.max_k} (got {request.k})")
        check_field(not request.domain or bool(DOMAIN_RE.fullmatch(request.domain)), "domain",
               "must be a dotted lower-case prefix like math.geometry")  # fmt: skip
        check_field(-1 <= request.min_score <= 1, "min_score", "must be in [-1, 1]")
        check_field(not request.library_root or bool(ROOT_RE.fullmatch(request.library_root)), "library_root",
               "must be 0x followed by 64 hex digits")  # fmt: skip
        engine = self.rules.engine()
        hits, root, version = await asyncio.to_thread(
            engine.retrieve,
            request.query,
            k,
            request.domain,
            request.min_score or self.cfg.min_similarity,  # unset: the relevance gate Infer uses
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
