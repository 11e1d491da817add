"""The worker each process of a multi-process supervised LoRA run (sft, rft, distill) runs, started by
lora/launch.py's `launch_command`:

    python -m zoo.trainer.sft.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
        --model-id ID [--embedder DIR] [--serving JSON]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zoo.trainer.lora.launch import Worker, main


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model-id", default="", help="the base model's id (the adapter's provenance)")
    ap.add_argument("--embedder", type=Path, help="distill: the embedder retrieval uses")
    ap.add_argument("--serving", default="{}", help="distill: the serving defaults, JSON")


def run(worker: Worker) -> dict[str, Any]:
    from zoo.inference.defaults import ServingDefaults
    from zoo.trainer.sft.job import run_sft
    from zoo.trainer.sft.spec import SftSpec

    args = worker.args
    embedder = None
    if args.embedder is not None:
        from zoo.inference.embedder import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(args.embedder)
    return run_sft(
        SftSpec.parse(worker.fields), args.model, args.out, model_id=args.model_id, device=worker.device,
        processes=worker.processes, on_step=worker.on_step, embedder=embedder,
        serving=ServingDefaults(**json.loads(args.serving)), on_collect=worker.on_collect,
    )  # fmt: skip


if __name__ == "__main__":
    main(run, arguments=arguments, description="A supervised LoRA worker (started by accelerate launch).")
