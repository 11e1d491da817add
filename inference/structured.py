"""Structured output for local models: JSON grammars compiled with xgrammar (what vLLM and SGLang use),
applied per request as a token mask before sampling, so the answer always parses and, for a schema,
validates. One grammar is compiled per distinct schema and cached; each request gets its own matcher.

The grammar emits compact JSON (no free whitespace): a small model that may pad with spaces or newlines
would otherwise spend its whole token budget on them.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from zoo.inference.backend_protocol import ResponseFormat
from zoo.registry import untrusted_json
from zoo.registry.errors import ValidationError

if TYPE_CHECKING:  # torch is imported by the model's loader; the API's schemas need only this module
    import torch

MAX_SCHEMA_CHARS = 64 * 1024
# Compiled grammars kept for reuse, by count and by their own reported size: a grammar carries token-mask
# tables for the whole vocabulary (about 6 MB for the bundled model's operations schema), and every distinct
# schema a client sends compiles a new one.
CACHE_ENTRIES = 64
CACHE_BYTES = 256 * 2**20


def parse_response_format(kind: str, schema: str, field: str = "response_format") -> ResponseFormat | None:
    """Validate a response format given as (type, schema JSON text); None for plain text."""
    if kind in ("", "text"):
        if schema:
            raise ValidationError(f"{field}.json_schema", "only allowed with type 'json_schema'")
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise ValidationError(
            f"{field}.type", f"must be 'text', 'json_object' or 'json_schema' (got {kind[:40]!r})"
        )
    if not schema:
        raise ValidationError(f"{field}.json_schema", "a JSON Schema is required with type 'json_schema'")
    if len(schema) > MAX_SCHEMA_CHARS:
        raise ValidationError(f"{field}.json_schema", f"at most {MAX_SCHEMA_CHARS} characters")
    try:
        parsed = untrusted_json.loads(schema)
    except json.JSONDecodeError as e:
        raise ValidationError(f"{field}.json_schema", f"is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValidationError(f"{field}.json_schema", "must be a JSON object (a JSON Schema)")
    return ResponseFormat("json_schema", json.dumps(parsed, sort_keys=True, separators=(",", ":")))


class JsonConstraint:
    """One request's grammar state: masks the logits to the tokens the grammar allows next."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask_logits(self, scores: torch.Tensor) -> torch.Tensor:
        """scores: 1-D float logits of the next token; returns them with disallowed tokens at -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = scores[None].contiguous()
        self._xgr.apply_token_bitmask_inplace(row, self.bitmask.to(row.device), vocab_size=self.vocab_size)
        return row[0]

    def mask_array(self, scores: np.ndarray) -> np.ndarray:
        """The same for numpy logits (the llama.cpp backend): disallowed tokens set to -inf in place."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        words = self.bitmask.numpy()[0].view(np.uint8)
        allowed = np.unpackbits(words, bitorder="little")[: len(scores)].astype(bool)
        scores[~allowed] = -np.inf
        return scores

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"token {token_id} violates the response format's grammar")

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


def hf_tokenizer_info(tokenizer: Any, vocab_size: int) -> Any:
    import xgrammar as xgr

    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)


class GrammarCache:
    """Compiles response formats for one tokenizer; the most recently used grammars are kept, within
    CACHE_ENTRIES and CACHE_BYTES. This is the only cache: xgrammar's own compiler cache has no bound by
    default and would keep every grammar ever compiled (a node fed a new schema per request grew without
    limit), so it is switched off."""

    def __init__(self, info: Any, vocab_size: int) -> None:
        """info: the model's vocabulary as an xgrammar TokenizerInfo (`hf_tokenizer_info` for a
        transformers tokenizer; the llama.cpp backend builds one from the GGUF)."""
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.bytes = 0  # the cached grammars' size, as xgrammar reports it
        self._lock = threading.Lock()

    def constraint(self, fmt: ResponseFormat) -> JsonConstraint:
        """A fresh constraint for one request (ValidationError when the schema cannot be compiled)."""
        return JsonConstraint(self.compile(fmt), self.vocab_size)

    def compile(self, fmt: ResponseFormat) -> Any:
        key = (fmt.type, fmt.schema)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
                return compiled
        schema = fmt.schema if fmt.type == "json_schema" else '{"type": "object"}'
        try:
            if fmt.type == "structural_tag":
                compiled = self._compiler.compile_structural_tag(fmt.schema)
            else:
                compiled = self._compiler.compile_json_schema(schema, any_whitespace=False)
        except Exception as e:  # xgrammar reports unsupported or malformed schemas as RuntimeError/ValueError
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            field = "tools" if fmt.type == "structural_tag" else "response_format.json_schema"
            raise ValidationError(field, f"cannot be used for constrained decoding: {reason}") from None
        with self._lock:
            if key not in self._compiled:  # two threads may compile the same schema at once
                self._compiled[key] = compiled
                self.bytes += compiled.memory_size_bytes
            while len(self._compiled) > 1 and (
                len(self._compiled) > CACHE_ENTRIES or self.bytes > CACHE_BYTES
            ):
                _, evicted = self._compiled.popitem(last=False)
                self.bytes -= evicted.memory_size_bytes
        return compiled

    def __len__(self) -> int:
        return len(self._compiled)
