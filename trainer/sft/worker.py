"""The worker each process of a multi-process supervised LoRA run (sft, rft, distill) runs, started by
lora/launch.py's `launch_command`:

    python -m zoo.trainer.sft.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
        --model-id ID [--embedder DIR] [--serving JSON]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.trainer.lora.launch import main

if TYPE_CHECKING:
    from zoo.trainer.lora.processes import AcceleratedProcesses


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model-id", default="", help="the base model's id (the adapter's provenance)")
    ap.add_argument("--embedder", type=Path, help="distill: the embedder retrieval uses")
    ap.add_argument("--serving", default="{}", help="distill: the serving defaults, JSON")


def run(
    args: argparse.Namespace,
    fields: dict[str, Any],
    device: str,
    processes: AcceleratedProcesses,
    step: Callable[[dict], None],
    collect: Callable[[dict], None],
) -> dict[str, Any]:
    from zoo.inference.defaults import ServingDefaults
    from zoo.trainer.sft.job import run_sft
    from zoo.trainer.sft.spec import SftSpec

    embedder = None
    if args.embedder is not None:
        from zoo.inference.embedder import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(args.embedder)
    return run_sft(
        SftSpec.parse(fields), args.model, args.out, model_id=args.model_id, device=device,
        processes=processes, on_step=step, embedder=embedder,
        serving=ServingDefaults(**json.loads(args.serving)), on_collect=collect,
    )  # fmt: skip


if __name__ == "__main__":
    main(
        run,
        description="A supervised LoRA worker process (started by accelerate launch).",
        arguments=arguments,
    )
