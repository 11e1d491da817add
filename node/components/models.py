"""Which model the node serves: the local weights' directory (the bundled model, converted once into the
cache, unless model.path names one) and the id clients ask for it by."""

from __future__ import annotations

from pathlib import Path

from zoo.node.config import NodeConfig
from zoo.node.logs import get_logger

log = get_logger(__name__)


def resolve_model_path(cfg: NodeConfig) -> Path | None:
    """The weights' directory, None for a remote (openai) backend; ModelUnavailable when the bundled model
    cannot be prepared."""
    from zoo.inference.models import prepare_bundled_chat_model

    if cfg.model.backend == "openai":
        return None
    if cfg.model.path is not None:
        return cfg.model.path
    prepared = prepare_bundled_chat_model(cfg.cache_dir)  # ModelUnavailable: the message says why
    if prepared.converted:
        log.info("bundled model converted", path=str(prepared.path), seconds=round(prepared.seconds, 1))
    return prepared.path


def model_id(cfg: NodeConfig, path: Path | None) -> str:
    from zoo.inference.models import model_id_for

    if cfg.model.name:
        return cfg.model.name
    return model_id_for(path) if path is not None else "unknown"
