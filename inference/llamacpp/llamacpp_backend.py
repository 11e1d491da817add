"""The llama.cpp backend: a GGUF model (the bundled SmolLM2 by default) served in process through
llama-cpp-python, with continuous batching (scheduler.py), grammar-constrained JSON, expert factors and
LoRA adapters, behind the same Backend interface as the transformers backend.

Nothing on its path to a first answer imports torch or transformers: those come in only with the first
request that needs them (a JSON response format: xgrammar imports torch; expert factors; converting a
PEFT adapter to GGUF).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from zoo.inference.adapters import AdapterLoadError
from zoo.inference.backend_protocol import Chunk, GenerationRequest, ResponseFormat, prompt_token_ids
from zoo.inference.decoding import relay
from zoo.inference.llamacpp.gguf import GgufModel
from zoo.inference.llamacpp.scheduler import LlamaCppScheduler
from zoo.inference.tools import native_tool_syntax

DEFAULT_CONTEXT = 2048  # tokens of KV cache per concurrent request unless model.context_length says


class LlamaCppBackend:
    supports_logits_processors = True
    constrains_json = True
    supports_adapters = True
    supports_logprobs = True
    supports_echo = True
    supports_tools = True  # calls constrained by the grammar of inference.tools

    def __init__(
        self,
        gguf: GgufModel,
        model_id: str,
        *,
        max_batch_size: int = 16,
        context_length: int = DEFAULT_CONTEXT,
        threads: int = 0,
        adapters: Any = None,
        kv_cache_type: str = "f16",
    ) -> None:
        self.gguf = gguf
        self.tokenizer = gguf  # what expert factors read: the vocabulary (inference.factors)
        self.model_id = model_id
        self.device = "cpu"
        self.context_length = min(context_length, gguf.context_train)
        self.scheduler = LlamaCppScheduler(
            gguf,
            max_batch_size=max_batch_size,
            context_length=self.context_length,
            threads=threads,
            adapters=adapters,
            kv_cache_type=kv_cache_type,
        )
        self.batcher = self.scheduler  # status and metrics read the scheduler's stats under this name
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()

    @property
    def max_batch_size(self) -> int:
        return self.scheduler.max_batch_size

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        *,
        max_batch_size: int = 16,
        context_length: int = DEFAULT_CONTEXT,
        threads: int = 0,
        adapters_cache: Path | None = None,
        converter_dir: Path | None = None,
        base_weights: Path | None = None,
        max_adapters: int = 8,
        kv_cache_type: str = "f16",
        cancel: threading.Event | None = None,
    ) -> LlamaCppBackend:
        """adapters_cache: where converted adapters are kept (None: no adapters); converter_dir: llama.cpp's
        conversion scripts; base_weights: the model's Hugging Face directory, which conversion reads;
        cancel: set, it calls off a load in progress (GgufLoadCancelled)."""
        gguf = GgufModel(path, cancel)
        adapters = None
        if adapters_cache is not None:
            from zoo.inference.llamacpp.lora import GgufAdapters

            adapters = GgufAdapters(gguf, adapters_cache, converter_dir, base_weights, max_adapters)
        return cls(
            gguf,
            model_id,
            max_batch_size=max_batch_size,
            context_length=context_length,
            threads=threads,
            adapters=adapters,
            kv_cache_type=kv_cache_type,
        )

    @property
    def renders_tools(self) -> bool:
        """Whether the GGUF's chat template renders tools itself, in the syntax inference.tools reads."""
        return native_tool_syntax(self.gguf.chat_template)

    def count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> int:
        return len(self.gguf.encode_chat(messages, tools))

    def count_text_tokens(self, text: str) -> int:
        return len(self.gguf.tokenize(text))

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, list):
            return prompt_token_ids(request.prompt, self.gguf.n_vocab)
        if request.prompt is not None:
            return self.gguf.tokenize(request.prompt)
        return self.gguf.encode_chat(request.messages, request.tools)

    def constraint(self, fmt: ResponseFormat) -> Any:
        """A grammar constraint for one request (ValidationError naming the schema's problem)."""
        from zoo.inference.structured import GrammarCache

        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCache(self.gguf.xgrammar_info(), self.gguf.n_vocab)
        return self._grammars.constraint(fmt)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt_ids = await asyncio.to_thread(self._prompt_ids, request)
        adapter = None
        if request.adapter is not None:
            if self.scheduler.adapters is None:
                raise AdapterLoadError("this llama.cpp backend was started without adapters")
            # Converted here, off the scheduler's thread (a first conversion takes seconds).
            adapter = await asyncio.to_thread(self.scheduler.adapters.converted, request.adapter)
        fmt = request.response_format
        constraint = await asyncio.to_thread(self.constraint, fmt) if fmt is not None else None
        submit = functools.partial(
            self.scheduler.submit, request, prompt_ids, constraint=constraint, adapter=adapter
        )
        async with contextlib.aclosing(relay(request, submit)) as chunks:  # closed with this stream
            async for chunk in chunks:
                yield chunk

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close)
        if self.scheduler.ctx is None:  # the model outlives a scheduler thread that did not stop
            self.gguf.close()
