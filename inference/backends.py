"""Which generation backend a name means: the table of backends (name -> the import path of its class), and
`backend_class`, which imports only the one asked for, so that a llama.cpp node never imports torch or
transformers, nor an OpenAI-backed one llama.cpp. How a node's configuration becomes a backend's
arguments is the node's (zoo.node.components.backend_loading)."""

from __future__ import annotations

import importlib
from typing import Any

BACKENDS: dict[str, str] = {
    "llamacpp": "zoo.inference.llamacpp.llamacpp_backend:LlamaCppBackend",
    "transformers": "zoo.inference.transformers_backend:TransformersBackend",
    "vllm": "zoo.inference.vllm_backend:VllmBackend",
    "openai": "zoo.inference.openai_backend:OpenAIBackend",
}


def backend_class(name: str) -> Any:
    """The class of the backend `name` (a key of BACKENDS), its module imported now and not before."""
    try:
        path = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}: one of {', '.join(BACKENDS)}") from None
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
