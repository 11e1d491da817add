"""What the two in-process backends (transformers, llama.cpp) share: every capability, prompts turned into
token ids (chat template, raw text or ids), grammar constraints built from one cache, and a request
streamed through the backend's scheduler thread. A subclass gives its tokenizer, its chat template, its
vocabulary for grammars, and the scheduler.

Nothing here imports torch: xgrammar (which does) comes in with the first JSON response format.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator
from typing import Any

from zoo.inference.backend_protocol import Chunk, GenerationRequest, ResponseFormat, prompt_token_ids
from zoo.inference.decoding import relay
from zoo.inference.tools import native_tool_syntax


class LocalBackend:
    supports_logits_processors = True
    constrains_json = True  # response_format is enforced while decoding
    supports_adapters = True  # named LoRA adapters decode beside the base model
    supports_logprobs = True
    supports_echo = True
    supports_tools = True  # calls constrained by the grammar of inference.tools

    scheduler: Any  # set by the subclass: its SchedulerThread, whose `submit` takes the request
    vocab_size: int  # token ids a raw prompt may use, and the width of a grammar's mask

    def __init__(self) -> None:
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()

    # -- what a subclass gives -------------------------------------------------------------------------

    def _tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def _chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The chat template applied, with the generation prompt."""
        raise NotImplementedError

    def _chat_template(self) -> str:
        raise NotImplementedError

    def _grammar_vocabulary(self) -> Any:
        """The vocabulary as xgrammar's TokenizerInfo."""
        raise NotImplementedError

    async def _submit_options(self, request: GenerationRequest) -> dict[str, Any]:
        """Keyword arguments of the scheduler's `submit` beyond the prompt and the constraint."""
        return {}

    @property
    def max_batch_size(self) -> int:
        return int(self.scheduler.max_batch_size)

    # -- shared ----------------------------------------------------------------------------------------

    @property
    def renders_tools(self) -> bool:
        """Whether the model's chat template renders tools itself, in the syntax inference.tools reads."""
        return native_tool_syntax(self._chat_template())

    def count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> int:
        return len(self._chat_ids(messages, tools))

    def count_text_tokens(self, text: str) -> int:
        return len(self._tokenize(text))

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, list):
            return prompt_token_ids(request.prompt, self.vocab_size)
        if request.prompt is not None:
            return self._tokenize(request.prompt)
        return self._chat_ids(request.messages, request.tools)

    def constraint(self, fmt: ResponseFormat) -> Any:
        """A grammar constraint for one request (ValidationError naming the schema's problem)."""
        from zoo.inference.structured import GrammarCache

        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCache(self._grammar_vocabulary(), self.vocab_size)
        return self._grammars.constraint(fmt)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt_ids = await asyncio.to_thread(self._prompt_ids, request)
        options = await self._submit_options(request)
        fmt = request.response_format
        constraint = await asyncio.to_thread(self.constraint, fmt) if fmt is not None else None
        submit = functools.partial(
            self.scheduler.submit, request, prompt_ids, constraint=constraint, **options
        )
        async with contextlib.aclosing(relay(request, submit)) as chunks:  # closed with this stream
            async for chunk in chunks:
                yield chunk
