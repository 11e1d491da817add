"""One inference request end to end: pick the library version, retrieve, assemble the prompt, apply
expert factors, generate, parse citations. Serving concerns (queueing, deadlines, gRPC) live in the
node; this module is the domain logic they call."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from zoo.inference.adapters import AdapterDirectory, AdapterRef
from zoo.inference.backend_protocol import (
    Backend,
    ChoiceGroup,
    Chunk,
    GenerationRequest,
    ResponseFormat,
    TokenLogprob,
)
from zoo.inference.defaults import (
    DEFAULT_EXPERIENCE_BUDGET,
    DEFAULT_K,
    DEFAULT_LESSON_POSITION,
    DEFAULT_MAX_TOKENS,
    LessonPosition,
)
from zoo.inference.prompt import Assembled, assemble, check_fits, parse_citations
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.answer_proof import AnswerProof, Verdict
from zoo.inference.provenance.documents import prompt_document, sha256_hex
from zoo.inference.tools import ToolCall, ToolSpec, parse_answer, render_turns, template_messages
from zoo.registry.errors import ValidationError, ZooError


class Unsupported(ZooError):
    """The request asks for something this node's backend cannot do."""


class WrongModel(ZooError):
    """A proof names weights this node does not serve: it says which it needs and which it has."""

    def __init__(self, wanted: str, served: str) -> None:
        self.wanted, self.served = wanted, served
        has = f"0x{served}" if served else "no weights of known hash"
        super().__init__(f"the proof needs the weights sha256 {wanted}; this node serves {has}")


@dataclass
class InferParams:
    messages: list[dict[str, str]]
    domain: str = ""
    k: int = DEFAULT_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    disable_experiences: bool = False
    library_root: str = ""
    use_expert_factors: bool = False
    min_score: float = -1.0
    response_format: ResponseFormat | None = None
    adapter: str = ""  # a named LoRA adapter (inference.adapters); "" is the base model
    client: str = ""  # the account that signed the request (node.credits); "" when anonymous
    spend: Any = None  # the client's consent to be charged credits here (node.credits; opaque to inference)
    priority: bool = False  # a credit holder's request: decoded ahead of the others (GenerationRequest)
    logprobs: int | None = None  # log-probabilities of the answer's tokens, with this many alternatives
    # A prompt continued as given (text, or token ids): no chat template and no experiences, which would
    # change what its log-probabilities score (completions with echo or token ids); `messages` is ignored.
    prompt: str | list[int] | None = None
    echo: bool = False  # with `prompt`: its tokens' log-probabilities come back too
    n: int = 1  # choices: one prompt (one prefill, one admission), each choice its own seed-derived stream
    # Tools the model may call: described to it (by its chat template or inference.tools.render_turns),
    # their calls constrained where the backend constrains decoding, and read out of each answer. The
    # messages may carry earlier calls ("tool_calls": [{id, name, arguments}]) and results (role "tool").
    tools: ToolSpec | None = None
    receipt: bool = False  # the client asks for the node's signed receipt of the answer (node.provenance)
    request_sha256: str = ""  # the request's bytes as received, hashed: what its receipt names it by
    proof: bool = False  # the client asks for the answer's proof of inference (provenance.answer_proof)


@dataclass
class UsedExperience:
    id: str
    score: float
    cited: bool
    text: str
    kind: str = "lesson"
    answer: str = ""
    author: str = ""  # provenance.author: whom its use is credited to


@dataclass
class Choice:
    """One of a request's n answers."""

    text: str
    finish_reason: str
    completion_tokens: int
    seed: int
    logprobs: list[TokenLogprob] | None = None
    # With tools: the calls the answer makes (then finish_reason is "tool_calls") and the text beside them.
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None


@dataclass
class InferOutcome:
    text: str
    experiences: list[UsedExperience]
    library_root: str
    library_version: int
    model_id: str
    prompt_tokens: int
    completion_tokens: int
    retrieval_ms: float
    generation_ms: float
    finish_reason: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    adapter: str = ""
    prompt_logprobs: list[TokenLogprob] | None = None
    # Every choice, the first being the one the fields above describe (its logprobs and tool calls are
    # there); completion_tokens counts them all, and an experience is cited when any choice cites it.
    choices: list[Choice] = field(default_factory=list)
    # The SHA-256 (0x hex) of the prompt as the model saw it (zoo.inference.provenance.documents); set
    # only when the request asked for a receipt.
    prompt_sha256: str = ""
    # The node's signed receipt of this answer (its JSON), when the request asked for one (node.provenance).
    receipt: dict[str, Any] | None = None
    # The answer's proof of inference, when the request asked for one (a receipt then names its hash).
    proof: AnswerProof | None = None


def _choice(text: str, finish: str, tokens: int, seed: int, logprobs: Any, tools: ToolSpec | None) -> Choice:
    """One answer as a choice; with tools, its calls read out of the text."""
    choice = Choice(text, finish, tokens, seed, logprobs, content=text)
    if tools is None or not tools.calls:
        return choice
    parsed = parse_answer(text, tools)
    choice.content, choice.tool_calls = parsed.content, parsed.calls
    if parsed.calls:
        choice.finish_reason = "tool_calls"
    return choice


def choice_seed(seed: int, index: int) -> int:
    """The seed of a request's choice `index`: the request's own for the first (so n = 1 and the first of
    n answer alike), then a well-spread derivation below 2^63 (what servers taking int64 seeds accept)."""
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) % 2**63


class SearchIndex(Protocol):
    def search(self, query: str, k: int = 5, domain: str = "", min_score: float = -1.0) -> list[Any]: ...


class LibraryView(Protocol):
    """What the engine needs from the node: the index and version to answer from."""

    def resolve(self, root: str) -> tuple[SearchIndex | None, str, int, Any]:
        """(index, root, version, stored version) for a pinned root, or the current one when root is ""."""
        ...


FactorBuilder = Callable[[Sequence[Any]], Any]  # experiences -> logits processor or None


@dataclass(eq=False)
class InferenceEngine:
    backend: Backend
    library: LibraryView
    _: KW_ONLY
    experience_budget: int = DEFAULT_EXPERIENCE_BUDGET
    lesson_position: LessonPosition = DEFAULT_LESSON_POSITION
    factor_builder: FactorBuilder | None = None
    on_answered: Callable[[InferOutcome, InferParams], Awaitable[None]] | None = None
    adapters: AdapterDirectory | None = None
    model_sha256: str = ""  # the served weights' SHA-256 (what proofs name); "" when unknown

    def retrieve(
        self, query: str, k: int, domain: str, min_score: float, root: str = ""
    ) -> tuple[list[Any], str, int]:
        index, root, version, _stored = self.library.resolve(root)
        hits = (
            index.search(query, k=k, domain=domain, min_score=min_score)
            if index is not None and k > 0
            else []
        )
        return hits, root, version

    async def stream(self, p: InferParams) -> AsyncIterator[Chunk | InferOutcome]:
        """Yields text chunks, then one InferOutcome."""

        if p.use_expert_factors and not self.backend.supports_logits_processors:
            raise Unsupported(f"the {type(self.backend).__name__} cannot apply decode-time expert factors")
        self._check_supported(p)
        adapter = self._adapter(p.adapter) if p.adapter else None
        t0 = time.perf_counter()
        hits, root, version = await self._experiences_for(p)
        retrieval_ms = (time.perf_counter() - t0) * 1000
        # Tools (and a conversation's calls and results): rendered by the model's own chat template where
        # it knows them in the syntax inference.tools reads, else described in the system turn.
        native = p.tools is not None and p.tools.calls and getattr(self.backend, "renders_tools", False)
        tool_dicts = [t.openai() for t in p.tools.tools] if native and p.tools else None
        assembled = await self._assemble(p, hits, bool(native), tool_dicts)
        seed = p.seed if p.seed is not None else random.SystemRandom().randrange(2**63)
        requests = await self._generation_requests(p, assembled, seed, adapter, bool(native), tool_dicts)
        t1 = time.perf_counter()
        results: dict[int, Any] = {}
        try:
            async with contextlib.aclosing(merged([self.backend.stream(r) for r in requests])) as chunks:
                async for index, chunk in chunks:
                    if chunk.result is not None:
                        results[index] = chunk.result
                    elif chunk.delta or chunk.logprobs or chunk.prompt_logprobs is not None:
                        chunk.index = index
                        yield chunk
        finally:  # however this stream ends (a client gone, a deadline), generation stops
            for r in requests:
                r.cancel.set()
        outcome = self._outcome(p, assembled, requests, results, root, version, seed, retrieval_ms, t1)
        if p.proof:
            outcome.proof = await asyncio.to_thread(self._proof, p, requests[0], results[0])
        if self.on_answered is not None:  # the answer's receipt names it (node.provenance.receipts)
            outcome.prompt_sha256 = sha256_hex(prompt_document(assembled.messages, tool_dicts, p.prompt))
        if self.on_answered is not None:  # before the answer goes out: metering commits what it answered
            await self.on_answered(outcome, p)
        yield outcome

    async def _experiences_for(self, p: InferParams) -> tuple[list[Any], str, int]:
        """The hits to answer with (none when experiences are off or the prompt is given as is), and the
        library root and version they come from."""
        query = next((m["content"] for m in reversed(p.messages) if m["role"] == "user"), "")
        if p.disable_experiences or p.prompt is not None:
            _index, root, version, _ = await asyncio.to_thread(self.library.resolve, p.library_root)
            return [], root, version
        return await asyncio.to_thread(self.retrieve, query, p.k, p.domain, p.min_score, p.library_root)

    async def _assemble(
        self, p: InferParams, hits: list[Any], native: bool, tool_dicts: list[dict[str, Any]] | None
    ) -> Assembled:
        """The prompt: a plain one as given, else the conversation with the hits that fit its budget."""
        if p.prompt is not None:
            return await asyncio.to_thread(self._plain_prompt, p)
        return await asyncio.to_thread(
            assemble,
            template_messages(p.messages) if native else render_turns(p.messages, p.tools),
            hits,
            functools.partial(self.backend.count_prompt_tokens, tools=tool_dicts)
            if native
            else self.backend.count_prompt_tokens,
            experience_budget=self.experience_budget,
            context_length=self.backend.context_length,
            max_tokens=p.max_tokens,
            lesson_position=self.lesson_position,
        )

    async def _generation_requests(
        self,
        p: InferParams,
        assembled: Assembled,
        seed: int,
        adapter: AdapterRef | None,
        native: bool,
        tool_dicts: list[dict[str, Any]] | None,
    ) -> list[GenerationRequest]:
        """One request a choice, each with its own seed and expert-factor processor."""

        def factors() -> Any:  # a processor of its own for each choice (processors may keep state)
            if p.use_expert_factors and self.factor_builder is not None and assembled.used:
                return self.factor_builder([h.experience for h in assembled.used])
            return None

        group = ChoiceGroup(p.n) if p.n > 1 else None
        response_format = p.response_format
        if p.tools is not None and p.tools.calls and getattr(self.backend, "constrains_json", False):
            tag = await asyncio.to_thread(p.tools.structural_tag)
            response_format = ResponseFormat("structural_tag", tag)
        return [
            GenerationRequest(
                assembled.messages,
                p.max_tokens,
                p.temperature,
                p.top_p,
                choice_seed(seed, i),
                list(p.stop),
                factors(),
                response_format=response_format,
                adapter=adapter,
                priority=p.priority,
                logprobs=p.logprobs,
                prompt=p.prompt,
                echo=p.echo and i == 0,  # the prompt is scored once
                group=group,
                tools=tool_dicts,
                tool_choice=p.tools.openai_choice() if native and p.tools is not None else None,
                parallel_tool_calls=p.tools.parallel if p.tools is not None else True,
                proof=p.proof,
            )
            for i in range(p.n)
        ]

    def _outcome(
        self,
        p: InferParams,
        assembled: Assembled,
        requests: list[GenerationRequest],
        results: dict[int, Any],
        root: str,
        version: int,
        seed: int,
        retrieval_ms: float,
        generation_started: float,
    ) -> InferOutcome:
        """The answer's outcome from every choice's result (every backend ends its stream with one)."""
        choices = [
            _choice(r.text, r.finish_reason, r.completion_tokens, q.seed, r.logprobs, p.tools)
            for r, q in ((results[i], requests[i]) for i in range(p.n))
        ]
        result = results[0]
        ids = [h.experience.id for h in assembled.used]
        cited = {c for choice in choices for c in parse_citations(choice.text, ids)}
        return InferOutcome(
            text=result.text,
            experiences=[
                UsedExperience(
                    h.experience.id,
                    h.score,
                    h.experience.id in cited,
                    h.experience.text,
                    h.experience.kind,
                    h.experience.answer or "",
                    h.experience.provenance.author,
                )
                for h in assembled.used
            ],
            library_root=root,
            library_version=version,
            model_id=self.backend.model_id,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=sum(c.completion_tokens for c in choices),
            retrieval_ms=retrieval_ms,
            generation_ms=(time.perf_counter() - generation_started) * 1000,
            finish_reason=choices[0].finish_reason,
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=seed,
            stop=list(p.stop),
            adapter=p.adapter,
            prompt_logprobs=result.prompt_logprobs,
            choices=choices,
        )

    def _proof(self, p: InferParams, request: GenerationRequest, result: Any) -> AnswerProof:
        hidden = result.hidden
        if hidden is None:
            raise Unsupported(
                f"the {type(self.backend).__name__} kept no hidden states for this answer's proof"
            )
        return answer_proof.make(
            self.model_sha256,
            hidden.prompt_ids,
            hidden.output_ids,
            hidden.states,
            temperature=p.temperature,
            top_p=p.top_p,
            constrained=request.logits_processor is not None or request.response_format is not None,
            kernels=getattr(self.backend, "proof_kernels", ""),
        )

    async def verify(self, proof: AnswerProof) -> Verdict:
        """Accept or reject an answer's proof by recomputing its states with one prefill of these weights
        (WrongModel when the proof names other weights)."""
        if not getattr(self.backend, "supports_proofs", False):
            raise Unsupported(f"the {type(self.backend).__name__} cannot verify proofs of inference")
        if proof.model != "0x" + self.model_sha256:
            raise WrongModel(proof.model, self.model_sha256)
        mine = getattr(self.backend, "proof_kernels", "")
        if proof.kernels != mine:
            raise Unsupported(
                f"the proof was computed by {proof.kernels!r}; this node computes with {mine!r}: a node "
                "with the prover's kernels checks it (other kernels' numbers differ as much as another "
                "quantization's: docs/security.md, Proofs)"
            )
        if int(proof.adapter, 16):
            raise Unsupported("proofs of answers given with a LoRA adapter cannot be verified yet")
        ids, first = proof.prefill()
        if len(ids) > self.backend.context_length:
            raise ValidationError(
                "proof", f"{len(ids)} tokens exceed this node's context of {self.backend.context_length}"
            )
        states, logits = await self.backend.recompute(ids, first)  # type: ignore[attr-defined]
        return await asyncio.to_thread(
            answer_proof.verify,
            proof,
            states,
            logits,
            self.backend.proof_thresholds,  # type: ignore[attr-defined]
        )

    def _check_supported(self, p: InferParams) -> None:
        """Refuse what this backend cannot honour, naming the parameter (HTTP's names; 400)."""
        kind = type(self.backend).__name__
        if p.proof:
            if not getattr(self.backend, "supports_proofs", False) or not self.model_sha256:
                raise ValidationError("proof", f"proofs of inference are not produced by the {kind}")
            if p.n > 1:
                raise ValidationError("proof", "a proof covers one answer: n must be 1")
            if p.adapter:
                raise ValidationError("proof", "answers given with a LoRA adapter carry no proof yet")
            most = getattr(self.backend, "max_proven_tokens", answer_proof.MAX_PROVEN_TOKENS)
            if p.max_tokens > most:
                raise ValidationError(
                    "proof",
                    f"the {kind} proves at most {most} new tokens: set max_tokens to at most that (got "
                    f"{p.max_tokens}); that is as far as its proofs were measured to verify without false "
                    "rejections (docs/security.md, Proofs)",
                )
        if p.logprobs is not None and not getattr(self.backend, "supports_logprobs", False):
            raise ValidationError("logprobs", f"log-probabilities are not supported by the {kind}")
        if p.prompt is not None and not getattr(self.backend, "supports_echo", False):
            raise ValidationError("echo", f"echoing a scored prompt is not supported by the {kind}")
        if p.tools is not None and p.tools.calls and not getattr(self.backend, "supports_tools", False):
            raise ValidationError("tools", f"tool calling is not supported by the {kind}")

    def _plain_prompt(self, p: InferParams) -> Assembled:
        """A plain-text prompt as given (no experiences), checked against the context window."""
        assert p.prompt is not None
        tokens = len(p.prompt) if isinstance(p.prompt, list) else self.backend.count_text_tokens(p.prompt)  # type: ignore[attr-defined]
        check_fits("prompt", tokens, p.max_tokens, self.backend.context_length)
        return Assembled(p.messages, [], prompt_tokens=tokens)

    def _adapter(self, name: str) -> AdapterRef:
        if not getattr(self.backend, "supports_adapters", False):
            raise Unsupported(f"the {type(self.backend).__name__} cannot serve LoRA adapters")
        if self.adapters is None:
            raise Unsupported("this node has no adapters directory")
        return self.adapters.resolve(name)  # NotFound names the directory and the adapters it holds


async def merged(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[tuple[int, Chunk]]:
    """Several streams' chunks as they come, each with its stream's index. Written by hand: asyncio has
    no merge of async iterators. The first error stops every stream and is raised; closing this generator
    (a client gone) closes every stream, which cancels their generation."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for chunk in only:
                yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Chunk]) -> None:
        try:
            async with contextlib.aclosing(stream) as chunks:  # type: ignore[type-var]
                async for chunk in chunks:
                    await queue.put((index, chunk))
        except Exception as e:
            await queue.put((index, e))
        else:
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
