"""Which model the node serves: the local model (a GGUF file for llama.cpp, a weights directory for
transformers and vLLM; the bundled model unless model.path names one), the weights LoRA jobs train on,
and the id clients ask for it by."""

from __future__ import annotations

from pathlib import Path

from zoo.node.config import NodeConfig
from zoo.node.logs import get_logger

log = get_logger(__name__)


def resolve_model_path(cfg: NodeConfig) -> Path | None:
    """What the backend loads: a GGUF file (llamacpp) or a weights directory; None for a remote (openai)
    backend or a light node (none). ModelUnavailable when the bundled model cannot be found or prepared."""
    from zoo.inference.bundled_models import bundled_gguf

    if cfg.model.backend in ("openai", "none"):
        return None
    if cfg.model.path is not None:
        return cfg.model.path
    if cfg.model.backend == "llamacpp":
        return bundled_gguf()  # served as shipped: nothing to convert
    return training_weights(cfg)


def training_weights(cfg: NodeConfig) -> Path:
    """The Hugging Face weights directory LoRA jobs (GSPO, SFT) train on: model.path for transformers, the
    bundled model converted once into the cache otherwise. ModelUnavailable for a GGUF of one's own,
    which has no such weights here."""
    from zoo.inference.bundled_models import ModelUnavailable, prepare_bundled_chat_model

    if cfg.model.path is not None:
        if cfg.model.backend == "transformers":
            return cfg.model.path
        raise ModelUnavailable(
            f"LoRA training needs Hugging Face weights; {cfg.model.path} is served by {cfg.model.backend} "
            "(train with model.backend = 'transformers' and model.path = its weights directory)"
        )
    prepared = prepare_bundled_chat_model(cfg.cache_dir)  # ModelUnavailable: the message says why
    if prepared.converted:
        log.info("bundled model converted", path=str(prepared.path), seconds=round(prepared.seconds, 1))
    return prepared.path


def trains_lora(cfg: NodeConfig) -> bool:
    """Whether this node can run LoRA jobs: it has Hugging Face weights to train (training_weights)."""
    return cfg.model.backend == "transformers" or (cfg.model.backend == "llamacpp" and cfg.model.path is None)


def model_id(cfg: NodeConfig, path: Path | None) -> str:
    """The id clients ask for the served model by; "" on a light node, which serves none."""
    from zoo.inference.bundled_models import BUNDLED_CHAT_MODEL_ID, bundled_gguf, model_id_for

    if cfg.light:
        return ""
    if cfg.model.name:
        return cfg.model.name
    if path is None:
        return "unknown"
    if path.suffix.lower() == ".gguf":
        return BUNDLED_CHAT_MODEL_ID if cfg.model.path is None and path == bundled_gguf() else path.stem
    return model_id_for(path)
