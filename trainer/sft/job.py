"""A supervised LoRA job from spec to outputs: what `zoo-node train sft|rft|distill`, their worker processes
and the daemon's job runner call.

It loads the tasks (and, for `distill`, the library), the model with fresh LoRA adapters, makes the
training pairs (kind by kind: pairs.py, collect.py), trains (train.py), and leaves in `out_dir`:
    adapter/       the LoRA adapter as peft writes it, plus zoo_adapter.json: what it was trained from
                   (kind, base model, and for distill the library's root and version), so a node serving
                   it can say which library an answer came from
    pairs.jsonl    what it was trained on
    report.json    spec, per-step loss, validation before and after, pair counts, cost
    curve.png      loss and validation per step

`distill` rolls out on the dataset's training tasks (the shipped set by default) that no worked example of the
library answers, each only where the library offers it something past the relevance gate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoo.inference.adapters import PROVENANCE_FILE
from zoo.inference.defaults import ServingDefaults
from zoo.registry.canonical import decode_library
from zoo.registry.errors import ValidationError
from zoo.registry.fsutil import write_atomic
from zoo.registry.library import Library
from zoo.registry.merkle import library_root
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.prompting import PromptPath
from zoo.trainer.report import write_report
from zoo.trainer.rewards import RewardCache
from zoo.trainer.sft.collect import Collected, OnCollect, PolicyTokens, verified_pairs
from zoo.trainer.sft.pairs import (
    PAIRS_FILE,
    Pair,
    example_pairs,
    task_pairs,
    write_pairs,
)
from zoo.trainer.sft.spec import SftSpec
from zoo.trainer.sft.train import OnStep, SftRun
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tasks.source import load_tasks

ADAPTER_DIR = "adapter"


def load_library(path: str | None) -> Library:
    """The library a distill job learns from (`spec.experiences`, a library JSON file)."""
    if path is None:
        raise ValidationError("spec.experiences", "distill needs a library: a file, 'current' or a job id")
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValidationError("spec.experiences", f"no such file: {p}")
    try:
        return decode_library(p.read_bytes())
    except ValidationError as e:
        raise ValidationError("spec.experiences", f"{p} is not a library: {e}") from None


Collect = Callable[[list[Task], OnCollect | None], Collected]


def _sharded(
    processes: Processes, tasks: list[Task], collect: Collect, on_collect: OnCollect | None
) -> tuple[list[Pair], dict[str, Any]]:
    """`collect(tasks, on_collect)` shared out over the processes; the pairs in task order, as one process
    makes them. `on_collect` hears the main process's share as it goes, then every process's sums (`end`)."""
    started = time.perf_counter()
    mine = processes.shard(tasks)
    got = collect(mine, on_collect if processes.is_main else None)
    order = {t.id: i for i, t in enumerate(tasks)}
    numbered = [(order[p.id], j, p) for j, p in enumerate(got.pairs)]
    every = processes.gather(numbered)
    summed = processes.sum_values({k: float(v) for k, v in got.to_json().items()})
    stats = {k: int(v) for k, v in summed.items()}
    pairs = [p for _, _, p in sorted(every, key=lambda x: (x[0], x[1]))]
    if on_collect is not None and processes.is_main:
        phase = Collected(pairs, tasks=stats["tasks"], sampled=stats["sampled"], passed=stats["passed"])
        on_collect(phase.point(phase.tasks, time.perf_counter() - started, end=True))
    return pairs, stats


def make_pairs(
    spec: SftSpec,
    policy: LoraPolicy,
    train: list[Task],
    *,
    library: Library | None,
    embedder: Any,
    serving: ServingDefaults,
    processes: Processes,
    on_collect: OnCollect | None = None,
) -> tuple[list[Pair], dict[str, Any]]:
    """The run's training pairs and what making them found (sampled, passed); `on_collect` hears the
    rollouts' progress (rft, distill)."""
    rewards = RewardCache(spec.reward)
    if spec.kind == "sft":
        pairs = task_pairs(train, spec.instruction)
        if not pairs:
            raise ValidationError("spec.dataset", "sft needs tasks with reference answers; these have none")
        return pairs, {}
    if spec.kind == "rft":

        def sample(tasks: list[Task], report: OnCollect | None) -> Collected:
            return verified_pairs(policy, tasks, spec, rewards, tag="rft", on_collect=report)

        pairs, stats = _sharded(processes, train, sample, on_collect)
        return pairs, {"rollouts": stats}
    assert library is not None
    examples = example_pairs(library.experiences, spec.instruction)
    pairs, stats = list(examples), {}
    if spec.rollouts:
        if embedder is None:
            raise ValidationError("spec.rollouts", "distilling rollouts needs the embedder (retrieval)")
        path = PromptPath(
            PolicyTokens(policy),
            embedder,
            serving,
            library.base_model,
            instruction=spec.instruction,
            max_tokens=spec.max_new_tokens,
        )
        index = path.index(library.experiences)
        # A worked example is the reference answer to its own question: a rollout there adds only a
        # noisier copy of it (on lengths, passing rollouts such as "1 m = 1 × 100 = 10 cm. Answer: 100"
        # taught wrong working: 0.938 with them, where plain SFT on the same tasks scored 1.000). So rollouts
        # run on the other dataset tasks, and only those the library has something for (past the relevance
        # gate): a rollout with nothing from the library in its prompt would teach the model's own answers.
        # An example's text is its question as the library stored it: stripped.
        answered = {e.text for e in library.experiences if e.kind == "example" and e.answer is not None}
        tasks = [t for t in train if t.question.strip() not in answered
                 and path.offered(t, library.experiences, index)]  # fmt: skip

        def with_library(t: Task) -> list[dict[str, str]]:
            return path.messages(t, path.offered(t, library.experiences, index))[0]

        def sample(part: list[Task], report: OnCollect | None) -> Collected:
            return verified_pairs(policy, part, spec, rewards, prompt_for=with_library, tag="distill",
                                  on_collect=report)  # fmt: skip

        rolled, stats = _sharded(processes, tasks, sample, on_collect)
        pairs += rolled
    if not pairs:
        raise ValidationError(
            "spec.experiences", "the library has no worked examples and no rollout passed: nothing to distil"
        )
    return pairs, {"rollouts": stats} if stats else {}


def run_sft(
    spec: SftSpec,
    model_path: Path,
    out_dir: Path,
    *,
    model_id: str,
    device: str = "cpu",
    on_step: OnStep | None = None,
    processes: Processes | None = None,
    embedder: Any = None,
    serving: ServingDefaults | None = None,
    on_collect: OnCollect | None = None,
) -> dict[str, Any]:
    """Run the job; returns its result summary (paths, steps, scores, pairs). `on_step` hears each step,
    `on_collect` the rollouts before them (rft, distill): `Collected.point`s, the last with `end` set."""
    processes = processes or Processes()
    started = time.perf_counter()
    library = load_library(spec.experiences) if spec.kind == "distill" else None
    train, validation = load_tasks(spec)
    serving = serving or ServingDefaults()
    if spec.k is not None:
        serving = ServingDefaults(**{**serving.__dict__, "k": spec.k})
    torch.manual_seed(spec.seed)  # the adapters' initial weights: the same in every process
    policy = LoraPolicy.load(model_path, spec, device)
    pairs, made = make_pairs(
        spec, policy, train, library=library, embedder=embedder, serving=serving, processes=processes,
        on_collect=on_collect,
    )  # fmt: skip
    pairs_s = time.perf_counter() - started
    run = SftRun(spec, policy, pairs, validation, on_step=on_step, processes=processes)
    run.run()
    adapter = out_dir / ADAPTER_DIR
    provenance = {
        "kind": spec.kind,
        "base_model": model_id,
        "pairs": len(pairs),
        "created_at": int(time.time()),
    }
    if library is not None:
        provenance |= {"library_root": "0x" + library_root(library).hex(), "library_version": library.version}
    files = {"report": str(out_dir / "report.json"), "curve": str(out_dir / "curve.png")}
    if processes.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_pairs(out_dir / PAIRS_FILE, pairs)
        policy.save_adapter(adapter)
        write_atomic(adapter / PROVENANCE_FILE, json.dumps(provenance, indent=2, sort_keys=True).encode())
        report = {**run.report(), **made, "provenance": provenance, "pairs_s": round(pairs_s, 3)}
        files = write_report(out_dir, report, title=f"{spec.kind} LoRA: loss and validation")
    processes.barrier()
    return {
        "adapter": str(adapter),
        "report": files["report"],
        "curve": files["curve"],
        "kind": spec.kind,
        "pairs": len(pairs),
        "steps": run.step,
        "baseline_validation_score": run.baseline_validation_score,
        "validation_score": run.validation_score,
        "library_root": provenance.get("library_root"),
        "wall_s": round(time.perf_counter() - started, 3),
    }
