"""A GGUF model opened through llama.cpp (llama-cpp-python's C bindings): its weights, vocabulary, chat
template and tokenizer, with nothing of torch or transformers.

Prompts are rendered with the GGUF's own chat template by jinja2, the way transformers'
`apply_chat_template` renders them (same environment options, `raise_exception`, generation prompt), then
tokenized without adding special tokens and with special tokens parsed: the token ids equal the
transformers backend's for the same messages (a test holds this for the bundled model).
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
from functools import cached_property
from pathlib import Path
from typing import Any

from zoo.registry.errors import ZooError

logger = logging.getLogger(__name__)

_init_lock = threading.Lock()
_initialised = False
_log_callback: Any = None  # kept referenced: llama.cpp calls it from C for as long as the process lives


class GgufLoadError(ZooError, RuntimeError):
    """The GGUF file could not be opened as a model by llama.cpp."""


class GgufLoadCancelled(GgufLoadError):
    """The load was called off (the node is stopping) before it finished."""


def llama() -> Any:
    """llama.cpp's C API (llama_cpp.llama_cpp), initialised once, its log routed to Python logging."""
    global _initialised, _log_callback
    import llama_cpp.llama_cpp as lib

    with _init_lock:
        if not _initialised:
            lib.llama_backend_init()

            def forward(level: int, text: bytes, _user: Any) -> None:
                # GGML_LOG_LEVEL: 3 = warning, 4 = error; model-loading chatter (info, debug) is dropped.
                if level in (3, 4) and text and text.strip():
                    severity = logging.ERROR if level == 4 else logging.WARNING
                    logger.log(severity, "llama.cpp: %s", text.decode(errors="replace").strip())

            _log_callback = lib.llama_log_callback(forward)
            lib.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _initialised = True
    return lib


class GgufModel:
    """Loaded weights and vocabulary; contexts (KV caches) are made from it by the scheduler."""

    def __init__(self, path: Path, cancel: threading.Event | None = None) -> None:
        """cancel: once set, a load in progress stops at its next progress report (GgufLoadCancelled):
        a node asked to stop does not wait for, nor exit under, a load still running in C."""
        lib = llama()
        self.lib = lib
        self.path = path
        if not path.is_file():
            raise GgufLoadError(f"{path} does not exist or is not a file")
        params = lib.llama_model_default_params()
        if cancel is not None:
            go_on = lib.llama_progress_callback(lambda _progress, _user: not cancel.is_set())
            params.progress_callback = go_on  # referenced by `go_on` until the load returns
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model and cancel is not None and cancel.is_set():
            raise GgufLoadCancelled(f"loading {path} was called off")
        if not self.model:
            raise GgufLoadError(f"llama.cpp could not load {path} as a GGUF model")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.context_train = int(lib.llama_model_n_ctx_train(self.model))
        self.eos_ids = {i for i in range(self.n_vocab) if lib.llama_vocab_is_eog(self.vocab, i)}
        self._pieces: list[bytes] = [self._piece(i) for i in range(self.n_vocab)]
        template = lib.llama_model_chat_template(self.model, None)
        if not template:
            raise GgufLoadError(f"{path} carries no chat template (tokenizer.chat_template)")
        self.chat_template = template.decode()

    def meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(512)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else ""

    def token_text(self, token: int) -> str:
        """The token as the vocabulary stores it (byte-level BPE: 'Ġthe' for ' the')."""
        return self.lib.llama_vocab_get_text(self.vocab, token).decode(errors="replace")

    def token_bytes(self, token: int) -> bytes:
        """The token's bytes as text (a control token, which renders as nothing, as its name)."""
        return self._pieces[token] or self.token_text(token).encode()

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[: max(n, 0)]

    # -- tokenizer ------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        capacity = len(data) + 16
        buf = (self.lib.llama_token * capacity)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, capacity, False, True)
        if n < 0:  # cannot happen with a token per byte and then some, but the C API reports it so
            raise ValueError(f"tokenizing needs {-n} tokens, more than {capacity}")
        return list(buf[:n])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids; control tokens (the chat markup) are never rendered, as transformers'
        `decode(..., skip_special_tokens=True)` does."""
        return b"".join(self._pieces[i] for i in ids).decode("utf-8", errors="replace")

    @cached_property
    def _template(self) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:  # fmt: skip
            # transformers' filter (jinja's own escapes HTML, which tool schemas must not be).
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)  # fmt: skip

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = tojson
        return env.from_string(self.chat_template)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt of a conversation; `tools` (OpenAI function tools) go to a template that takes them."""
        bos = self.lib.llama_vocab_bos(self.vocab)
        eos = self.lib.llama_vocab_eos(self.vocab)
        return str(
            self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=True,
                bos_token=self.token_text(bos) if bos >= 0 else "",
                eos_token=self.token_text(eos) if eos >= 0 else "",
            )
        )

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return self.tokenize(self.render(messages, tools))

    def xgrammar_info(self) -> Any:
        """The vocabulary as xgrammar's TokenizerInfo (for grammar-constrained decoding)."""
        import xgrammar as xgr

        kind = self.meta("tokenizer.ggml.model")
        vocab_type = {"gpt2": xgr.VocabType.BYTE_LEVEL, "llama": xgr.VocabType.BYTE_FALLBACK}.get(
            kind, xgr.VocabType.RAW
        )
        return xgr.TokenizerInfo(
            [self.token_text(i) for i in range(self.n_vocab)],
            vocab_type=vocab_type,
            vocab_size=self.n_vocab,
            stop_token_ids=sorted(self.eos_ids),
            add_prefix_space=kind == "llama",
        )

    # -- what expert factors need of a tokenizer (inference.factors.processor_builder) ------------------

    @property
    def name_or_path(self) -> str:
        return str(self.path)

    @cached_property
    def all_special_ids(self) -> list[int]:
        """Control tokens (the chat markup): those with no text of their own."""
        return [i for i, piece in enumerate(self._pieces) if not piece]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        """Tokenize as a transformers tokenizer is called (TF-GRPO's factor distillation does)."""
        return {"input_ids": self.tokenize(text)}

    def get_vocab(self) -> dict[str, int]:
        return {self.token_text(i): i for i in range(self.n_vocab)}

    def __len__(self) -> int:
        return self.n_vocab

    def close(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None
