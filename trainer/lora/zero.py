"""DeepSpeed ZeRO for multi-process LoRA runs (GSPO's, the supervised kinds'): the shipped ZeRO-2 config, its
checks, and the processes whose optimiser steps go through a DeepSpeed engine.

Under plain data parallelism (processes.py) every process holds the whole optimiser state and sums whole
gradients. Under ZeRO stage 2 the engine partitions both over the processes (stage 1: the optimiser state
only): each process reduces and keeps only its share of the gradients, steps its share of the parameters
and gathers the rest. For LoRA adapters of a 135M model that saves little; it is what a GPU user training
larger adapters or models wants, and what the thesis trained with.

The config a user passes (or the shipped `zero2.json`) says how ZeRO partitions and communicates; what
the job's spec already decides (gradient clipping, micro-batch size) is filled in from the spec, and what
the run owns (the optimiser, the learning rate, precision through autocast, one update per
`optimise` pass) is refused when the config tries to set it, rather than silently overridden. Stage 3
(parameters partitioned too) is refused: the GSPO loss calls into the decoder directly, not through the
engine's forward, which stage 3 needs to gather parameters.

The engine runs with `managed_gradient_accumulation: false`: every backward accumulates, and `step()` is
the update. At stage 2 each backward reduces gradients across processes, so every process must run the
same number of backwards per update; `GspoRun` and `SftRun` pad a process with fewer micro-batches with
zero-weight ones. DeepSpeed averages gradients over processes, where the loss here is already each
process's share of the global batch mean, so the loss is scaled by the number of processes before the
engine's backward.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from zoo.registry.errors import ZooError
from zoo.trainer.lora.processes import AcceleratedProcesses
from zoo.trainer.lora.rendezvous import free_port

SHIPPED = "zero2"  # the name of the shipped config (trainer/lora/zero2.json)
ENGINE_DIR = "zero"  # inside a checkpoint directory: the engine's partitioned optimiser state
ENGINE_TAG = "state"

# Keys the run owns: the config may not set them.
OWNED = {
    "optimizer": "the run creates its own AdamW from the spec (learning_rate, weight_decay)",
    "scheduler": "the learning rate is the spec's learning_rate, constant",
    "fp16": "precision is the spec's bf16 flag (autocast); the weights stay fp32",
    "bf16": "precision is the spec's bf16 flag (autocast); the weights stay fp32",
    "gradient_accumulation_steps": "one update per optimisation pass; the micro-batches accumulate into it",
    "train_batch_size": "the spec's batch_size and group_size decide the batch",
    "managed_gradient_accumulation": "the run calls the engine's step() once per optimisation pass",
}
# Keys filled from the spec: the config may set them only to the spec's value.
FROM_SPEC = {"gradient_clipping": "max_grad_norm", "train_micro_batch_size_per_gpu": "micro_batch_size"}


class ZeroConfigError(ZooError, ValueError):
    """A DeepSpeed config this run cannot use; the message says which key and why."""


def read_config(source: str | Path) -> tuple[dict[str, Any], str]:
    """(config, where it came from) for `source`: the shipped config's name or a JSON file's path."""
    if str(source) == SHIPPED:
        text, where = resources.files("zoo.trainer.lora").joinpath("zero2.json").read_text(), SHIPPED
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise ZeroConfigError(
                f"no DeepSpeed config at {path} (a JSON file, or {SHIPPED!r} for the shipped one)"
            )
        text, where = path.read_text(), str(path)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ZeroConfigError(f"{where}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise ZeroConfigError(f"{where}: a DeepSpeed config is a JSON object, not {type(config).__name__}")
    return config, where


def engine_config(config: dict[str, Any], *, max_grad_norm: float, micro_batch_size: int) -> dict[str, Any]:
    """The config the engine gets: `config` checked, with the spec's values and the run's fixed ones."""
    for key, why in OWNED.items():
        if key in config and not (key in ("fp16", "bf16") and not _enabled(config[key])):
            raise ZeroConfigError(f"{key!r} may not be set in the DeepSpeed config: {why}")
    spec_values = {"gradient_clipping": max_grad_norm, "train_micro_batch_size_per_gpu": micro_batch_size}
    for key, field in FROM_SPEC.items():
        if key in config and config[key] != spec_values[key]:
            raise ZeroConfigError(
                f"{key!r} is {config[key]!r} in the DeepSpeed config but the spec's {field} is "
                f"{spec_values[key]!r}: set it in the spec (or leave it out of the config)"
            )
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        raise ZeroConfigError("the DeepSpeed config has no 'zero_optimization' object (with a 'stage')")
    stage = zero.get("stage")
    if stage not in (1, 2):
        raise ZeroConfigError(
            f"zero_optimization.stage is {stage!r}: GSPO runs ZeRO stage 1 or 2 (stage 3 partitions the "
            "parameters, which the loss reads directly, outside the engine's forward)"
        )
    if stage == 1 and zero.get("overlap_comm", False):
        raise ZeroConfigError(
            "zero_optimization.overlap_comm needs stage 2 here (the run steps the engine itself, which "
            "DeepSpeed allows with overlapped communication only at stage 2)"
        )
    for offload in ("offload_optimizer", "offload_param"):
        target = zero.get(offload)
        if isinstance(target, dict) and target.get("device", "none") != "none":
            raise ZeroConfigError(
                f"zero_optimization.{offload} is not supported: it needs DeepSpeed's own CPU optimiser, and "
                "the run brings its AdamW"
            )
    return {
        **config,
        **spec_values,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_allow_untested_optimizer": True,  # torch's AdamW, partitioned by ZeRO
        "steps_per_print": config.get("steps_per_print", 2**31 - 1),  # the run reports its own metrics
    }


def _enabled(section: Any) -> bool:
    """Whether a precision section ({"enabled": ...}) turns that precision on."""
    return not isinstance(section, dict) or section.get("enabled", False) is not False


def deepspeed_module() -> Any:
    try:
        import deepspeed
    except ImportError:
        raise ZeroConfigError(
            "DeepSpeed is not installed: pip install 'zoo-node[deepspeed]' (or deepspeed==0.19.8)"
        ) from None
    return deepspeed


class ZeroProcesses(AcceleratedProcesses):
    """N processes (under `accelerate launch`) whose updates go through a DeepSpeed ZeRO engine."""

    pads_micro_batches = True  # stage 2 reduces on every backward: equal backward counts everywhere

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.engine: Any = None

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, spec: Any) -> None:
        config = engine_config(
            self.config, max_grad_norm=spec.max_grad_norm, micro_batch_size=spec.micro_batch_size
        )
        deepspeed = deepspeed_module()
        if not torch.distributed.is_initialized():
            # One process: accelerate's single-process launcher starts no process group; ZeRO needs one.
            one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
            os.environ.update(one, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)
        # Otherwise accelerate started the process group (gloo on CPU, NCCL on GPUs); the engine joins it.
        self.engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )

    def backward(self, loss: torch.Tensor) -> None:
        # The engine averages gradients over the processes; `loss` is this process's share of the global
        # batch mean, whose gradients the processes must sum.
        self.engine.backward(loss * self.world, scale_wrt_gas=False)

    def update(
        self, optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], max_grad_norm: float
    ) -> float:
        """Reduce (stage 2: finish reducing) the gradients, clip them to the config's gradient_clipping
        (the spec's max_grad_norm) and step; the global gradient norm before clipping."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def save_optimizer(self, checkpoint: Path, optimizer: torch.optim.Optimizer) -> Any:
        """Every process writes its partition of the optimiser state (the frozen weights left out)."""
        self.engine.save_checkpoint(
            str(checkpoint / ENGINE_DIR), tag=ENGINE_TAG, client_state={}, exclude_frozen_parameters=True
        )
        return {"zero_processes": self.world}

    def load_optimizer(self, checkpoint: Path, optimizer: torch.optim.Optimizer, saved: Any) -> None:
        if not isinstance(saved, dict) or "zero_processes" not in saved:
            raise ValueError(
                f"{checkpoint}: written by a run without DeepSpeed; resume it without --deepspeed"
            )
        if saved["zero_processes"] != self.world:
            raise ValueError(
                f"{checkpoint}: its optimiser state is partitioned over {saved['zero_processes']} processes; "
                f"resume with --processes {saved['zero_processes']}"
            )
        loaded, _ = self.engine.load_checkpoint(
            str(checkpoint / ENGINE_DIR),
            tag=ENGINE_TAG,
            load_module_strict=False,  # only the trainable (adapter) weights were saved
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
        if loaded is None:
            raise ValueError(f"{checkpoint}: no DeepSpeed optimiser state in {checkpoint / ENGINE_DIR}")
