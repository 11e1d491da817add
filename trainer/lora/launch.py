"""Run a LoRA job (GSPO, or a supervised one: sft, rft, distill) over N processes with `accelerate launch`,
and the worker each process runs.

    python -m zoo.trainer.gspo.launch --spec spec.json --model DIR --out OUT [--deepspeed zero2]
        [--job sft --model-id ID [--embedder DIR] [--serving JSON]]

`launch_command` builds the `accelerate launch` line: its multi-process launcher (`--multi_gpu`, which
despite the name is the torchrun-style one: on a machine without CUDA the workers join a gloo group on
CPU, while `--cpu` would start a single process), one machine, a free port on 127.0.0.1; for one process
(a ZeRO run on one GPU) its single-process launcher. `main` is the worker: it joins the process group,
runs the job with its share of every batch (processes.py, or zero.py under DeepSpeed) and, on the main
process, prints one JSON line per step (and, for rft and distill, per chunk of rollouts before them) and
one for the result, which `zoo-node train gspo --processes N` turns into its progress display.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from zoo.trainer.gspo.rendezvous import free_port

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
    deepspeed: str | None = None,
    job: str = "gspo",
    job_args: tuple[str, ...] = (),
) -> list[str]:
    """The `accelerate launch` command running the worker in `processes` processes; `imports` are modules
    each worker imports first (ones that register custom rewards); `deepspeed`, a DeepSpeed config (a
    file, or zero.SHIPPED) to train under ZeRO (zero.py)."""
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--num_processes", str(processes), "--num_machines", "1", *(["--multi_gpu"] if processes > 1 else []),
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "zoo.trainer.gspo.launch",
        "--spec", str(spec_file), "--model", str(model), "--out", str(out_dir), "--device", device,
        *(f"--import={name}" for name in imports),
        *(["--deepspeed", deepspeed] if deepspeed is not None else []),
        "--job", job, *job_args,
    ]  # fmt: skip


def launch_env(processes: int) -> dict[str, str]:
    """The workers' environment: the CPU cores shared out (N processes x all cores would thrash)."""
    env = dict(os.environ)
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // processes)))
    return env


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A GSPO worker process (started by accelerate launch).")
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--import", dest="imports", action="append", default=[], help="a module to import first")
    ap.add_argument("--deepspeed", help="a DeepSpeed config (JSON file, or 'zero2'): train under ZeRO")
    ap.add_argument("--job", choices=("gspo", "sft"), default="gspo")
    ap.add_argument("--model-id", default="", help="sft: the base model's id (the adapter's provenance)")
    ap.add_argument("--embedder", type=Path, help="sft (distill): the embedder retrieval uses")
    ap.add_argument("--serving", default="{}", help="sft (distill): the serving defaults, JSON")
    args = ap.parse_args(argv)
    for name in args.imports:
        importlib.import_module(name)

    import torch

    from zoo.trainer.gspo.processes import AcceleratedProcesses

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    fields = json.loads(args.spec.read_text())
    if args.deepspeed is not None:
        from zoo.trainer.gspo.zero import ZeroProcesses, read_config

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

    if args.job == "sft":
        result = _run_sft(args, fields, device, processes, step, lambda point: report(COLLECT, point))
    else:
        from zoo.trainer.gspo.job import run_gspo
        from zoo.trainer.gspo.spec import GspoSpec

        result = run_gspo(GspoSpec.parse(fields), args.model, args.out, device=device, processes=processes,
                          on_step=step)  # fmt: skip
    if processes.is_main:
        report(RESULT, result)


def _run_sft(
    args: argparse.Namespace, fields: dict, device: str, processes: object, step: object, collect: object
) -> dict:
    from zoo.inference.defaults import ServingDefaults
    from zoo.trainer.sft.job import run_sft
    from zoo.trainer.sft.spec import SftSpec

    embedder = None
    if args.embedder is not None:
        from zoo.inference.embedder import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(args.embedder)
    return run_sft(
        SftSpec.parse(fields), args.model, args.out, model_id=args.model_id, device=device,
        processes=processes, on_step=step, embedder=embedder,  # type: ignore[arg-type]
        serving=ServingDefaults(**json.loads(args.serving)), on_collect=collect,  # type: ignore[arg-type]
    )  # fmt: skip


if __name__ == "__main__":
    main()
