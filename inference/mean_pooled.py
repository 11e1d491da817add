"""A sentence-transformers model of the common layout (a transformer, mean pooling over its tokens, and
optionally normalisation) run with transformers alone.

Why by hand: importing sentence-transformers costs seconds on top of transformers (about 4 s of a
2-CPU node's start-up, for its backends, quantisation and training modules), and the node needs none
of it to embed with a model of this layout: tokenise (texts stripped, truncated at the model's
max_seq_length), run the encoder, average the token vectors the attention mask covers. A model of any
other layout (CLS or max pooling, dense layers, lower-casing, several inputs) is loaded through
sentence-transformers as before. The tests hold the two to the same vectors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


def mean_pooled_layout(path: Path) -> dict[str, Any] | None:
    """The settings of a model directory in the layout this module runs, or None for any other."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        kinds = [m["type"] for m in modules]
        if kinds not in ([_TRANSFORMER, _POOLING], [_TRANSFORMER, _POOLING, _NORMALIZE]):
            return None
        if modules[0].get("path", "") != "":
            return None
        bert = json.loads((path / "sentence_bert_config.json").read_text())
        pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}
    if (
        modes != {"pooling_mode_mean_tokens"}
        or bert.get("do_lower_case")
        or set(bert)
        - {
            "max_seq_length",
            "do_lower_case",
        }
    ):
        return None
    max_len = bert.get("max_seq_length")
    if not isinstance(max_len, int) or max_len < 1:
        return None
    return {"max_seq_length": max_len, "dim": int(pooling["word_embedding_dimension"])}


class MeanPooledEncoder:
    """encode(texts, batch_size) -> float32 array, as SentenceTransformer.encode gives it (before any
    normalisation, which the embedder does for every model alike)."""

    def __init__(self, path: Path, device: str, layout: dict[str, Any]) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.max_seq_length = int(layout["max_seq_length"])
        self.dim = int(layout["dim"])
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
        hidden = int(self.model.config.hidden_size)
        if hidden != self.dim:
            raise ValueError(f"the pooling config says {self.dim} dimensions, the model has {hidden}")

    def encode(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Longest first, as sentence-transformers batches: similar lengths pad least.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                batch = self.tokenizer(
                    [texts[i].strip() for i in rows],
                    padding=True,
                    truncation="longest_first",
                    max_length=self.max_seq_length,
                    return_tensors="pt",
                ).to(self.device)
                tokens = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out[rows] = pooled.float().cpu().numpy()
        return out
