"""The worker each process of a multi-process GSPO run runs, started by lora/launch.py's `launch_command`:

python -m zoo.trainer.gspo.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
"""

from __future__ import annotations

from typing import Any

from zoo.trainer.lora.launch import Worker, main


def run(worker: Worker) -> dict[str, Any]:
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.gspo.spec import GspoSpec

    args = worker.args
    return run_gspo(GspoSpec.parse(worker.fields), args.model, args.out, device=worker.device,
                    processes=worker.processes, on_step=worker.on_step)  # fmt: skip


if __name__ == "__main__":
    main(run, description="A GSPO worker process (started by accelerate launch).")
