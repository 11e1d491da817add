"""Transformers backend: a local Hugging Face causal LM (the bundled SmolLM2 by default) on CPU or GPU.

Generation runs in a worker thread; tokens reach the event loop through a streamer that hands each
finalised piece of text to the loop. One generation runs at a time per model: on CPU a second
concurrent generate only splits the same cores, and it keeps seeded sampling reproducible (torch's
RNG is global to the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from zoo.inference.backend import BackendError, Chunk, GenerationRequest, GenerationResult, apply_stop
from zoo.inference.model_loading import MODEL_LOADING

_END = object()


class TransformersBackend:
    supports_logits_processors = True

    def __init__(self, model: Any, tokenizer: Any, model_id: str, device: str = "cpu") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = device
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls, path: Path, model_id: str, device: str = "cpu", dtype: str = "bfloat16"
    ) -> TransformersBackend:
        with MODEL_LOADING:
            import torch

            # Besides what loading needs, resolve here, under the lock, the names generation threads
            # import later, so that no first lookup of a transformers name races another model's load.
            from transformers import (  # noqa: F401
                AutoModelForCausalLM,
                AutoTokenizer,
                LogitsProcessorList,
                StoppingCriteria,
                StoppingCriteriaList,
                TextStreamer,
            )

            import zoo.inference.factors  # noqa: F401

            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        return cls(model, tokenizer, model_id, device)

    def _encode(self, messages: list[dict[str, str]]) -> Any:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )

    def count_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return int(self._encode(messages)["input_ids"].shape[1])

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        thread = threading.Thread(target=self._run, args=(request, loop, queue), name="generate", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise BackendError(f"generation failed: {type(item).__name__}: {item}") from item
                yield item
        finally:
            # Reached on completion, on error and when the consumer goes away (client cancel, deadline).
            request.cancel.set()

    def _run(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]
    ) -> None:
        def put(item: Any) -> None:
            # The consumer may be gone (its loop closed after a cancel); nothing is left to tell then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        try:
            with self._lock:
                put(self._generate(request, put))
        except BaseException as e:
            put(e)
        finally:
            put(_END)

    def _generate(self, request: GenerationRequest, put: Any) -> Chunk:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, TextStreamer

        inputs = self._encode(request.messages).to(self.device)
        prompt_len = int(inputs["input_ids"].shape[1])
        emitted: list[str] = []
        stop = request.stop

        class _Streamer(TextStreamer):
            # Emits text only up to a stop string; decoding is TextStreamer's (word-boundary safe).
            def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                if not text:
                    return
                seen = "".join(emitted)
                kept, hit = apply_stop(seen + text, stop)
                delta = kept[len(seen) :]
                if delta:
                    emitted.append(delta)
                    put(Chunk(delta))
                if hit:
                    request.cancel.set()

        class _Cancel(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), request.cancel.is_set(), dtype=torch.bool)

        sampling: dict[str, Any] = {"do_sample": False}
        if request.temperature > 0:
            sampling = {
                "do_sample": True,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "top_k": 0,
            }
            torch.manual_seed(request.seed)
        processors = LogitsProcessorList([request.logits_processor] if request.logits_processor else [])
        with torch.inference_mode():
            out = self.model.generate(
                **inputs,
                max_new_tokens=request.max_tokens,
                streamer=_Streamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True),
                stopping_criteria=StoppingCriteriaList([_Cancel()]),
                logits_processor=processors,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **sampling,
            )
        new_ids = out[0][prompt_len:]
        text = "".join(emitted)
        full, hit = apply_stop(self.tokenizer.decode(new_ids, skip_special_tokens=True), stop)
        if full != text:  # the streamer holds back an unfinished word until the end; emit what is left
            put(Chunk(full[len(text) :]))
            text = full
        ended_on_eos = len(new_ids) > 0 and int(new_ids[-1]) == self.tokenizer.eos_token_id
        if hit or ended_on_eos:
            reason = "stop"
        elif request.cancel.is_set():
            reason = "cancelled"
        elif len(new_ids) >= request.max_tokens:
            reason = "length"
        else:
            reason = "stop"
        return Chunk("", GenerationResult(text, prompt_len, len(new_ids), reason))

    async def close(self) -> None:
        return None
