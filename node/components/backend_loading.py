"""The generation backend a node's model config asks for: the config's settings as that backend's arguments
(which class a backend name means, imported only when asked for: zoo.inference.backends)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from zoo.inference.backends import backend_class
from zoo.node.config import ModelConfig


def load_backend(
    cfg: ModelConfig,
    path: Path | None,
    model_id: str,
    max_batch_size: int = 16,
    cache_dir: Path | None = None,
    cancel: threading.Event | None = None,
) -> Any:
    """The generation backend the model config asks for (blocking: loads weights for local backends).

    max_batch_size: requests decoded together (local backends) or sent to the server at once (openai).
    cache_dir: where the llamacpp backend keeps the GGUF conversions of LoRA adapters.
    cancel: set, it calls off a llama.cpp load in progress (other backends finish theirs)."""
    if cfg.backend == "openai":
        import os

        return backend_class("openai")(
            str(cfg.base_url),
            str(cfg.name),
            os.environ.get(cfg.api_key_env),
            cfg.context_length or 8192,
            max_concurrency=max_batch_size,
        )
    assert path is not None
    if cfg.backend == "llamacpp":
        return _llamacpp(cfg, path, model_id, max_batch_size, cache_dir, cancel)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
    if cfg.backend == "vllm":
        return backend_class("vllm").load(path, model_id)
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return backend_class("transformers").load(
        path, model_id, cfg.device, cfg.dtype, max_batch_size, max_adapters=cfg.max_loaded_adapters
    )


def _llamacpp(
    cfg: ModelConfig,
    path: Path,
    model_id: str,
    max_batch_size: int,
    cache_dir: Path | None,
    cancel: threading.Event | None,
) -> Any:
    from zoo.inference.llamacpp.llamacpp_backend import DEFAULT_CONTEXT

    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a GGUF file")
    converter, base = None, None
    if cache_dir is not None:
        from importlib.metadata import version

        from zoo.inference.bundled_models import bundled_chat_model_dir
        from zoo.node.config import default_cache_dir

        # `./zoo setup` keeps the converter under the default cache dir (or ZOO_NODE_CACHE_DIR).
        sources = Path("llama.cpp") / version("llama_cpp_python")
        converter = next(
            (d / sources for d in (cache_dir, default_cache_dir()) if (d / sources).is_dir()),
            cache_dir / sources,
        )
        base = bundled_chat_model_dir(cache_dir) if cfg.path is None else None
    return backend_class("llamacpp").load(
        path,
        model_id,
        max_batch_size=max_batch_size,
        context_length=cfg.context_length or DEFAULT_CONTEXT,
        threads=cfg.threads,
        adapters_cache=cache_dir / "gguf-adapters" if cache_dir is not None else None,
        converter_dir=converter,
        base_weights=base,
        max_adapters=cfg.max_loaded_adapters,
        kv_cache_type=cfg.kv_cache_type,
        cancel=cancel,
    )
