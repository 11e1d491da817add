"""Sentence embedders for experience retrieval: the `Embedder` protocol and its sentence-transformers
implementation (the bundled all-MiniLM-L6-v2 unless another model directory is configured).

Every embedder returns float32 rows of unit length, so a dot product is the cosine similarity that
retrieval ranks by. Its `name` identifies the model *content* (directory name plus a hash of the files
that define it), so caches keyed by name (embedding_cache.py) never mix vectors of two models, even when
a directory is replaced in place by a different model of the same name.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zoo.inference.bundled_models import ModelUnavailable, bundled_embedder_dir
from zoo.inference.mean_pooled import MeanPooledEncoder, mean_pooled_layout
from zoo.inference.model_loading import MODEL_LOADING

# Files that document a model but do not change what it computes; hashing them would only force
# a needless re-embedding of every experience when a README is edited.
_NOT_MODEL_FILES = {"README.md", ".gitattributes"}


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors of a fixed dimension."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A (len(texts), dim) float32 array whose rows have unit L2 norm."""
        ...


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, as a C-contiguous float32 array; an all-zero row is an error.

    A zero vector has no direction, so it has no cosine similarity to anything; silently keeping it
    would make it score 0 against every query instead of failing where the bad vector came from.
    """
    out = np.array(vectors, dtype=np.float32, copy=True, order="C")
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    if out.size and (not np.all(np.isfinite(norms)) or np.any(norms == 0)):
        raise ValueError("cannot normalise a zero or non-finite vector")
    out /= norms
    return out


def model_fingerprint(path: Path) -> str:
    """First 12 hex digits of sha256 over every model-defining file's relative path and bytes.

    The weights are hashed too (about 0.1 s for MiniLM's 90 MB): two fine-tunes of one base share
    every config file, and a cache keyed by config alone would hand one model the other's vectors.
    """
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in _NOT_MODEL_FILES)
    for file in files:
        rel = file.relative_to(path).as_posix()
        digest.update(rel.encode() + b"\x00" + str(file.stat().st_size).encode() + b"\x00")
        with file.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:12]


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory (no network, ever); one of the
    common mean-pooled layout runs on transformers alone (see mean_pooled.py).

    `path` None means the bundled all-MiniLM-L6-v2 (384 dimensions). Calls to embed() are serialised
    by a lock: the daemon embeds queries from many request threads and library updates from a worker
    thread, and one torch model is not safe to drive from several threads at once.
    """

    def __init__(self, path: Path | None = None, device: str = "cpu", batch_size: int = 64) -> None:
        # Set before sentence-transformers (and with it huggingface_hub) is imported: a model given by
        # directory must never trigger a hub lookup.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.path = Path(path) if path is not None else bundled_embedder_dir()
        if not self.path.is_dir():
            raise ModelUnavailable(f"embedding model directory {self.path} does not exist")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        # The bundled model lives in a folder called just "model"; its package folder says which one.
        label = self.path.parent.name if self.path.name == "model" else self.path.name
        self.name = f"{label}-{model_fingerprint(self.path)}"
        layout = mean_pooled_layout(self.path)
        try:
            with MODEL_LOADING:
                if layout is not None:  # the common layout, without importing sentence-transformers
                    self._encoder: Any = MeanPooledEncoder(self.path, device, layout)
                    dim: int | None = self._encoder.dim
                else:
                    from sentence_transformers import SentenceTransformer

                    self._model = SentenceTransformer(str(self.path), device=device, local_files_only=True)
                    self._encoder = None
                    dim = self._model.get_embedding_dimension()
        except (OSError, ValueError) as e:
            raise ModelUnavailable(f"cannot load the embedding model at {self.path}: {e}") from e
        if not dim:
            raise ModelUnavailable(f"the model at {self.path} does not declare an embedding dimension")
        self.dim = int(dim)
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):  # a lone string is a Sequence[str] too, of its characters
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            if self._encoder is not None:
                vectors = self._encoder.encode(list(texts), self.batch_size)
            else:
                vectors = self._model.encode(
                    list(texts),
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                    normalize_embeddings=False,  # normalised below in float32, one code path for all
                )
        return normalise_rows(vectors)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(name={self.name!r}, dim={self.dim})"
