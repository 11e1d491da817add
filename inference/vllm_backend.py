"""vLLM backend (GPU only, the `gpu` extra): vLLM's async engine in process. vLLM is imported only when
this backend is built, so nothing else in zoo-node needs it installed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from zoo.inference.backend_protocol import (
    BackendUnavailable,
    Chunk,
    GenerationRequest,
    GenerationResult,
    ResponseFormat,
)
from zoo.inference.model_loading import MODEL_LOADING


class VllmBackend:
    supports_logits_processors = True
    # Grammar-constrained JSON output (response_format) is enforced while decoding.
    constrains_json = True
    # Not wired to vLLM's SamplingParams(logprobs, prompt_logprobs) yet: refused by name (the engine).
    supports_logprobs = False
    supports_echo = False
    supports_tools = False

    def __init__(self, engine: Any, tokenizer: Any, model_id: str, context_length: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.context_length = context_length

    @classmethod
    def load(cls, path: Path, model_id: str, gpu_memory_utilization: float = 0.85) -> VllmBackend:
        with MODEL_LOADING:  # vLLM imports transformers too: see model_loading.py
            return cls._load(path, model_id, gpu_memory_utilization)

    @classmethod
    def _load(cls, path: Path, model_id: str, gpu_memory_utilization: float) -> VllmBackend:
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
        except ImportError as e:
            raise BackendUnavailable(
                "the vllm backend needs vLLM and a CUDA GPU: pip install 'zoo-node[gpu]'"
            ) from e
        from zoo.inference.factors import vllm_logits_processor_class

        # Expert factors reach vLLM's V1 engine as an engine-level logits processor class that reads each
        # request's bias from SamplingParams.extra_args (the per-request callable API is pre-V1).
        engine = AsyncLLMEngine.from_engine_args(
            AsyncEngineArgs(
                model=str(path),
                gpu_memory_utilization=gpu_memory_utilization,
                logits_processors=[vllm_logits_processor_class()],
            )
        )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        config_len = getattr(engine, "model_config", None)
        context = int(getattr(config_len, "max_model_len", 4096)) if config_len else 4096
        return cls(engine, tokenizer, model_id, context)

    def count_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        from vllm import SamplingParams

        from zoo.inference.factors import vllm_extra_args

        prompt = self.tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False
        )
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p if request.temperature > 0 else 1.0,
            seed=request.seed,
            stop=request.stop or None,
            extra_args=vllm_extra_args(request.logits_processor) if request.logits_processor else None,
            structured_outputs=_structured(request.response_format),
        )
        request_id = uuid.uuid4().hex
        sent = ""
        final: Any = None
        try:
            async for output in self.engine.generate(prompt, params, request_id):
                if request.cancel.is_set():
                    await self.engine.abort(request_id)
                    break
                final = output
                text = output.outputs[0].text
                if len(text) > len(sent):
                    yield Chunk(text[len(sent) :])
                    sent = text
        finally:
            request.cancel.set()
        completion = final.outputs[0] if final is not None else None
        yield Chunk(
            "",
            GenerationResult(
                sent,
                len(final.prompt_token_ids) if final is not None else 0,
                len(completion.token_ids) if completion is not None else 0,
                "cancelled" if completion is None else (completion.finish_reason or "stop"),
            ),
        )

    async def close(self) -> None:
        return None


def _structured(fmt: ResponseFormat | None) -> Any:
    """vLLM's own structured-output parameters (its xgrammar backend) for a response format."""
    if fmt is None:
        return None
    import json

    from vllm.sampling_params import StructuredOutputsParams

    if fmt.type == "json_schema":
        return StructuredOutputsParams(json=json.loads(fmt.schema))
    return StructuredOutputsParams(json_object=True)
