"""What an answer's receipt hashes (node/provenance/receipts.py): the prompt as the model saw it and the
answer's text, as bytes anyone holding them can hash again.

- prompt: compact JSON, keys sorted, UTF-8, of {"messages": the conversation after retrieval (experiences
  in it), "prompt": a plain prompt as given (text or token ids; null for a conversation), "tools": the tools
  offered ([] for none)}.
- output: one answer's text as it is (UTF-8); several choices (n > 1) as a JSON list of their texts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def prompt_document(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None, prompt: Any = None
) -> bytes:
    document = {"messages": list(messages), "prompt": prompt, "tools": list(tools or [])}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def output_document(texts: Sequence[str]) -> bytes:
    if len(texts) == 1:
        return texts[0].encode()
    return json.dumps(list(texts), separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    """0x and the 64 hex digits of data's SHA-256."""
    return "0x" + hashlib.sha256(data).hexdigest()
