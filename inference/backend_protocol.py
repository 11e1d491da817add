"""The generation backend interface and the request/result types every backend shares.

Backends (transformers, vllm, openai) turn chat messages into text. They know nothing of experiences,
gRPC or the library: the inference engine assembles the prompt and hands them plain messages.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from zoo.inference.defaults import DEFAULT_MAX_TOKENS
from zoo.registry.errors import ZooError


class BackendError(ZooError, RuntimeError):
    """The backend failed to generate (model error, remote server error)."""


class BackendUnavailable(BackendError):
    """The backend cannot serve right now (remote unreachable, model not loaded)."""


@dataclass(frozen=True)
class ResponseFormat:
    """Structured output: the answer must be JSON. `json_object`: any JSON object; `json_schema`: an
    instance of `schema` (JSON text of a JSON Schema). Backends that can constrain decoding do; the
    OpenAI-compatible backend passes it to its server. `structural_tag` (set by the engine for tool calls,
    never by clients): `schema` is an xgrammar structural tag (inference.tools)."""

    type: str  # "json_object" | "json_schema" | "structural_tag"
    schema: str = ""

    def __post_init__(self) -> None:
        if self.type not in ("json_object", "json_schema", "structural_tag"):
            raise ValueError(f"unknown response format type {self.type!r}")


MAX_TOP_LOGPROBS = 20  # alternatives a token's log-probability can list (OpenAI's limit for chat)


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability under the distribution it was sampled from: the model's logits
    after expert factors and the grammar mask, before temperature and top-p (so greedy and sampled
    requests report the same numbers for the same tokens). `top`: the most likely alternatives at that
    position, (token, bytes, logprob), most likely first, those a grammar rules out left out. A prompt's
    first token has no log-probability (nothing precedes it): None."""

    token: str
    bytes: bytes
    logprob: float | None
    top: tuple[tuple[str, bytes, float], ...] = ()
    id: int = -1  # the token id, where the backend knows it (not sent to clients)
    # The end-of-sequence token that ended the answer: its text is not in the answer. Completions list it
    # (harnesses count one entry per generated token); chat leaves it out, as OpenAI's does.
    eos: bool = False


class ChoiceGroup:
    """The n choices of one request (GenerationRequest.group), which share one prompt."""

    def __init__(self, n: int) -> None:
        self.n = n


@dataclass
class GenerationRequest:
    messages: list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": ...}]
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    # Decode-time expert factors: a transformers LogitsProcessor (or the vLLM callable) to apply.
    logits_processor: Any = None
    # Constrain the output to JSON (None: free text).
    response_format: ResponseFormat | None = None
    # Set to stop generation early (client cancelled or deadline passed).
    cancel: threading.Event = field(default_factory=threading.Event)
    # A named LoRA adapter to decode with (an inference.adapters.AdapterRef); None: the base model.
    adapter: Any = None
    # A credit holder's request: while any such request decodes, the batch decodes only those (the others
    # wait, their caches kept), so a holder's answer is not slowed by a full batch of other requests.
    priority: bool = False
    # Log-probabilities of the generated tokens, each with this many alternatives (None: none computed).
    logprobs: int | None = None
    # A prompt continued as given, with no chat template: text, or token ids (completions); `messages` is
    # then ignored. With `echo`, its tokens and their log-probabilities come back too.
    prompt: str | list[int] | None = None
    echo: bool = False
    # Function tools (OpenAI's shape) for a backend that renders them itself (a chat template that knows
    # tools, a server that takes them); `messages` then carry calls and results in the shape such
    # templates take, and `tool_choice` / `parallel_tool_calls` are OpenAI's. Whatever the backend, calls
    # come back in the answer's text in inference.tools' syntax.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # The n choices of one client request share its prompt: a scheduler prefills it once and copies its
    # cache to the others (None: a request of its own).
    group: ChoiceGroup | None = None
    # Keep the last hidden state that produced each generated token (GenerationResult.hidden), for the
    # answer's proof (inference.provenance.answer_proof); backends that cannot refuse (Unsupported).
    proof: bool = False


@dataclass(frozen=True)
class HiddenStates:
    """With request.proof: the prompt as the model was fed it, every generated token (an ending EOS
    included), and the last hidden state (after the final norm) at each position that produced one: row i
    produced output_ids[i]."""

    prompt_ids: list[int]
    output_ids: list[int]
    states: Any  # numpy float32, (len(output_ids), hidden size)


@dataclass
class GenerationResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string), "length", "cancelled"
    # One per generated token whose text is in `text` (with request.logprobs), the stop string's own
    # tokens left out, and the end-of-sequence token that ended it (marked `eos`).
    logprobs: list[TokenLogprob] | None = None
    # With request.echo: one per prompt token (alternatives: request.logprobs of them).
    prompt_logprobs: list[TokenLogprob] | None = None
    hidden: HiddenStates | None = None  # with request.proof


@dataclass
class Chunk:
    """One piece of a streamed answer; `result` is set on the last chunk only. `logprobs`: the tokens
    whose text completed in this delta (with request.logprobs); `prompt_logprobs`: with request.echo, on
    one chunk before any text (as in the result)."""

    delta: str
    result: GenerationResult | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None
    index: int = 0  # which of a request's n choices it belongs to (set by the engine)


class Backend(Protocol):
    model_id: str
    context_length: int
    supports_logits_processors: bool
    constrains_json: bool  # response_format is enforced by constrained decoding, so replies always parse
    # What of the OpenAI parameters it honours: logprobs of generated tokens, plain-text prompts with their
    # echoed log-probabilities (backends without them refuse such requests: Unsupported).
    supports_logprobs: bool
    supports_echo: bool
    supports_tools: bool

    def count_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        """Tokens the chat-formatted messages take (what the context limit is checked against)."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Generate, yielding text as it is produced; the last chunk carries the full result."""
        ...

    async def close(self) -> None: ...


async def generate(backend: Backend, request: GenerationRequest) -> GenerationResult:
    """Run a backend's stream to the end and return its result (unary = the same path as streaming)."""
    result: GenerationResult | None = None
    async for chunk in backend.stream(request):
        if chunk.result is not None:
            result = chunk.result
    if result is None:
        raise BackendError("the backend ended its stream without a result")
    return result


def prompt_token_ids(prompt: list[int], vocab_size: int) -> list[int]:
    """A prompt given as token ids, checked against the vocabulary (ValidationError naming `prompt`)."""
    from zoo.registry.errors import ValidationError

    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValidationError("prompt", f"token id {bad} is outside the vocabulary (0 to {vocab_size - 1})")
    return list(prompt)


def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut text at the earliest stop string; returns (text, whether one was found)."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
