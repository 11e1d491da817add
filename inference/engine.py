"""One inference request end to end: pick the library version, retrieve, assemble the prompt, apply
expert factors, generate, parse citations. Serving concerns (queueing, deadlines, gRPC) live in the
node; this module is the domain logic they call."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from zoo.inference.adapters import AdapterDirectory, AdapterRef
from zoo.inference.backend import Backend, Chunk, GenerationRequest, ResponseFormat
from zoo.inference.defaults import DEFAULT_EXPERIENCE_BUDGET, DEFAULT_LESSON_POSITION, LessonPosition
from zoo.inference.prompt import assemble, parse_citations
from zoo.registry.errors import ZooError


class Unsupported(ZooError):
    """The request asks for something this node's backend cannot do."""


@dataclass
class InferParams:
    messages: list[dict[str, str]]
    domain: str = ""
    k: int = 5
    max_tokens: int = 256
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


class SearchIndex(Protocol):
    def search(self, query: str, k: int = 5, domain: str = "", min_score: float = -1.0) -> list[Any]: ...


class LibraryView(Protocol):
    """What the engine needs from the node: the index and version to answer from."""

    def resolve(self, root: str) -> tuple[SearchIndex | None, str, int, Any]:
        """(index, root, version, stored version) for a pinned root, or the current one when root is ""."""
        ...


FactorBuilder = Callable[[Sequence[Any]], Any]  # experiences -> logits processor or None


class InferenceEngine:
    def __init__(
        self,
        backend: Backend,
        library: LibraryView,
        *,
        experience_budget: int = DEFAULT_EXPERIENCE_BUDGET,
        lesson_position: LessonPosition = DEFAULT_LESSON_POSITION,
        factor_builder: FactorBuilder | None = None,
        on_answered: Callable[[InferOutcome, InferParams], Awaitable[None]] | None = None,
        adapters: AdapterDirectory | None = None,
    ) -> None:
        self.backend = backend
        self.library = library
        self.experience_budget = experience_budget
        self.lesson_position = lesson_position
        self.factor_builder = factor_builder
        self.on_answered = on_answered
        self.adapters = adapters

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
        adapter = self._adapter(p.adapter) if p.adapter else None
        t0 = time.perf_counter()
        query = next((m["content"] for m in reversed(p.messages) if m["role"] == "user"), "")
        if p.disable_experiences:
            _index, root, version, _ = await asyncio.to_thread(self.library.resolve, p.library_root)
            hits: list[Any] = []
        else:
            hits, root, version = await asyncio.to_thread(
                self.retrieve, query, p.k, p.domain, p.min_score, p.library_root
            )
        retrieval_ms = (time.perf_counter() - t0) * 1000
        assembled = await asyncio.to_thread(
            assemble,
            p.messages,
            hits,
            self.backend.count_prompt_tokens,
            experience_budget=self.experience_budget,
            context_length=self.backend.context_length,
            max_tokens=p.max_tokens,
            lesson_position=self.lesson_position,
        )
        processor = None
        if p.use_expert_factors and self.factor_builder is not None and assembled.used:
            processor = self.factor_builder([h.experience for h in assembled.used])
        seed = p.seed if p.seed is not None else random.SystemRandom().randrange(2**63)
        request = GenerationRequest(
            assembled.messages,
            p.max_tokens,
            p.temperature,
            p.top_p,
            seed,
            list(p.stop),
            processor,
            response_format=p.response_format,
            adapter=adapter,
            priority=p.priority,
        )
        t1 = time.perf_counter()
        result = None
        try:
            async for chunk in self.backend.stream(request):
                if chunk.result is not None:
                    result = chunk.result
                elif chunk.delta:
                    yield chunk
        finally:
            request.cancel.set()
        assert result is not None  # every backend ends its stream with a result
        ids = [h.experience.id for h in assembled.used]
        cited = set(parse_citations(result.text, ids))
        outcome = InferOutcome(
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
            completion_tokens=result.completion_tokens,
            retrieval_ms=retrieval_ms,
            generation_ms=(time.perf_counter() - t1) * 1000,
            finish_reason=result.finish_reason,
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=seed,
            stop=list(p.stop),
            adapter=p.adapter,
        )
        if self.on_answered is not None:  # before the answer goes out: metering commits what it answered
            await self.on_answered(outcome, p)
        yield outcome

    def _adapter(self, name: str) -> AdapterRef:
        if not getattr(self.backend, "supports_adapters", False):
            raise Unsupported(f"the {type(self.backend).__name__} cannot serve LoRA adapters")
        if self.adapters is None:
            raise Unsupported("this node has no adapters directory")
        return self.adapters.resolve(name)  # NotFound names the directory and the adapters it holds
