"""The processes a LoRA run (GSPO's, a supervised kind's) spans: one, or N under Hugging Face accelerate
(DDP-style data parallelism).

Each process takes every N-th prompt of a step's batch, samples and scores its prompts' groups, and
accumulates its share of the batch-mean loss (its sequences / the batch's sequences); gradients of the
trainable (LoRA) parameters are then summed across processes, so every process applies the same update
and the adapters equal a one-process run's with the same global batch (within float tolerance: sums
happen in another order). Gradients are reduced explicitly rather than through a DistributedDataParallel
wrapper because the loss reads the decoder's hidden states, not the wrapped module's forward, and the
trainable parameters are a few MB. Launch with `zoo-node train gspo --processes N` (it runs
`accelerate launch`); on CPU the backend is gloo.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class Processes:
    """One process: nothing to share. The optimiser's steps go through here (`prepare`, `backward`,
    `update`, `save_optimizer` / `load_optimizer`) so that a DeepSpeed engine can take them over (zero.py)."""

    rank = 0
    world = 1
    pads_micro_batches = False  # whether every process must run as many backwards per update as the others

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share: every world-th item from its rank on (so shares never overlap)."""
        return list(items[self.rank :: self.world])

    def gather(self, local: list[Any]) -> list[Any]:
        """Every process's list, concatenated in rank order."""
        return list(local)

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum each parameter's gradient over the processes (a missing gradient counts as zero)."""

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def barrier(self) -> None:
        """Wait until every process gets here."""

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, spec: Any) -> None:
        """Set up the optimisation of `model`'s trainable parameters by `optimizer` (nothing to do here)."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def update(
        self, optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], max_grad_norm: float
    ) -> float:
        """Sum the accumulated gradients over the processes, clip them to `max_grad_norm` and step; the
        gradient norm before clipping."""
        self.sum_gradients(params)
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        optimizer.step()
        return norm

    def save_optimizer(self, checkpoint: Path, optimizer: torch.optim.Optimizer) -> Any:
        """What the checkpoint's state file keeps of the optimiser (every process calls this; the main
        process writes the state file)."""
        return optimizer.state_dict()

    def load_optimizer(self, checkpoint: Path, optimizer: torch.optim.Optimizer, saved: Any) -> None:
        if isinstance(saved, dict) and "zero_processes" in saved:
            raise ValueError(
                f"{checkpoint}: written under DeepSpeed ZeRO over {saved['zero_processes']} processes; "
                f"resume with --deepspeed and --processes {saved['zero_processes']}"
            )
        optimizer.load_state_dict(saved)


class AcceleratedProcesses(Processes):
    """N processes started by `accelerate launch`."""

    def __init__(self) -> None:
        from accelerate import Accelerator

        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def gather(self, local: list[Any]) -> list[Any]:
        from accelerate.utils import gather_object

        return list(gather_object(list(local)))

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # one collective, not one per tensor
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        if not keys:
            return {}
        flat = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
        return dict(zip(keys, flat.tolist(), strict=True))

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()
