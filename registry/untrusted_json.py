"""JSON from outside the node (request bodies, tool arguments and schemas, peer messages) parsed with its
nesting bounded.

The standard decoder recurses once per level and raises RecursionError (not a decoding error) beyond the
interpreter's limit, which escaped the handlers that catch bad JSON and became a 500; a value nested a few
hundred levels below that limit could still exhaust the stack of whatever walks it next (validation,
re-encoding, a schema compiler). `loads` refuses both as a `json.JSONDecodeError`, the error every caller
already turns into a clear refusal. Depth is counted on the parsed value with an explicit stack: no
scanner of our own.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects: far beyond any request, schema or message the node takes


def depth(value: Any) -> int:
    """How many arrays and objects are nested in `value` at its deepest (0 for a scalar)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads(text: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads, refusing (json.JSONDecodeError) a value nested deeper than `max_depth` levels."""
    try:
        value = json.loads(text)
        too_deep = depth(value) > max_depth
    except RecursionError:
        too_deep = True
    if too_deep:
        doc = text if isinstance(text, str) else bytes(text[:200]).decode("utf-8", errors="replace")
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", doc, 0) from None
    return value
