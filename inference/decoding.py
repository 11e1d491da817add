"""What happens to one request's tokens once they are chosen, whatever engine chose them: incremental
detokenization, stop strings (and the text held back while it could still become one), token and context
limits, grammar termination, cancellation, and the final result. Both local schedulers (the transformers
batcher and the llama.cpp one) keep one `DecodingState` a request; this module imports no tensor library.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from zoo.inference.adapters import AdapterLoadError
from zoo.inference.backend_protocol import (
    BackendError,
    Chunk,
    GenerationRequest,
    GenerationResult,
    HiddenStates,
    TokenLogprob,
    apply_stop,
)

Emit = Callable[[Any], None]  # receives text deltas (str, or Chunk with logprobs), then a result or an error


async def relay(request: GenerationRequest, submit: Callable[[Emit], None]) -> AsyncIterator[Chunk]:
    """A scheduler thread's output for one request as this event loop's stream: `submit(emit)` hands the
    request to the thread, whose emits (text, then the result or an error) arrive here as chunks. On
    completion, error, or when the consumer goes away (client cancel, deadline), the request is cancelled,
    so the scheduler frees its row at its next step."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(item: Any) -> None:
        # The consumer's loop may be gone (closed after a cancel); nothing is left to tell then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)

    submit(emit)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, str):
                yield Chunk(item)
            elif isinstance(item, Chunk):
                yield item
            elif isinstance(item, GenerationResult):
                yield Chunk("", item)
                return
            elif isinstance(item, AdapterLoadError):
                raise item
            else:
                raise BackendError(f"generation failed: {type(item).__name__}: {item}") from item
    finally:
        request.cancel.set()


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Log-probabilities of one row of logits (float64: a masked row's -inf stays -inf, no NaN)."""
    x = scores.astype(np.float64, copy=False)
    top = np.max(x)
    return x - (top + np.log(np.sum(np.exp(x - top))))


def token_logprob(
    logprobs: np.ndarray, token: int, top: int, token_bytes: Callable[[int], bytes]
) -> TokenLogprob:
    """The entry of `token` in a row of log-probabilities, with its `top` most likely alternatives."""
    best: Any = ()
    if top > 0:
        best = np.argpartition(-logprobs, top - 1)[:top]
        best = best[np.argsort(-logprobs[best], kind="stable")]
    alternatives = ((int(i), float(logprobs[i])) for i in best)
    return logprob_entry(token, float(logprobs[token]), alternatives, token_bytes)


def logprob_entry(
    token: int,
    logprob: float | None,
    alternatives: Iterable[tuple[int, float]],
    token_bytes: Callable[[int], bytes],
) -> TokenLogprob:
    """A token's entry from its log-probability and its alternatives (id, log-probability), most likely
    first. Tokens a grammar masked out (-inf) are no alternative (and JSON has no infinity)."""
    top = tuple((_text(b), b, v) for i, v in alternatives if math.isfinite(v) for b in (token_bytes(i),))
    data = token_bytes(token)
    return TokenLogprob(_text(data), data, logprob, top, token)


def unscored(token: int, token_bytes: Callable[[int], bytes]) -> TokenLogprob:
    """A prompt's first token: nothing precedes it, so it has no log-probability."""
    return logprob_entry(token, None, (), token_bytes)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class Detokenizer:
    """Incremental detokenization (TGI's prefix/read offsets): text appears once its bytes are complete,
    never re-decoding more than the last few tokens."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        text = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(prefix) :]
        return ""


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could still become a stop string (not safe to emit)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


@dataclass
class DecodingState:
    """One request in a scheduler: its prompt, what was generated, and what was emitted of it."""

    request: GenerationRequest
    prompt_ids: list[int]
    emit: Emit
    detok: Detokenizer
    constraint: Any = None  # a grammar constraint (structured output), or None
    generated: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (cut at a stop string)
    sent: int = 0  # characters of `text` emitted
    finish: str = ""
    enqueued: float = field(default_factory=time.perf_counter)
    # With request.logprobs: an entry per generated token (an ending EOS marked), the length of `text` once
    # it was decoded (its text has been sent once that much is), and how many entries were emitted.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    logprob_ends: list[int] = field(default_factory=list)
    logprobs_sent: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None  # with request.echo, set by the scheduler
    # With request.proof: the last hidden state that produced each generated token, kept by the scheduler.
    states: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.request.proof:
            self.states = []

    @property
    def length(self) -> int:
        """Tokens of this request in the KV cache once its last generated token has been fed."""
        return len(self.prompt_ids) + len(self.generated)

    def accept(
        self, token: int, eos_ids: set[int], context_length: int, logprob: TokenLogprob | None = None
    ) -> bool:
        """Record a sampled token (and its log-probability) and emit text; False when it has finished."""
        self.generated.append(token)
        req = self.request
        if self.constraint is not None:
            self.constraint.accept(token)
        if token in eos_ids:
            if logprob is not None:
                self.logprobs.append(dataclasses.replace(logprob, eos=True))
                self.logprob_ends.append(len(self.text))
            return self.end("stop")
        self.text += self.detok.push(token)
        if logprob is not None:
            self.logprobs.append(logprob)
            self.logprob_ends.append(len(self.text))
        if req.stop:
            cut, hit = apply_stop(self.text, req.stop)
            if hit:
                self.text = cut
                return self.end("stop")
            self.send(len(self.text) - held_back(self.text, req.stop))
        else:
            self.send(len(self.text))
        if self.constraint is not None and self.constraint.is_terminated():
            return self.end("stop")
        if len(self.generated) >= req.max_tokens or self.length >= context_length:
            return self.end("length")
        if req.cancel.is_set():
            return self.end("cancelled")
        return True

    def send(self, upto: int, final: bool = False) -> None:
        """Emit the text up to `upto` (and the entries of the tokens whose text it completes; `final`: of
        every token that reached the text)."""
        if self.request.logprobs is None:
            if upto > self.sent:
                self.emit(self.text[self.sent : upto])
                self.sent = upto
            return
        done = self.logprobs_sent
        while done < len(self.logprobs) and (
            self.logprob_ends[done] <= upto or (final and self._start(done) < upto)
        ):
            done += 1
        if upto > self.sent or done > self.logprobs_sent:
            self.emit(Chunk(self.text[self.sent : upto], logprobs=self.logprobs[self.logprobs_sent : done]))
            self.sent, self.logprobs_sent = max(upto, self.sent), done

    def scored_prompt(self, entries: list[TokenLogprob]) -> None:
        """With request.echo: the prompt tokens' log-probabilities, sent before any text."""
        self.prompt_logprobs = entries
        self.emit(Chunk("", prompt_logprobs=entries))

    def _start(self, i: int) -> int:
        return self.logprob_ends[i - 1] if i else 0

    def end(self, reason: str) -> bool:
        """Finish with `reason`: emit what is left and the result. Always False (the request is done)."""
        if reason != "cancelled":
            # Text the incremental decoder still held (an unfinished character at the very end).
            full = self.detok.tokenizer.decode(self.generated, skip_special_tokens=True)
            full, hit = apply_stop(full, self.request.stop) if self.request.stop else (full, False)
            if len(full) > len(self.text) and full.startswith(self.text):
                self.text = full
            reason = "stop" if hit else reason
            if not hit:  # nothing was cut: every token's text is in
                self.logprob_ends = [min(e, len(self.text)) for e in self.logprob_ends]
        self.send(len(self.text), final=True)
        self.finish = reason
        logprobs = self.logprobs[: self.logprobs_sent] if self.request.logprobs is not None else None
        self.emit(
            GenerationResult(
                self.text,
                len(self.prompt_ids),
                len(self.generated),
                reason,
                logprobs,
                self.prompt_logprobs,
                self._hidden(),
            )
        )
        return False

    def _hidden(self) -> HiddenStates | None:
        if self.states is None or len(self.states) != len(self.generated):
            return None  # no proof asked for (or a scheduler that kept none)
        states = np.stack(self.states) if self.states else np.empty((0, 0), dtype=np.float32)
        return HiddenStates(list(self.prompt_ids), list(self.generated), states)

    def fail(self, error: Exception) -> None:
        self.finish = "error"
        self.emit(error)


@dataclass
class BatchStats:
    """What the scheduler is doing, for status and metrics."""

    running: int = 0
    waiting: int = 0
    steps: int = 0
    tokens: int = 0
    last_batch: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
