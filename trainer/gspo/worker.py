"""The worker each process of a multi-process GSPO run runs, started by lora/launch.py's `launch_command`:

python -m zoo.trainer.gspo.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zoo.trainer.lora.launch import main

if TYPE_CHECKING:
    from zoo.trainer.lora.processes import AcceleratedProcesses


def run(
    args: argparse.Namespace,
    fields: dict[str, Any],
    device: str,
    processes: AcceleratedProcesses,
    step: Callable[[dict], None],
    collect: Callable[[dict], None],
) -> dict[str, Any]:
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.gspo.spec import GspoSpec

    return run_gspo(GspoSpec.parse(fields), args.model, args.out, device=device, processes=processes,
                    on_step=step)  # fmt: skip


if __name__ == "__main__":
    main(run, description="A GSPO worker process (started by accelerate launch).")
