"""PEFT LoRA adapters (what GSPO and SFT jobs install) served on llama.cpp: each is converted once into a
GGUF LoRA by llama.cpp's own converter (`convert_lora_to_gguf.py`, kept by `./zoo setup` from the
llama-cpp-python source it builds), cached by the content hash of the adapter's files, and loaded into
the model on first use.

The conversion runs in a subprocess (it imports torch and transformers, which the serving process keeps
out) and needs the base model's Hugging Face directory (its config); the node gives the bundled model's
converted directory.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.inference.adapters import CONFIG_FILE, WEIGHTS_FILES, AdapterLoadError, AdapterRef
from zoo.inference.llamacpp.gguf import GgufModel
from zoo.inference.llamacpp.scheduler import BASE

CONVERTER = "convert_lora_to_gguf.py"


def adapter_digest(path: Path) -> str:
    """16 hex digits of the sha256 over the adapter's config and weights (what the conversion reads)."""
    h = hashlib.sha256()
    for name in (CONFIG_FILE, *WEIGHTS_FILES):
        f = path / name
        if f.is_file():
            h.update(name.encode() + b"\0")
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


@dataclass(eq=False)
class GgufAdapters:
    """The adapters loaded into one GGUF model, at most `limit` at once (the least recently used idle one
    is freed to make room)."""

    gguf: GgufModel
    cache_dir: Path
    converter_dir: Path | None
    base_weights: Path | None
    limit: int = 8
    # digest -> llama_adapter_lora handle
    _loaded: OrderedDict[str, Any] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _converting: dict[str, threading.Lock] = field(default_factory=dict, init=False, repr=False)

    def converted(self, ref: AdapterRef) -> tuple[str, Path]:
        """The adapter's key and GGUF file, converting it the first time (any thread; seconds). Only the
        file is made here: loading into the model happens on the scheduler's thread (`ensure`)."""
        key = adapter_digest(ref.path)
        target = self.cache_dir / f"{key}.gguf"
        with self._lock:
            lock = self._converting.setdefault(key, threading.Lock())
        with lock:  # one conversion per adapter at a time; others wait for its file
            if not target.is_file():
                self._convert(ref, target)
        return key, target

    def ensure(self, name: str, key: str, target: Path, in_use: frozenset[str]) -> None:
        """Load a converted adapter into the model (scheduler thread only: llama.cpp's model keeps its
        adapters in a set a decode step reads), freeing the least recently used idle ones beyond the
        limit; in_use: the keys running rows and the context decode with."""
        if key in self._loaded:
            self._loaded.move_to_end(key)
        else:
            handle = self.gguf.lib.llama_adapter_lora_init(self.gguf.model, str(target).encode())
            if not handle:
                raise AdapterLoadError(
                    f"adapter {name!r} does not load into {self.gguf.path.name} (another base model?)"
                )
            self._loaded[key] = handle
        idle = [k for k in self._loaded if k not in in_use and k != key]
        while len(self._loaded) > self.limit and idle:
            self.gguf.lib.llama_adapter_lora_free(self._loaded.pop(idle.pop(0)))

    def apply(self, ctx: Any, key: str) -> None:
        """Make the context decode with this adapter alone (BASE: none)."""
        lib = self.gguf.lib
        if key == BASE:
            rc = lib.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            handles = (type(self._loaded[key]) * 1)(self._loaded[key])
            rc = lib.llama_set_adapters_lora(ctx, handles, 1, (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise AdapterLoadError(f"llama.cpp could not set the adapter (code {rc})")

    def _convert(self, ref: AdapterRef, target: Path) -> None:
        script = self.converter_dir / CONVERTER if self.converter_dir is not None else None
        if script is None or not script.is_file():
            raise AdapterLoadError(
                f"adapter {ref.name!r} needs llama.cpp's {CONVERTER}, which `./zoo setup` keeps beside the "
                "llama-cpp-python build; run it again"
            )
        if self.base_weights is None:
            raise AdapterLoadError(
                f"adapter {ref.name!r}: converting a PEFT adapter for llama.cpp needs the base model's "
                "Hugging Face directory, and this node's GGUF has none here"
            )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".tmp-{os.getpid()}")
        cmd = [sys.executable, str(script), "--base", str(self.base_weights), "--outfile", str(partial)]
        cmd += ["--outtype", "f32", str(ref.path)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise AdapterLoadError(f"converting adapter {ref.name!r} to GGUF took over 600 s") from None
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise AdapterLoadError(f"adapter {ref.name!r} could not be converted to GGUF: {last}")
        os.replace(partial, target)  # whole or not at all
