"""Named LoRA adapters served beside the base model.

An adapter is a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) under the
node's adapters directory, named by its folder: `adapters/<name>/`. A GSPO job installs its result
there; an operator may copy one in. `AdapterDirectory` finds and validates them by name;
`LoadedAdapters` loads them into the running model on first use, in the batcher's thread, and lets one
forward pass mix rows of different adapters (PEFT's mixed-adapter batches), so a request with an
adapter batches with requests without one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.registry.errors import NotFound, ValidationError, ZooError

log = logging.getLogger(__name__)

ADAPTER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# Written beside them by zoo-node's trainers: what the adapter was trained from (kind, base model, and for
# a distilled one the library's root), so a node can say which library an adapter carries.
PROVENANCE_FILE = "zoo_adapter.json"
BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch
PLACEHOLDER = "zoo_placeholder"


@dataclass(frozen=True)
class AdapterRef:
    """An adapter found on disk; `stamp` changes when its weights are replaced."""

    name: str
    path: Path
    stamp: tuple[int, ...]


def check_adapter_name(name: str, field: str = "adapter") -> None:
    if not ADAPTER_NAME_RE.fullmatch(name):
        raise ValidationError(
            field,
            "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(got {name[:80]!r})",
        )


def _weights(path: Path) -> Path | None:
    return next((path / f for f in WEIGHTS_FILES if (path / f).is_file()), None)


class AdapterDirectory:
    def __init__(self, root: Path) -> None:
        self.root = root

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if ADAPTER_NAME_RE.fullmatch(p.name) and (p / CONFIG_FILE).is_file() and _weights(p)
        )

    def resolve(self, name: str) -> AdapterRef:
        """The adapter called `name` (ValidationError for a malformed name, NotFound for an unknown one)."""
        check_adapter_name(name)
        path = self.root / name
        weights = _weights(path) if (path / CONFIG_FILE).is_file() else None
        if weights is None:
            known = self.names()
            listed = ", ".join(known[:20]) if known else "none"
            raise NotFound(f"no adapter {name!r} on this node (known: {listed})")
        st = weights.stat()
        # The inode too: an install writes a new file, which may keep its source's mtime and size.
        return AdapterRef(name, path, (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))

    def install(self, name: str, source: Path) -> Path:
        """Copy the adapter in `source` to `<root>/<name>`, whole or not at all (a copy, then a rename)."""
        check_adapter_name(name, "name")
        if not (source / CONFIG_FILE).is_file() or _weights(source) is None:
            raise ValidationError(
                "source", f"{source} is not a PEFT adapter directory ({CONFIG_FILE} and weights)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
        try:
            for f in (CONFIG_FILE, *WEIGHTS_FILES, PROVENANCE_FILE):
                if (source / f).is_file():
                    shutil.copy2(source / f, staging / f)
            target = self.root / name
            if target.exists():
                old = self.root / f".{name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(target, old)
                os.replace(staging, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


class AdapterLoadError(ZooError):
    """An adapter on disk that does not load into this model (wrong base, corrupt weights)."""


class LoadedAdapters:
    """The adapters loaded into one model, used only from the batcher's thread.

    Once the first adapter is loaded, the model's linear layers carry LoRA branches, so every forward
    pass goes through `forward` with one adapter name per row (BASE for none). At most `limit` adapters
    stay loaded: the least recently used one that no running row needs is unloaded to make room.
    """

    def __init__(self, model: Any, limit: int = 8) -> None:
        self.model = model
        self.limit = limit
        self.peft: Any = None
        self._loaded: OrderedDict[str, tuple[AdapterRef, str]] = OrderedDict()  # name -> (ref, peft key)
        self._retired: set[str] = set()  # keys of replaced weights, unloaded once no row uses them
        self._failed: dict[str, tuple[tuple[int, ...], str]] = {}  # name -> (stamp, why) of a failed load
        self._serial = 0

    def __len__(self) -> int:
        return len(self._loaded)

    def ensure(self, ref: AdapterRef, in_use: set[str]) -> str:
        """The PEFT key serving `ref`, loading it (or its newer weights) first; AdapterLoadError if the
        files do not fit this model."""
        have = self._loaded.get(ref.name)
        if have is not None and have[0].stamp == ref.stamp:
            self._loaded.move_to_end(ref.name)
            self._evict(in_use | {have[1]})
            return have[1]
        failed = self._failed.get(ref.name)
        if failed is not None and failed[0] == ref.stamp:  # the same files failed before: do not retry
            raise AdapterLoadError(failed[1])
        # PEFT keys become module attribute names, so they are generated, not the adapter's own name.
        self._serial += 1
        key = f"zoo_adapter_{self._serial}"
        try:
            if self.peft is None:
                self.peft = self._wrap()
            self.peft.load_adapter(str(ref.path), adapter_name=key, is_trainable=False)
        except Exception as e:
            if self.peft is not None and key in self.peft.peft_config:
                self.peft.delete_adapter(key)
            message = (
                f"adapter {ref.name!r} does not load into this model: {type(e).__name__}: {str(e)[:300]}"
            )
            self._failed[ref.name] = (ref.stamp, message)
            log.warning("adapter %s failed to load: %s", ref.name, e)
            raise AdapterLoadError(message) from e
        self._failed.pop(ref.name, None)
        if have is not None:
            self._retired.add(have[1])
        self._loaded[ref.name] = (ref, key)
        self._evict(in_use | {key})
        return key

    def _wrap(self) -> Any:
        """Wrap the model for PEFT with a placeholder: a rank-1 LoRA on one linear layer whose B is zero
        (the identity), used by no row. Every real adapter then goes through `load_adapter`, whose
        failure is undone by deleting what it added; a failed first `PeftModel.from_pretrained` would
        leave layers injected into the served model with nothing to remove them."""
        import torch
        from peft import LoraConfig, PeftModel

        head = self.model.get_output_embeddings()
        target = next(
            (
                name.rsplit(".", 1)[-1]
                for name, module in self.model.named_modules()
                if isinstance(module, torch.nn.Linear) and module is not head
            ),
            None,
        )
        if target is None:
            raise AdapterLoadError("this model has no linear layer a LoRA adapter could attach to")
        config = LoraConfig(r=1, lora_alpha=1, target_modules=[target], init_lora_weights=True)
        peft = PeftModel(self.model, config, adapter_name=PLACEHOLDER)
        peft.eval()
        return peft

    def _evict(self, in_use: set[str]) -> None:
        for key in self._retired - in_use:
            self.peft.delete_adapter(key)
            self._retired.discard(key)
        for name, (_ref, key) in list(self._loaded.items()):
            if len(self._loaded) <= self.limit:
                return
            if key not in in_use:
                self.peft.delete_adapter(key)
                del self._loaded[name]

    def forward(self, row_adapters: list[str], **kwargs: Any) -> Any:
        if self.peft is None:
            return self.model(**kwargs)
        return self.peft(adapter_names=row_adapters, **kwargs)
