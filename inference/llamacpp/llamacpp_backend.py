"""The llama.cpp backend: a GGUF model (the bundled SmolLM2 by default) served in process through
llama-cpp-python, with continuous batching (scheduler.py), grammar-constrained JSON, expert factors and
LoRA adapters, behind the same Backend interface as the transformers backend.

Nothing on its path to a first answer imports torch or transformers: those come in only with the first
request that needs them (a JSON response format: xgrammar imports torch; expert factors; converting a
PEFT adapter to GGUF).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, TypedDict, Unpack

from zoo.inference.adapters import AdapterLoadError
from zoo.inference.backend_protocol import GenerationRequest
from zoo.inference.llamacpp.gguf import GgufModel
from zoo.inference.llamacpp.prefill import Prefill, kernels
from zoo.inference.llamacpp.scheduler import LlamaCppScheduler
from zoo.inference.local_backend import LocalBackend
from zoo.inference.provenance.answer_proof import MAX_PROVEN_TOKENS
from zoo.inference.provenance.toploc import SAME_KERNELS

DEFAULT_CONTEXT = 2048  # tokens of KV cache per concurrent request unless model.context_length says


class ContextSettings(TypedDict, total=False):
    """The llama.cpp context's settings, as LlamaCppBackend's constructor takes them."""

    max_batch_size: int
    context_length: int
    threads: int
    kv_cache_type: str


class LlamaCppBackend(LocalBackend):
    supports_proofs = True  # answers carry TOPLOC proofs, and proofs of these weights are verified here
    proof_thresholds = SAME_KERNELS
    max_proven_tokens = MAX_PROVEN_TOKENS

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
        super().__init__()
        self.gguf = gguf
        self.tokenizer = gguf  # what expert factors read: the vocabulary (inference.factors)
        self.model_id = model_id
        self.device = "cpu"
        self.context_length = min(context_length, gguf.context_train)
        self.vocab_size = gguf.n_vocab
        self.scheduler = LlamaCppScheduler(
            gguf,
            max_batch_size=max_batch_size,
            context_length=self.context_length,
            threads=threads,
            adapters=adapters,
            kv_cache_type=kv_cache_type,
        )
        self.threads = threads
        self._prefill: Prefill | None = None
        self.proof_kernels = kernels()  # what a proof made here names, and what one checked here must

    async def recompute(self, ids: list[int], first: int) -> tuple[Any, Any]:
        """(last hidden states, logits) at positions first .. len(ids) - 1 of `ids`, in one prefill: what a
        proof of an answer given by these weights is checked against."""
        return await asyncio.to_thread(self._recompute, ids, first)

    def _recompute(self, ids: list[int], first: int) -> tuple[Any, Any]:
        if self._prefill is None:
            self._prefill = Prefill(self.gguf, self.context_length, threads=self.threads)
        with self._prefill.lock:
            return self._prefill.run(ids, first)

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        *,
        adapters_cache: Path | None = None,
        converter_dir: Path | None = None,
        base_weights: Path | None = None,
        max_adapters: int = 8,
        cancel: threading.Event | None = None,
        **settings: Unpack[ContextSettings],
    ) -> LlamaCppBackend:
        """adapters_cache: where converted adapters are kept (None: no adapters); converter_dir: llama.cpp's
        conversion scripts; base_weights: the model's Hugging Face directory, which conversion reads;
        cancel: set, it calls off a load in progress (GgufLoadCancelled); settings: the context's."""
        gguf = GgufModel(path, cancel)
        adapters = None
        if adapters_cache is not None:
            from zoo.inference.llamacpp.lora import GgufAdapters

            adapters = GgufAdapters(gguf, adapters_cache, converter_dir, base_weights, max_adapters)
        return cls(gguf, model_id, adapters=adapters, **settings)

    def _chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.gguf.encode_chat(messages, tools)

    def _chat_template(self) -> str:
        return self.gguf.chat_template

    def _tokenize(self, text: str) -> list[int]:
        return self.gguf.tokenize(text)

    def _grammar_vocabulary(self) -> Any:
        return self.gguf.xgrammar_info()

    async def _submit_options(self, request: GenerationRequest) -> dict[str, Any]:
        if request.adapter is None:
            return {}
        if self.scheduler.adapters is None:
            raise AdapterLoadError("this llama.cpp backend was started without adapters")
        # Converted here, off the scheduler's thread (a first conversion takes seconds).
        return {"adapter": await asyncio.to_thread(self.scheduler.adapters.converted, request.adapter)}

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close)
        if self._prefill is not None:
            with self._prefill.lock:
                self._prefill.close()
        if self.scheduler.ctx is None:  # the model outlives a scheduler thread that did not stop
            self.gguf.close()
