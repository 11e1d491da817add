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

from zoo.inference.engine import InferOutcome


@dataclass
class Answer:
    """How one generation endpoint's answers look, whole or as a stream of chunks."""

    id: str
    model: str
    include_usage: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    object: str = ""
    chunk_object: str = ""

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, o: InferOutcome, queue_ms: float) -> dict[str, Any]:
        return {
            **self.head(self.object),
            "choices": [self.choice(o.text, finish_reason(o))],
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

    def delta(self, text: str) -> dict[str, Any]:
        return self.chunk(self.chunk_choice(text, None))

    def closing(self, o: InferOutcome, queue_ms: float) -> list[dict[str, Any]]:
        events = [self.chunk(self.chunk_choice(None, finish_reason(o)), zoo=zoo_extension(o, queue_ms))]
        if self.include_usage:
            events.append({**self.head(self.chunk_object), "choices": [], "usage": usage(o)})
        return events

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class ChatAnswer(Answer):
    object: str = "chat.completion"
    chunk_object: str = "chat.completion.chunk"

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> list[dict[str, Any]]:
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return [self.chunk({**first, "finish_reason": None})]


@dataclass
class CompletionAnswer(Answer):
    object: str = "text_completion"
    chunk_object: str = "text_completion"

    def choice(self, text: str, finish: str) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def chunk_choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}


def finish_reason(o: InferOutcome) -> str:
    """OpenAI knows "stop" and "length"; a generation ended early by cancellation reads as "stop"."""
    return "length" if o.finish_reason == "length" else "stop"


def usage(o: InferOutcome) -> dict[str, int]:
    total = o.prompt_tokens + o.completion_tokens
    return {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens, "total_tokens": total}


def zoo_extension(o: InferOutcome, queue_ms: float) -> dict[str, Any]:
    """What the answer was built from: the library version, the experiences used, timings, the seed."""
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
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def encode_vector(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32 bytes, what OpenAI's clients decode
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]
