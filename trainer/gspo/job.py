"""A GSPO job from spec to outputs: what `zoo-node train gspo` (and the daemon's job runner) call.

It loads the tasks and the model, resumes from the last checkpoint in `out_dir` when there is one, trains,
and leaves in `out_dir`:
    adapter/       the trained LoRA adapters as peft writes them (adapter_config.json, safetensors):
                   `PeftModel.from_pretrained(base, out_dir / "adapter")` serves them
    checkpoints/   step-NNNNNN/ directories (adapters, optimiser and RNG state) and `latest`
    report.json    spec, per-step metrics, validation before and after, cost
    curve.png      reward mean (± std) and validation score per step
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zoo.trainer.gspo.policy import LoraPolicy
from zoo.trainer.gspo.processes import Processes
from zoo.trainer.gspo.run import GspoRun, OnStep
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.report import write_report
from zoo.trainer.spec import load_tasks

ADAPTER_DIR = "adapter"


def run_gspo(
    spec: GspoSpec,
    model_path: Path,
    out_dir: Path,
    *,
    device: str = "cpu",
    on_step: OnStep | None = None,
    processes: Processes | None = None,
) -> dict[str, Any]:
    """Run (or resume) the job; returns its result summary (paths, steps, scores). With `processes` (N
    workers under accelerate), every process trains and the main one writes the outputs."""
    processes = processes or Processes()
    train, validation = load_tasks(spec)
    torch.manual_seed(spec.seed)  # the adapters' initial weights: the same in every process
    policy = LoraPolicy.load(model_path, spec, device)
    run = GspoRun(spec, policy, train, validation, out_dir, on_step=on_step, processes=processes)
    run.run()
    adapter = out_dir / ADAPTER_DIR
    files = {"report": str(out_dir / "report.json"), "curve": str(out_dir / "curve.png")}
    if processes.is_main:
        policy.save_adapter(adapter)
        files = write_report(out_dir, run.report(), title="GSPO learning curve")
    processes.barrier()
    return {
        "adapter": str(adapter),
        "report": files["report"],
        "curve": files["curve"],
        "steps": run.step,
        "baseline_validation_score": run.baseline_validation_score,
        "validation_score": run.validation_score,
        "wall_s": round(run.wall_s, 3),
    }
