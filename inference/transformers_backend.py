"""Transformers backend: a local Hugging Face causal LM (the bundled SmolLM2 by default) on CPU or GPU.

Generation goes through the continuous batcher (transformers_scheduler.py): concurrent requests share each
decode step's forward pass, and text reaches the caller's event loop as it is produced. Each request samples
with its own seeded generator, so seeded output does not depend on what else is running.

Proofs of inference: an answer that asks for one is committed to with the states of its prompt's prefill
and of one pass of its tokens over the prompt's cache (transformers_scheduler.py, "Proofs"), and `recompute`
runs the same two passes for a verifier, on the batcher's thread. Same kernels, same numbers: the states
match bit for bit, so the thresholds leave room for nothing else, and a proof names its kernels (`kernels`)
for a verifier to match.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from zoo.inference.local_backend import LocalBackend
from zoo.inference.model_loading import MODEL_LOADING
from zoo.inference.provenance.toploc import SAME_KERNELS
from zoo.inference.structured import hf_tokenizer_info
from zoo.inference.transformers_scheduler import ContinuousBatcher

BF16_UNITS = ("avx512_bf16", "amx_bf16")
# A proof of at most this many new tokens (answer_proof): the prover's prefill is the verifier's, so no
# drift grows with length (./zoo bench provenance --backend transformers measures 256).
MAX_PROVEN_TOKENS = 256


def _cpu_bf16_units() -> list[str]:
    """The CPU's bf16 arithmetic units (AVX512-BF16, AMX) its flags name; unknown counts as none."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return [f for f in BF16_UNITS if f in flags]


def _cpu_computes_bf16() -> bool:
    return bool(_cpu_bf16_units())


def kernels(model: Any, device: str) -> str:
    """What computes a proof's states here: the transformers and torch releases, the weights' dtype, and
    the device with the kernels it picks (on a CPU, ATen's vector capability, the bf16 units oneDNN uses
    and any cap on its instruction set). A verifier checks only proofs made by the same."""
    from importlib.metadata import version

    import torch

    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    if device.startswith("cuda"):
        where = f"{device} {torch.cuda.get_device_name(device)}"
    else:
        where = f"{device} {torch.backends.cpu.get_cpu_capability()}"
        if dtype == "bfloat16":
            where += "".join(f" {unit}" for unit in _cpu_bf16_units())
        if os.environ.get("ONEDNN_MAX_CPU_ISA"):
            where += f" oneDNN<={os.environ['ONEDNN_MAX_CPU_ISA']}"
    return f"transformers {version('transformers')}; torch {torch.__version__}; {dtype}; {where}"


def resolve_dtype(dtype: str, device: str) -> str:
    """The weight dtype a model loads in. `auto`: bfloat16 on a GPU that computes it (else float16), and
    on a CPU bfloat16 only where it has bf16 units: on an AVX2-only CPU a bf16 matmul runs about 6x
    slower than float32 (measured on this project's 2-core machines), which made a 282-token prefill of
    the 135M model take 8 s instead of under one."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if device == "cpu" and _cpu_computes_bf16() else "float32"


class TransformersBackend(LocalBackend):
    supports_proofs = True  # answers carry TOPLOC proofs, and proofs of these weights are verified here
    proof_thresholds = SAME_KERNELS
    max_proven_tokens = MAX_PROVEN_TOKENS

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_id: str,
        device: str = "cpu",
        max_batch_size: int = 16,
        max_adapters: int = 8,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = device
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(model.config.vocab_size)
        self._info: Any = None
        self._info_lock = threading.Lock()
        self._decoded: list[bytes] | None = None
        self.scheduler = ContinuousBatcher(
            model,
            tokenizer,
            device=device,
            max_batch_size=max_batch_size,
            context_length=self.context_length,
            max_adapters=max_adapters,
            token_bytes=self.token_bytes,
        )
        self.proof_kernels = kernels(model, device)  # what a proof made here names, and one checked here must

    async def recompute(self, ids: list[int], first: int) -> tuple[Any, Any]:
        """(last hidden states, logits) at positions first .. len(ids) - 1 of `ids` (`first`: the prompt's
        last), computed on the batcher's thread as its prover did: what a proof of an answer given by these
        weights is checked against."""
        return await asyncio.wrap_future(self.scheduler.call(lambda: self.scheduler.head_inputs(ids, first)))

    def _grammar_vocabulary(self) -> Any:
        """Built once: grammars and token bytes use it."""
        with self._info_lock:
            if self._info is None:
                self._info = hf_tokenizer_info(self.tokenizer, self.vocab_size)
            return self._info

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes (xgrammar decodes byte-level and byte-fallback vocabularies alike); a special
        token as its name."""
        if self._decoded is None:
            self._decoded = list(self._grammar_vocabulary().decoded_vocab)
        data = self._decoded[token] if token < len(self._decoded) else b""
        return data or str(self.tokenizer.convert_ids_to_tokens(token)).encode()

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int = 16,
        max_adapters: int = 8,
    ) -> TransformersBackend:
        with MODEL_LOADING:
            import torch
            import xgrammar  # noqa: F401  (imports transformers names too)

            # Besides what loading needs, resolve here, under the lock, the names the batcher thread
            # imports later, so that no first lookup of a transformers name races another model's load.
            from transformers import (  # noqa: F401
                AttentionInterface,
                AttentionMaskInterface,
                AutoModelForCausalLM,
                AutoTokenizer,
                DynamicCache,
            )
            from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: F401
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: F401

            import zoo.inference.factors  # noqa: F401

            tokenizer = AutoTokenizer.from_pretrained(path)
            model = (
                AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, resolve_dtype(dtype, device)))
                .to(device)
                .eval()
            )
            return cls(model, tokenizer, model_id, device, max_batch_size, max_adapters)

    def _chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, return_dict=True
        )
        return list(encoded["input_ids"])

    def _chat_template(self) -> str:
        return str(getattr(self.tokenizer, "chat_template", "") or "")

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close)
