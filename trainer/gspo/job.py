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

import contextlib
from pathlib import Path
from typing import Any

import pydantic
import torch

from zoo.registry.errors import ValidationError
from zoo.trainer.envs.nano import NanoEnv
from zoo.trainer.envs.nano_episode import NanoLimits, NanoTask
from zoo.trainer.envs.nano_repos import generate_task_repos, shipped_tasks
from zoo.trainer.gspo.episodes import EpisodeGroups
from zoo.trainer.gspo.run import GspoRun, OnStep
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.report import write_report
from zoo.trainer.tasks.schema import split
from zoo.trainer.tasks.source import SHIPPED, load_tasks

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
    if spec.environment == "nano":
        # The main process builds the shipped repositories; the others wait for it, then read them.
        train, validation, repos = nano_tasks(spec, out_dir, build=processes.is_main)
        processes.barrier()
    else:
        train, validation = load_tasks(spec)
    torch.manual_seed(spec.seed)  # the adapters' initial weights: the same in every process
    policy = LoraPolicy.load(model_path, spec, device)
    with contextlib.ExitStack() as cleanup:
        episodes = None
        if spec.environment == "nano":
            env = cleanup.enter_context(nano_env(spec, policy, repos))
            episodes = EpisodeGroups(
                policy,
                env,
                group_size=spec.group_size,
                max_new_tokens=spec.max_new_tokens,
                temperature=spec.temperature,
                top_p=spec.top_p,
                seed=spec.seed,
                max_turns=spec.max_turns,
            )
        run = GspoRun(
            spec, policy, train, validation, out_dir, on_step=on_step, processes=processes, episodes=episodes
        )
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


def _nano_jsonl(path: str, field: str) -> list[NanoTask]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValidationError(field, f"no such file: {p}")
    tasks = []
    for number, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(NanoTask.model_validate_json(line))
        except pydantic.ValidationError as e:
            problem = e.errors(include_url=False)[0]
            where = ".".join(str(x) for x in problem["loc"])
            raise ValidationError(f"{field} ({p}) line {number} {where}", problem["msg"]) from None
    return tasks


def nano_tasks(
    spec: GspoSpec, out_dir: Path, *, build: bool = True
) -> tuple[list[NanoTask], list[NanoTask], Path]:
    """(train, validation, repositories directory) of a Nano run: the shipped tasks (their repositories
    generated into out_dir/nano-repos unless `nano_repos` holds them) or a JSONL of NanoTask records
    whose repositories are in `nano_repos`; split as text tasks are, by validation_fraction."""
    if spec.nano_repos is None:
        if spec.dataset != SHIPPED:
            raise ValidationError(
                "spec.nano_repos", "is required with your own Nano tasks (their repositories)"
            )
        repos = out_dir / "nano-repos"
        tasks = generate_task_repos(repos) if build else shipped_tasks()
    else:
        repos = Path(spec.nano_repos).expanduser()
        if not repos.is_dir():
            raise ValidationError("spec.nano_repos", f"no such directory: {repos}")
        tasks = shipped_tasks() if spec.dataset == SHIPPED else _nano_jsonl(spec.dataset, "spec.dataset")
    if spec.validation not in (None, SHIPPED):
        train, validation = tasks, _nano_jsonl(spec.validation, "spec.validation")
    else:
        views, _ = split([t.reward_task() for t in tasks], spec.validation_fraction, spec.seed)
        train_ids = {t.id for t in views}
        train = [t for t in tasks if t.id in train_ids]
        validation = [t for t in tasks if t.id not in train_ids]
    train = train[: spec.train_limit] if spec.train_limit is not None else train
    validation = validation[: spec.validation_limit] if spec.validation_limit is not None else validation
    if not train:
        raise ValidationError("spec.dataset", "holds no training tasks (after the split and limits)")
    return train, validation, repos


def nano_env(spec: GspoSpec, policy: LoraPolicy, repos: Path) -> NanoEnv:
    """The environment episodes run in, its token budget counted in the policy's own tokens."""
    limits = NanoLimits(
        max_tool_calls=spec.max_tool_calls,
        token_budget=spec.episode_token_budget,
        wall_clock_s=spec.episode_wall_clock_s,
        shell_timeout_s=min(spec.shell_timeout_s, spec.episode_wall_clock_s),
    )
    tokenizer = policy.tokenizer
    return NanoEnv(
        repos, limits=limits, token_counter=lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    )
