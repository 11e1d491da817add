"""Run a LoRA job (GSPO, or a supervised one: sft, rft, distill) over N processes with `accelerate launch`,
and what the worker each process runs shares whatever the job.

    python -m zoo.trainer.gspo.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
    python -m zoo.trainer.sft.worker --spec spec.json --model DIR --out OUT [--deepspeed zero2]
        --model-id ID [--embedder DIR] [--serving JSON]

`launch_command` builds the `accelerate launch` line: its multi-process launcher (`--multi_gpu`, which
despite the name is the torchrun-style one: on a machine without CUDA the workers join a gloo group on
CPU, while `--cpu` would start a single process), one machine, a free port on 127.0.0.1; for one process
(a ZeRO run on one GPU) its single-process launcher; the worker is the job's module (gspo/worker.py,
sft/worker.py). `main` is what every worker does around its job: it joins the process group, runs the job
with its share of every batch (processes.py, or zero.py under DeepSpeed) and, on the main process, prints
one JSON line per step (and, for rft and distill, per chunk of rollouts before them) and one for the
result, which `zoo-node train gspo --processes N` turns into its progress display.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.trainer.lora.rendezvous import free_port

if TYPE_CHECKING:
    from zoo.trainer.lora.processes import AcceleratedProcesses

RESULT = "result"
STEP = "step"
COLLECT = "collect"  # a supervised job's rollouts so far (zoo.trainer.sft.collect.Collected.point)


def worker_messages(lines: Iterable[str]) -> Iterator[tuple[str, dict]]:
    """(STEP, COLLECT or RESULT, data) for each JSON line the main worker printed; other output is skipped."""
    for line in lines:
        try:
            message = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            continue
        if isinstance(message, dict) and len(message) == 1:
            kind, data = next(iter(message.items()))
            if kind in (STEP, COLLECT, RESULT) and isinstance(data, dict):
                yield kind, data


def launch_command(
    spec_file: Path,
    model: Path,
    out_dir: Path,
    processes: int,
    device: str,
    imports: tuple[str, ...] = (),
    *,
    worker: str,
    deepspeed: str | None = None,
    job_args: tuple[str, ...] = (),
) -> list[str]:
    """The `accelerate launch` command running `worker` (the job's worker module, which calls `main`) in
    `processes` processes; `imports` are modules each worker imports first (ones that register custom
    rewards); `deepspeed`, a DeepSpeed config (a file, or zero.SHIPPED) to train under ZeRO (zero.py);
    `job_args`, the worker's own arguments."""
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--num_processes", str(processes), "--num_machines", "1", *(["--multi_gpu"] if processes > 1 else []),
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", worker,
        "--spec", str(spec_file), "--model", str(model), "--out", str(out_dir), "--device", device,
        *(f"--import={name}" for name in imports),
        *(["--deepspeed", deepspeed] if deepspeed is not None else []),
        *job_args,
    ]  # fmt: skip


def launch_env(processes: int) -> dict[str, str]:
    """The workers' environment: the CPU cores shared out (N processes x all cores would thrash)."""
    env = dict(os.environ)
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // processes)))
    return env


@dataclass
class Worker:
    """What a worker's job gets: its arguments, the spec's fields, its device and processes, and where it
    reports each step (and a supervised job's rollouts so far)."""

    args: argparse.Namespace
    fields: dict[str, Any]
    device: str
    processes: AcceleratedProcesses
    on_step: Callable[[dict], None]
    on_collect: Callable[[dict], None]


Job = Callable[[Worker], dict[str, Any]]  # a worker's job: its result


def main(
    job: Job,
    argv: list[str] | None = None,
    *,
    description: str,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """A worker process: its arguments (those of every job, and the job's own that `arguments` adds) read,
    the `--import` modules imported, the process group joined, `job` run and its steps and result
    reported."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--import", dest="imports", action="append", default=[], help="a module to import first")
    ap.add_argument("--deepspeed", help="a DeepSpeed config (JSON file, or 'zero2'): train under ZeRO")
    if arguments is not None:
        arguments(ap)
    args = ap.parse_args(argv)
    for name in args.imports:
        importlib.import_module(name)

    import torch

    from zoo.trainer.lora.processes import AcceleratedProcesses

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    fields = json.loads(args.spec.read_text())
    if args.deepspeed is not None:
        from zoo.trainer.lora.zero import ZeroProcesses, read_config

        if args.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed would pick CUDA where there is one
        processes: AcceleratedProcesses = ZeroProcesses(read_config(args.deepspeed)[0])
    else:
        processes = AcceleratedProcesses()
    device = str(processes.device) if args.device != "cpu" else "cpu"

    def report(kind: str, data: dict) -> None:
        print(json.dumps({kind: data}), flush=True)

    def step(point: dict) -> None:
        report(STEP, point)

    def collect(point: dict) -> None:
        report(COLLECT, point)

    result = job(Worker(args, fields, device, processes, step, collect))
    if processes.is_main:
        report(RESULT, result)
