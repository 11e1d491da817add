"""The serving rules both front doors (gRPC, node/api/inference_service.py; HTTP, node/api/http/routes.py)
apply, in one place so they cannot drift: request validation (validate_params, naming fields as each door's
client sent them), placement (here, with an adapter, or at a peer), readiness and credit priority.

Placement is one rule. A request names the base model (by its id, by "sha256:" and its weights' hash, or
none): here. One of this node's adapters: here,
decoding with it. Any other model: at a peer that advertises it (p2p routing on; the router then picks one
that serves the pinned library root, or answers UNAVAILABLE saying so); a request a peer forwarded is never
forwarded again (UNAVAILABLE, so the forwarder tries another peer); and a model no peer advertises is not
found (gRPC NOT_FOUND, HTTP 404 model_not_found), naming what this node serves.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from zoo.inference.adapters import check_adapter_name
from zoo.inference.backend_protocol import BackendError, BackendUnavailable, ResponseFormat
from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams, Unsupported, UsedExperience
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.answer_proof import AnswerProof
from zoo.inference.provenance.toploc import ProofError
from zoo.inference.tools import Tool, ToolSpec, check_tools
from zoo.node.config import InferenceConfig
from zoo.node.credits.book import CreditBook
from zoo.registry import untrusted_json
from zoo.registry.errors import NotFound, ValidationError
from zoo.registry.experience import DOMAIN_RE
from zoo.v1 import inference_pb2

ROOT_RE = re.compile(r"0x[0-9a-fA-F]{64}")
ROLES = {"system", "user", "assistant"}
MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 200_000
MAX_STOP = 8
MAX_STOP_CHARS = 64


def check_field(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ValidationError(field, message)


def check_tool_history(messages: Sequence[Mapping[str, Any]], field: str = "messages") -> None:
    """A conversation's calls and results, as both doors take them ({role, content, tool_calls: [{id, name,
    arguments}], tool_call_id}): each call's arguments a JSON object, each tool turn answering a call an
    earlier assistant turn made."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or []):
            try:
                arguments = untrusted_json.loads(call["arguments"] or "{}")
            except json.JSONDecodeError:
                arguments = None
            check_field(
                isinstance(arguments, dict),
                f"{field}[{i}].tool_calls[{j}].function.arguments",
                "must be a JSON object (as text)",
            )
            check_field(
                bool(call["name"]), f"{field}[{i}].tool_calls[{j}].function.name", "must not be empty"
            )
            calls.add(call["id"])
        if m["role"] == "tool":
            answered = m.get("tool_call_id") or ""
            check_field(
                answered in calls,
                f"{field}[{i}].tool_call_id",
                f"{answered[:80]!r} answers no call of an earlier assistant message",
            )


def tool_spec_of(
    tools: Sequence[Tool],
    choice: str | None,
    parallel: bool | None,
    choice_field: str = "tool_choice",
    path: str = "tools[{i}].function.{key}",
) -> ToolSpec | None:
    """A request's tools and choice (None without tools): schemas checked (inference.tools.check_tools),
    a named choice naming one of them."""
    if not tools:
        check_field(choice in (None, "", "none", "auto"), choice_field, "needs tools")
        return None
    check_tools(list(tools), path)
    chosen = choice or "auto"
    names = [t.name for t in tools]
    check_field(
        chosen in ("auto", "none", "required", *names),
        choice_field,
        f"must be 'auto', 'none', 'required' or one of the tools ({', '.join(names)}); got {chosen[:64]!r}",
    )
    return ToolSpec(tuple(tools), chosen, True if parallel is None else parallel)


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
    check_field(bool(messages) != bool(prompt), n.messages, "send either messages or prompt (exactly one)")
    content_field = (lambda _i: n.prompt) if prompt else (lambda i: f"{n.messages}[{i}].content")
    if prompt:
        turns = [{"role": "user", "content": prompt}]
    else:
        check_field(len(messages) <= MAX_MESSAGES, n.messages, f"at most {MAX_MESSAGES} messages")
        turns = []
        for i, m in enumerate(messages):
            role = m["role"]
            check_field(
                role in ROLES, f"{n.messages}[{i}].role", f"must be one of {sorted(ROLES)} (got {role!r})"
            )
            turns.append({"role": role, "content": m["content"]})
    check_field(any(m["role"] == "user" for m in turns), n.messages, "need at least one user message")
    for i, m in enumerate(turns):
        check_field(0 < len(m["content"]) <= MAX_CONTENT_CHARS, content_field(i),
               f"must have 1 to {MAX_CONTENT_CHARS} characters")  # fmt: skip
    k_used = cfg.default_k if k is None else k
    check_field(k_used >= 0, n.k, f"must not be negative (got {k})")
    check_field(k_used <= cfg.max_k, n.k, f"must be at most {cfg.max_k} (got {k})")
    tokens = cfg.default_max_tokens if max_tokens is None else max_tokens
    check_field(tokens >= 1, n.max_tokens, f"must be at least 1 (got {max_tokens})")
    check_field(tokens <= cfg.max_tokens_limit, n.max_tokens,
           f"must be at most {cfg.max_tokens_limit} (got {max_tokens})")  # fmt: skip
    temp = 0.0 if temperature is None else temperature
    check_field(math.isfinite(temp) and 0 <= temp <= 2, n.temperature, f"must be in [0, 2] (got {temp})")
    p = 1.0 if top_p is None else top_p
    check_field(math.isfinite(p) and 0 <= p <= 1, n.top_p, f"must be in (0, 1] (got {p})")
    check_field(seed is None or 0 <= seed < 2**64, n.seed, f"must be in [0, 2^64) (got {seed})")
    check_field(len(stop) <= MAX_STOP, n.stop, f"at most {MAX_STOP} stop strings")
    for i, st in enumerate(stop):
        check_field(
            0 < len(st) <= MAX_STOP_CHARS, f"{n.stop}[{i}]", f"must have 1 to {MAX_STOP_CHARS} characters"
        )
    check_field(not domain or bool(DOMAIN_RE.fullmatch(domain)), n.domain,
           f"must be a dotted lower-case prefix like math.geometry (got {domain[:80]!r})")  # fmt: skip
    check_field(not library_root or bool(ROOT_RE.fullmatch(library_root)), n.library_root,
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
        min_score=cfg.min_similarity,
        response_format=response_format,
        adapter=adapter,
    )


class ModelNotServed(NotFound):
    """Neither this node nor any peer it knows serves the model; `served` lists what this node does."""

    def __init__(self, model: str, served: list[str], routing: bool) -> None:
        served = [s for s in served if s]
        if not model:
            # Only a light node gets here: a request that names no model asks for the one it does not have.
            super().__init__(
                "this is a light node (model.backend = 'none'): it serves no model; name a model a peer "
                "serves (zoo-node peers lists them)" + ("" if routing else ", with p2p routing on")
            )
        else:
            served_here = ", ".join(served) or "no model: a light node"
            elsewhere = "no peer advertises it" if routing else "p2p routing is off"
            super().__init__(
                f"model {model!r} is not served by this node (it serves {served_here}); {elsewhere}"
            )
        self.model, self.served = model, served


class Placement(NamedTuple):
    """Where a request runs: here (with `adapter`, "" for the base model), or at a peer serving `remote`."""

    adapter: str = ""
    remote: str = ""


class ServingRules:
    """Placement, readiness and priority, decided the same way for both front doors."""

    def __init__(
        self,
        engine: Callable[[], InferenceEngine | None],
        base_model: str,
        *,
        adapters: Callable[[], list[str]] = list,
        router: Any = None,
        credits: CreditBook | None = None,
        model_sha256: str = "",
    ) -> None:
        self._engine = engine
        self.base_model = base_model
        # The served weights' SHA-256: a request may name the model as "sha256:<hex>" (by its weights).
        self.model_sha256 = model_sha256
        self.adapters = adapters
        self.router = router  # a p2p Router when routing is on
        self.credits = credits  # credit holders wait ahead of everyone (node.credits); None: no ledger

    def place(self, model: str, *, forwarded: bool = False, field: str = "model") -> Placement:
        """Where a request for `model` runs (see the module docstring): ValidationError for a name no
        model could have, BackendUnavailable for a forwarded request this node cannot serve,
        ModelNotServed when nobody serves it."""
        if not self.base_model and not model:  # a light node has no model of its own to run it on
            raise ModelNotServed(model, [], self.router is not None)
        by_hash = bool(self.model_sha256) and model == f"sha256:{self.model_sha256}"
        if not model or model == self.base_model or by_hash:
            return Placement()
        check_field(
            len(model) <= 256 and model.isprintable(), field, "must be a printable name of at most 256"
        )
        adapters = self.adapters()
        if model in adapters:
            return Placement(adapter=model)
        if forwarded:
            # Stale capabilities at the forwarder; UNAVAILABLE lets it try another peer. Never forward twice.
            raise BackendUnavailable(f"model {model!r} is not served by this node (a routed request)")
        if self.router is not None and self.router.candidates(model):
            return Placement(remote=model)
        raise ModelNotServed(model, [self.base_model, *adapters], self.router is not None)

    def engine(self) -> InferenceEngine:
        """The engine, or BackendUnavailable while the model is still loading."""
        engine = self._engine()
        if engine is None:
            raise BackendUnavailable("the model is still loading; retry shortly (see health of 'model')")
        return engine

    async def prioritise(self, params: InferParams) -> bool:
        """Whether the request is a credit holder's (admitted first, decoded ahead); marks `params`."""
        params.priority = self.credits is not None and await self.credits.is_holder(
            params.client, params.spend
        )
        return params.priority

    def attest(self, outcome: InferOutcome, params: InferParams) -> None:
        """Unsupported when the request asked for a receipt and none was signed: metering signs every
        answer's (node.components.inference.answer_metering), so only a node without a notary has none."""
        if params.receipt and outcome.receipt is None:
            raise Unsupported("this node signs no receipts")


# -- routed: what a peer is asked, and what its answer becomes


def proof_text(proof: AnswerProof) -> str:
    """An answer's proof as the compact JSON an InferResponse carries."""
    return json.dumps(proof.to_json(), separators=(",", ":"))


def proof_from_text(text: str) -> AnswerProof | None:
    """A peer's proof as it sent it ("" when it sent none); BackendError when it does not parse (the peer
    is at fault, not the client)."""
    if not text:
        return None
    try:
        return answer_proof.parse(text)
    except ProofError as e:
        raise BackendError(f"the peer's proof of its answer does not parse: {e}") from None


def receipt_to_proto(receipt: dict[str, Any]) -> inference_pb2.Receipt:
    return inference_pb2.Receipt(**receipt)


def receipt_from_proto(r: inference_pb2.Receipt) -> dict[str, Any]:
    """A peer's receipt as it signed it (zoo-node verify-receipt checks it; nothing here trusts it)."""
    return {f.name: getattr(r, f.name) for f in inference_pb2.Receipt.DESCRIPTOR.fields}


def sampling_to_proto(s: InferParams | InferOutcome) -> inference_pb2.SamplingParams:
    """The sampling a request asked for (InferParams) or an answer used (InferOutcome), as the proto."""
    return inference_pb2.SamplingParams(
        max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed, stop=s.stop
    )


def params_to_request(params: InferParams, model: str) -> inference_pb2.InferRequest:
    """The InferRequest a peer needs to answer `params` with `model` (routing from the HTTP API)."""
    rf = params.response_format
    return inference_pb2.InferRequest(
        messages=[inference_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in params.messages],
        domain=params.domain,
        k=params.k,
        sampling=sampling_to_proto(params),
        disable_experiences=params.disable_experiences,
        library_root=params.library_root,
        use_expert_factors=params.use_expert_factors,
        response_format=inference_pb2.ResponseFormat(type=rf.type, json_schema=rf.schema)
        if rf is not None
        else None,
        model=model,
        receipt=params.receipt,
        proof=params.proof,
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
        receipt=receipt_from_proto(r.receipt) if r.HasField("receipt") else None,
        proof=proof_from_text(r.proof),
    )
