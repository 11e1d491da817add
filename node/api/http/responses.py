"""Answer shapes of the HTTP API: chat and completion answers, whole or as SSE chunks, with their
finish_reason, usage and `zoo` extension; embedding vectors; SSE framing.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.inference.backend_protocol import Chunk, TokenLogprob
from zoo.inference.decoding import held_back
from zoo.inference.engine import Choice, InferOutcome
from zoo.inference.tools import ToolCall


@dataclass
class Answer:
    """How one generation endpoint's answers look, whole or as a stream of chunks, for n choices."""

    id: str
    model: str
    include_usage: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    object: str = ""
    chunk_object: str = ""
    n: int = 1

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, o: InferOutcome, queue_ms: float) -> dict[str, Any]:
        return {
            **self.head(self.object),
            "choices": [self.choice(i, c, o) for i, c in enumerate(choices_of(o))],
            "usage": usage(o),
            "zoo": zoo_extension(o, queue_ms),
        }

    def chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        out = {**self.head(self.chunk_object), "choices": [choice], **extra}
        if self.include_usage:
            out.setdefault("usage", None)
        return out

    def opening(self) -> list[dict[str, Any]]:
        return []

    def delta(self, chunk: Chunk) -> list[dict[str, Any]]:
        return [self.chunk(self.chunk_choice(chunk.index, chunk.delta, None, chunk.logprobs))]

    def closing(self, o: InferOutcome, queue_ms: float) -> list[dict[str, Any]]:
        """Each choice's finish, the last carrying the zoo extension; then usage when asked for."""
        choices = choices_of(o)
        events = [
            self.chunk(
                self.chunk_choice(i, None, finish_reason(c.finish_reason)),
                **({"zoo": zoo_extension(o, queue_ms)} if i == len(choices) - 1 else {}),
            )
            for i, c in enumerate(choices)
        ]
        if self.include_usage:
            events.append({**self.head(self.chunk_object), "choices": [], "usage": usage(o)})
        return events

    def choice(self, index: int, c: Choice, o: InferOutcome) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_choice(
        self, index: int, text: str | None, finish: str | None, logprobs: list[TokenLogprob] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class ChatAnswer(Answer):
    """With `tools`, a streamed choice's text goes out only up to where a call may begin; its calls go out
    whole, one delta each, before its final chunk (OpenAI's clients accumulate them by index)."""

    object: str = "chat.completion"
    chunk_object: str = "chat.completion.chunk"
    logprobs: bool = False
    tools: bool = False
    _texts: dict[int, str] = dataclasses.field(default_factory=dict)  # per choice, its text so far
    _sent: dict[int, int] = dataclasses.field(default_factory=dict)  # per choice, characters sent

    def choice(self, index: int, c: Choice, o: InferOutcome) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c.content, "refusal": None}
        if c.tool_calls:
            message["tool_calls"] = [tool_call(call) for call in c.tool_calls]
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(c.logprobs),
            "finish_reason": finish_reason(c.finish_reason),
        }

    def chunk_choice(
        self, index: int, text: str | None, finish: str | None, logprobs: list[TokenLogprob] | None = None
    ) -> dict[str, Any]:
        delta = {} if text is None else {"content": text}
        entries = self._logprobs(logprobs or []) if text is not None else None
        return {"index": index, "delta": delta, "logprobs": entries, "finish_reason": finish}

    def delta(self, chunk: Chunk) -> list[dict[str, Any]]:
        if not chunk.delta and all(e.eos for e in chunk.logprobs):
            return []  # only the end-of-sequence token, which chat does not list
        if not self.tools:
            return super().delta(chunk)
        i = chunk.index
        text = self._texts[i] = self._texts.get(i, "") + chunk.delta
        safe = _before_a_call(text)
        piece, self._sent[i] = text[self._sent.get(i, 0) : safe], max(safe, self._sent.get(i, 0))
        if not piece and not chunk.logprobs:
            return []
        return [self.chunk(self.chunk_choice(i, piece, None, chunk.logprobs))]

    def closing(self, o: InferOutcome, queue_ms: float) -> list[dict[str, Any]]:
        if not self.tools:
            return super().closing(o, queue_ms)
        events = []
        for i, c in enumerate(choices_of(o)):
            if c.tool_calls:
                calls = [{"index": k, **tool_call(call)} for k, call in enumerate(c.tool_calls)]
                events += [
                    self.chunk(
                        {"index": i, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
                    )
                    for call in calls
                ]
            else:  # no call after all (or none that parses): the text held back is the answer's
                rest = (c.content or "")[self._sent.get(i, 0) :]
                if rest:
                    events.append(self.chunk(self.chunk_choice(i, rest, None)))
        return events + super().closing(o, queue_ms)

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}."""
        if not self.logprobs or entries is None:
            return None
        return {"content": [chat_logprob(e) for e in entries if not e.eos], "refusal": None}

    def opening(self) -> list[dict[str, Any]]:
        return [
            self.chunk(
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            for i in range(self.n)
        ]


@dataclass
class CompletionAnswer(Answer):
    """`echo`: the prompt (as given) leads each choice's text, and with `logprobs` its tokens lead the
    choice's logprobs."""

    object: str = "text_completion"
    chunk_object: str = "text_completion"
    logprobs: int | None = None
    echo: bool = False
    # Per choice, the text_offset of its next token in a stream (the whole answer's rule: the sum of the
    # token strings before it).
    _offsets: dict[int, int] = dataclasses.field(default_factory=dict)
    # With echo, the other choices' chunks wait here until the scored prompt has led every choice.
    _held: list[Chunk] = dataclasses.field(default_factory=list)
    _prompt_sent: bool = False

    def choice(self, index: int, c: Choice, o: InferOutcome) -> dict[str, Any]:
        text, entries = c.text, list(c.logprobs or [])
        if self.echo:
            text = echoed(o.prompt_logprobs) + text
            entries = [*(o.prompt_logprobs or []), *entries]
        logprobs = self._logprobs(entries, 0) if self.logprobs is not None else None
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(c.finish_reason),
        }

    def delta(self, chunk: Chunk) -> list[dict[str, Any]]:
        if chunk.prompt_logprobs is None and (not self.echo or self._prompt_sent):
            return super().delta(chunk) if chunk.delta or chunk.logprobs else []
        if chunk.prompt_logprobs is None:
            self._held.append(chunk)
            return []
        # The scored prompt (scored once, for the first choice) leads every choice's text.
        prompt = echoed(chunk.prompt_logprobs)
        events = [
            self.chunk(self.chunk_choice(i, prompt, None, chunk.prompt_logprobs)) for i in range(self.n)
        ]
        self._prompt_sent = True
        return events + self._release()

    def closing(self, o: InferOutcome, queue_ms: float) -> list[dict[str, Any]]:
        return self._release() + super().closing(o, queue_ms)

    def _release(self) -> list[dict[str, Any]]:
        held, self._held = self._held, []
        events = []
        for chunk in held:  # (a loop: zero-argument super() does not work in a 3.11 comprehension)
            if chunk.delta or chunk.logprobs:
                events += super().delta(chunk)
        return events

    def chunk_choice(
        self, index: int, text: str | None, finish: str | None, logprobs: list[Any] | None = None
    ) -> dict[str, Any]:
        offset = self._offsets.get(index, 0)
        entries = None
        if self.logprobs is not None and text is not None:
            entries = self._logprobs(logprobs or [], offset)
            self._offsets[index] = offset + sum(len(e.token) for e in logprobs or [])
        return {"index": index, "text": text or "", "logprobs": entries, "finish_reason": finish}

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        """OpenAI's completions shape: parallel lists of tokens, their log-probabilities, the alternatives
        (a dict, the chosen token in it) and each token's character offset in the choice's text."""
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            tokens.append(e.token)
            values.append(e.logprob)
            offsets.append(offset)
            offset += len(e.token)
            if e.logprob is None:  # the prompt's first token: nothing precedes it
                tops.append(None)
                continue
            top = {t: lp for t, _b, lp in e.top[: self.logprobs]}
            top.setdefault(e.token, e.logprob)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def echoed(entries: list[TokenLogprob] | None) -> str:
    """The prompt as its tokens spell it (the text sent, or what the token ids sent decode to)."""
    return b"".join(e.bytes for e in entries or []).decode("utf-8", errors="replace")


def choices_of(o: InferOutcome) -> list[Choice]:
    """The outcome's choices (an outcome relayed from a peer carries its one answer only)."""
    return o.choices or [Choice(o.text, o.finish_reason, o.completion_tokens, o.seed, content=o.text)]


def _before_a_call(text: str) -> int:
    """How much of a streamed answer is surely content: up to a call's opening tag, less a tail that may
    still become one, less trailing whitespace (dropped when a call follows)."""
    from zoo.inference.tools import OPEN

    at = text.find(OPEN)
    if at < 0:
        at = len(text) - held_back(text, [OPEN])
    return len(text[:at].rstrip())


def tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_logprob(e: TokenLogprob) -> dict[str, Any]:
    return {
        "token": e.token,
        "logprob": e.logprob,
        "bytes": list(e.bytes),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in e.top],
    }


def finish_reason(reason: str) -> str:
    """OpenAI knows "stop", "length" and "tool_calls"; a generation ended early by cancellation reads as
    "stop"."""
    return reason if reason in ("length", "tool_calls") else "stop"


def usage(o: InferOutcome) -> dict[str, int]:
    total = o.prompt_tokens + o.completion_tokens
    return {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens, "total_tokens": total}


def zoo_extension(o: InferOutcome, queue_ms: float) -> dict[str, Any]:
    """What the answer was built from: the library version, the experiences used, timings, the seed; and
    the node's signed receipt and the answer's proof of inference when the request asked for them."""
    return {
        "library_root": o.library_root,
        "library_version": o.library_version,
        "experiences": [
            {"id": e.id, "kind": e.kind, "score": float(e.score), "cited": e.cited} for e in o.experiences
        ],
        "cited": [e.id for e in o.experiences if e.cited],
        "queue_ms": float(queue_ms),
        "retrieval_ms": float(o.retrieval_ms),
        "generation_ms": float(o.generation_ms),
        "seed": o.seed,
        **({"receipt": o.receipt} if o.receipt is not None else {}),
        **({"proof": o.proof.to_json()} if o.proof is not None else {}),
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def encode_vector(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32 bytes, what OpenAI's clients decode
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]
