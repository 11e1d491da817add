"""`zoo-node train …`: a learning job in the foreground, with the node's configured model and no daemon.

It is the job runner's path without the job store: events go to the terminal, the checkpoint to
OUT/checkpoint.json (written atomically after every step), the outputs to OUT/ (library.json,
report.json, curve.png). `--resume` continues from that checkpoint with the spec it was started with.
The starting library is the data dir's current verified version (read only; nothing there changes).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from zoo.node.config import NodeConfig
from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic

CHECKPOINT = "checkpoint.json"


class TrainingError(ZooError):
    """The run cannot start: bad spec, missing checkpoint, model unavailable."""


def _read_resume_json(path: Path, missing: str) -> Any:
    """The JSON a --resume continues from; TrainingError saying `missing` or that it is corrupt."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TrainingError(f"--resume: {missing}") from None
    except json.JSONDecodeError as e:
        raise TrainingError(f"--resume: {path} is corrupt: {e}") from None


def _load_checkpoint(out_dir: Path) -> dict[str, Any]:
    path = out_dir / CHECKPOINT
    data = _read_resume_json(path, f"no checkpoint at {path}")
    if not isinstance(data, dict) or "spec" not in data or "state" not in data:
        raise TrainingError(f"--resume: {path} is not a zoo-node training checkpoint")
    return data


async def run_foreground(
    cfg: NodeConfig, spec_fields: dict[str, Any], out_dir: Path, resume: bool, view: Any
) -> int:
    """Run TF-GRPO; returns the exit code (0 when it completed)."""
    from zoo.inference.bundled_models import ModelUnavailable
    from zoo.node.components.backend_loading import load_backend
    from zoo.node.components.served_model import model_id, resolve_model_path
    from zoo.node.jobs.runner import parse_spec
    from zoo.registry.library_store import LibraryStore
    from zoo.trainer.tfgrpo.job import run_tf_grpo
    from zoo.trainer.tfgrpo.llm import LLM

    out_dir = out_dir.expanduser().resolve()
    checkpoint = _load_checkpoint(out_dir) if resume else None
    if checkpoint is not None and spec_fields:
        given = {k: v for k, v in checkpoint["spec"].items() if k in spec_fields}
        if given != spec_fields:
            view.console.print(
                "--resume: the run continues with the spec it was started with; "
                "options that differ from it are ignored"
            )
    if not resume and (out_dir / CHECKPOINT).exists():
        raise TrainingError(f"{out_dir} holds a run already: pass --resume to continue it, or another --out")
    try:
        spec = parse_spec("tf-grpo", checkpoint["spec"] if checkpoint else spec_fields)
        spec = spec.with_serving_defaults(cfg.inference.serving_defaults())
    except ZooError as e:
        raise TrainingError(str(e)) from None
    try:
        path = await asyncio.to_thread(resolve_model_path, cfg)
    except ModelUnavailable as e:
        raise TrainingError(str(e)) from None
    model_sha256 = ""  # a remote backend's weights are not here to hash
    if path is not None:
        from zoo.inference.provenance.weights import WEIGHT_HASHES_FILE, WeightHashes

        try:
            model_sha256 = await asyncio.to_thread(WeightHashes(cfg.cache_dir / WEIGHT_HASHES_FILE).of, path)
        except (OSError, ZooError) as e:
            raise TrainingError(f"cannot hash the model's weights: {e}") from None
    view.console.print(f"loading the model ({cfg.model.backend}) and the embedder…")
    backend = await asyncio.to_thread(
        load_backend, cfg.model, path, model_id(cfg, path), cfg.inference.max_batch_size, cfg.cache_dir
    )

    def embedder() -> Any:
        from zoo.inference.embedder import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(cfg.embedder.path)

    emb = await asyncio.to_thread(embedder)
    stored = LibraryStore(cfg.data_dir).current()
    out_dir.mkdir(parents=True, exist_ok=True)

    async def emit(type_: str, data: dict[str, Any]) -> None:
        view.handle(type_, data)

    async def save(step: int, state: dict[str, Any], event: tuple[str, dict[str, Any]]) -> None:
        payload = {"spec": spec.to_json(), "step": step, "state": state}
        await asyncio.to_thread(write_atomic, out_dir / CHECKPOINT, json.dumps(payload).encode())
        view.handle(*event)

    try:
        with view:
            result = await run_tf_grpo(
                spec,
                LLM(backend, spec.concurrency),
                emb,
                stored.library if stored is not None else None,
                stored.root if stored is not None else "",
                author="job:local",
                out_dir=out_dir,
                emit=emit,
                save=save,
                resume=checkpoint["state"] if checkpoint else None,
                model_sha256=model_sha256,
            )
            view.handle("completed", result)
    except ZooError as e:  # a limit the run met (the context, say): its one line, naming what to change
        raise TrainingError(str(e)) from None
    finally:
        await backend.close()
    return 0


SPEC_FILE = "spec.json"


def gspo_spec_for(out_dir: Path, spec_fields: dict[str, Any], resume: bool) -> Any:
    """The validated spec of a foreground GSPO run in `out_dir`: the one it was started with on --resume
    (OUT/spec.json), else the given fields; a directory holding another run needs --resume."""
    from zoo.trainer.gspo.spec import GspoSpec

    stored = out_dir / SPEC_FILE
    if resume:
        fields = _read_resume_json(stored, f"no GSPO run in {out_dir} (no {SPEC_FILE})")
    elif stored.exists():
        raise TrainingError(f"{out_dir} holds a run already: pass --resume to continue it, or another --out")
    else:
        fields = spec_fields
    try:
        return GspoSpec.parse(fields)
    except ZooError as e:
        raise TrainingError(str(e)) from None


def run_gspo_foreground(
    cfg: NodeConfig,
    spec_fields: dict[str, Any],
    out_dir: Path,
    resume: bool,
    view: Any,
    processes: int = 1,
    deepspeed: str | None = None,
) -> int:
    """Run GSPO on the configured local model, in this process or in `processes` accelerate workers (with
    `deepspeed`, a DeepSpeed config, always in workers: under ZeRO); returns the exit code (0 when it
    completed)."""
    from zoo.trainer.gspo.job import run_gspo

    out_dir = out_dir.expanduser().resolve()
    spec = gspo_spec_for(out_dir, spec_fields, resume)
    path, deepspeed = _local_model(cfg, "GSPO trains LoRA adapters", spec, deepspeed)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / SPEC_FILE, json.dumps(spec.to_json(), indent=2).encode())
    with view:
        view.start(spec)
        if processes > 1 or deepspeed is not None:
            return _gspo_processes(out_dir, path, cfg.model.device, processes, view, deepspeed)
        result = run_gspo(spec, path, out_dir, device=cfg.model.device, on_step=view.step)
        view.done(result)
    return 0


def _local_model(cfg: NodeConfig, what: str, spec: Any, deepspeed: str | None) -> tuple[Path, str | None]:
    """The local model a LoRA run trains on (TrainingError for a remote backend or a model that cannot be
    prepared), the checked DeepSpeed config, and the configured thread count applied."""
    from zoo.inference.bundled_models import ModelUnavailable
    from zoo.node.components.served_model import training_weights, trains_lora

    if not trains_lora(cfg):
        raise TrainingError(
            f"{what} on a local model: model.backend is {cfg.model.backend!r}"
            + (f" with model.path {cfg.model.path}" if cfg.model.path is not None else "")
            + "; it must be 'transformers' (or 'llamacpp' serving the bundled model)"
        )
    try:
        path = training_weights(cfg)
    except ModelUnavailable as e:
        raise TrainingError(str(e)) from None
    if deepspeed is not None:
        deepspeed = _checked_zero_config(deepspeed, spec)
    if cfg.model.threads:
        import torch

        torch.set_num_threads(cfg.model.threads)
    return path, deepspeed


def _checked_zero_config(source: str, spec: Any) -> str:
    """`source` (a DeepSpeed config file or the shipped one's name) checked against the spec before any
    worker starts, and DeepSpeed importable; the file's absolute path (or the name)."""
    from zoo.trainer.lora.zero import SHIPPED, ZeroConfigError, deepspeed_module, engine_config, read_config

    try:
        config, where = read_config(source)
        engine_config(config, max_grad_norm=spec.max_grad_norm, micro_batch_size=spec.micro_batch_size)
        deepspeed_module()
    except ZeroConfigError as e:
        raise TrainingError(f"--deepspeed: {e}") from None
    return SHIPPED if where == SHIPPED else str(Path(where).resolve())


def _gspo_processes(
    out_dir: Path,
    model: Path,
    device: str,
    processes: int,
    view: Any,
    deepspeed: str | None = None,
    *,
    job: str = "gspo",
    job_args: tuple[str, ...] = (),
) -> int:
    """The run under `accelerate launch` with `processes` workers; their main one reports each step (and a
    supervised job's rollouts before them)."""
    import subprocess

    from zoo.trainer.gspo import worker as gspo_worker
    from zoo.trainer.lora.launch import COLLECT, RESULT, STEP, launch_command, launch_env, worker_messages
    from zoo.trainer.sft import worker as sft_worker

    command = launch_command(
        out_dir / SPEC_FILE,
        model,
        out_dir,
        processes,
        device,
        worker={"gspo": gspo_worker, "sft": sft_worker}[job].__name__,
        deepspeed=deepspeed,
        job_args=job_args,
    )
    with subprocess.Popen(command, env=launch_env(processes), stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for kind, data in worker_messages(proc.stdout):
            if kind == STEP:
                view.step(data)
            elif kind == COLLECT:
                view.collect(data)
            elif kind == RESULT:
                view.done(data)
        code = proc.wait()
    if code != 0:
        raise TrainingError(f"the {job} workers failed (exit {code}); the log above says why")
    return 0


# -- supervised LoRA: sft, rft, distill ------------------------------------------------------------------


def resolve_experiences(cfg: NodeConfig, value: str | None, out_dir: Path) -> str:
    """A distill job's library as a file: "current" (the node's current verified version, copied into
    out_dir), a job id (that TF-GRPO job's draft, DATA_DIR/jobs/ID/library.json) or a library file."""
    from zoo.registry.canonical import encode_library
    from zoo.registry.library_store import LibraryStore

    if value is None:
        raise TrainingError("distill needs --experiences: a library file, 'current' or a TF-GRPO job id")
    if value == "current":
        stored = LibraryStore(cfg.data_dir).current()
        if stored is None:
            raise TrainingError(f"--experiences current: the node in {cfg.data_dir} has no current library")
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "library.json"
        write_atomic(path, encode_library(stored.library))
        return str(path)
    job_library = cfg.data_dir / "jobs" / value / "library.json"
    if "/" not in value and job_library.is_file():
        return str(job_library)
    path = Path(value).expanduser()
    if not path.is_file():
        raise TrainingError(
            f"--experiences {value}: no such library file, and no job {value!r} with a library"
        )
    return str(path.resolve())


def run_sft_foreground(
    cfg: NodeConfig,
    kind: str,
    spec_fields: dict[str, Any],
    out_dir: Path,
    view: Any,
    processes: int = 1,
    deepspeed: str | None = None,
) -> int:
    """Run a supervised LoRA job (sft, rft or distill) on the configured local model, in this process or in
    `processes` accelerate workers (under ZeRO with `deepspeed`); returns the exit code."""
    from zoo.node.components.served_model import model_id
    from zoo.trainer.sft.job import ADAPTER_DIR, run_sft
    from zoo.trainer.sft.spec import SftSpec

    out_dir = out_dir.expanduser().resolve()
    if (out_dir / ADAPTER_DIR).exists() or (out_dir / SPEC_FILE).exists():
        raise TrainingError(f"{out_dir} holds a run already: choose another --out (or remove it)")
    fields = {**spec_fields, "kind": kind}
    if kind == "distill":
        fields["experiences"] = resolve_experiences(cfg, spec_fields.get("experiences"), out_dir)
    try:
        spec = SftSpec.parse(fields)
    except ZooError as e:
        raise TrainingError(str(e)) from None
    path, deepspeed = _local_model(cfg, f"{kind} trains a LoRA adapter", spec, deepspeed)
    serving = cfg.inference.serving_defaults()
    embedder_dir = None
    if kind == "distill" and spec.rollouts:
        from zoo.inference.bundled_models import bundled_embedder_dir

        embedder_dir = cfg.embedder.path or bundled_embedder_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / SPEC_FILE, json.dumps(spec.to_json(), indent=2).encode())
    identity = model_id(cfg, path)
    with view:
        view.start(spec)
        if processes > 1 or deepspeed is not None:
            from dataclasses import asdict

            job_args = ("--model-id", identity, "--serving", json.dumps(asdict(serving)))
            if embedder_dir is not None:
                job_args += ("--embedder", str(embedder_dir))
            return _gspo_processes(
                out_dir, path, cfg.model.device, processes, view, deepspeed, job="sft", job_args=job_args
            )
        embedder = None
        if embedder_dir is not None:
            from zoo.inference.embedder import SentenceTransformerEmbedder

            embedder = SentenceTransformerEmbedder(embedder_dir)
        try:
            result = run_sft(
                spec, path, out_dir, model_id=identity, device=cfg.model.device, on_step=view.step,
                embedder=embedder, serving=serving, on_collect=view.collect,
            )  # fmt: skip
        except ZooError as e:
            raise TrainingError(str(e)) from None
        view.done(result)
    return 0
