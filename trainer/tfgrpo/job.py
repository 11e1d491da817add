"""A TF-GRPO job from spec to outputs: what the daemon's job runner and `zoo-node train` both call.

It loads the tasks, resumes from a checkpoint when given one, runs the loop and leaves in `out_dir`. A fresh
run starts from the base library plus, by default (`lookup_start`), every labelled training task as a worked
example: the lookup baseline, which the loop then has to beat on validation to change anything. It leaves:
    library.json   the learned library as a draft version (canonical bytes): version = base + 1, parent =
                   the base version's root, tagged with the model the rollouts ran on
    report.json    learning curve, operations, lesson statistics, cost
    curve.png      train reward and validation score per step
A checkpoint holds the loop state plus the base the job started from, so a resumed job builds its draft
on the same parent even if the node's current library moved on meanwhile.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zoo.inference.defaults import ServingDefaults
from zoo.inference.embedder import Embedder
from zoo.registry.canonical import encode_library
from zoo.registry.experience import Experience
from zoo.registry.fsutil import write_atomic
from zoo.registry.library import Library
from zoo.registry.merkle import library_root
from zoo.trainer.baselines import lookup_experiences
from zoo.trainer.report import write_report
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tasks.source import load_tasks
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.loop import Context, TfGrpoRun
from zoo.trainer.tfgrpo.run_state import TrainState, report
from zoo.trainer.tfgrpo.spec import TfGrpoSpec

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
Save = Callable[[int, dict[str, Any], tuple[str, dict[str, Any]]], Awaitable[None]]


@dataclass(frozen=True)
class Base:
    """The library version a job builds on: its draft is version + 1 with parent_root = root."""

    version: int
    root: str  # "" when the node had no library
    experiences_from: str  # "current" or "empty"

    @classmethod
    def of(cls, library: Library | None, root: str, spec: TfGrpoSpec) -> Base:
        return cls(
            library.version if library is not None else 0, root if library is not None else "", spec.base
        )


def critic_of(spec: TfGrpoSpec, llm: LLM) -> LLM | None:
    """The critic's model when the spec names an endpoint for it (None: the policy model critiques), on the
    policy's ledger so the run's cost counts both."""
    if spec.critic_base_url is None or spec.critic_model is None:
        return None
    import os

    from zoo.inference.openai_backend import OpenAIBackend

    backend = OpenAIBackend(
        spec.critic_base_url, spec.critic_model, os.environ.get("ZOO_NODE_CRITIC_API_KEY"),
        max_concurrency=spec.concurrency,
    )  # fmt: skip
    return LLM(backend, spec.concurrency, ledger=llm.ledger)


def lookup_start(
    spec: TfGrpoSpec, train: Sequence[Task], base_model: str, held: Sequence[Experience]
) -> list[Experience]:
    """The worked examples a run adds to its starting library under `lookup_start`: every labelled training
    task the library does not hold yet, in task order, up to the size cap. The run begins where the lookup
    baseline is, and validation (which lets a growing library in only on a strictly better score) keeps only
    what beats it. Label-free runs read no reference answer, so they add none."""
    if not spec.lookup_start or spec.label_free:
        return []
    have = {e.id for e in held}
    room = max(spec.max_library_size - len(held), 0)
    fresh = [e for e in lookup_experiences(train, base_model, reward=spec.reward) if e.id not in have]
    return fresh[:room]


def validated_with(serving: ServingDefaults, factors: bool = False) -> str:
    """The serving conditions a library was validated under, as its description records them."""
    said = (
        f"k={serving.k}, an experience budget of {serving.experience_budget_tokens} tokens, lessons in the "
        f"{serving.lesson_position} turn"
    )
    return said + (f", factors at eta {serving.factor_eta:g}, cap {serving.factor_cap:g}" if factors else "")


async def run_tf_grpo(
    spec: TfGrpoSpec,
    llm: LLM,
    embedder: Embedder,
    current: Library | None,
    current_root: str,
    *,
    author: str,
    out_dir: Path,
    emit: Emit,
    save: Save,
    resume: dict[str, Any] | None = None,
    model_sha256: str = "",
) -> dict[str, Any]:
    """Run (or resume) the job; returns its result summary (paths, version, root, scores). The draft names
    the weights it was made on by `model_sha256` (a format-4 library) when the caller knows it."""
    train, validation = load_tasks(spec)
    if resume is not None and "train" in resume:
        base = Base(**resume["base"])
        created_at = datetime.fromisoformat(resume["created_at"])
        state: TrainState | None = TrainState.from_json(resume["train"])
        examples_added = int(resume.get("lookup_start", 0))
        # The lesson text the job already learned lives in the state; the base only gives the lineage.
        start = Library.create(version=max(base.version, 1), base_model=llm.model_id)
    else:
        base = Base.of(current, current_root, spec)
        created_at = datetime.now(UTC).replace(microsecond=0)
        state = None
        experiences = current.experiences if current is not None and spec.base == "current" else ()
        seeded = lookup_start(spec, train, llm.model_id, experiences)
        examples_added = len(seeded)
        experiences = (*experiences, *seeded)
        start = Library.create(version=max(base.version, 1), base_model=llm.model_id, experiences=experiences)
    wrapper = {"base": asdict(base), "created_at": created_at.isoformat(), "lookup_start": examples_added}

    async def checkpoint(step: int, train_state: dict[str, Any], event: tuple[str, dict[str, Any]]) -> None:
        await save(step, {**wrapper, "train": train_state}, event)

    ctx = Context(llm=llm, embedder=embedder, base=start, author=author, created_at=created_at,
                  critic=critic_of(spec, llm))  # fmt: skip
    run = TfGrpoRun(spec, train, validation, ctx, emit=emit, checkpoint=checkpoint)
    try:
        final = await run.run(state)
    finally:
        if ctx.critic is not None:
            await ctx.critic.backend.close()

    summary = f"TF-GRPO: {spec.epochs} epoch(s), G={spec.group_size}, {len(train)} training tasks"
    if examples_added:
        summary += f", started from {examples_added} of them as worked examples"
    draft = Library.create(
        version=base.version + 1,
        parent_root=base.root,
        base_model=llm.model_id,
        base_model_sha256=model_sha256,
        experiences=final.library,
        description=f"{spec.description or summary} "
        f"(validated with {validated_with(run.serving, spec.distill_factors)})",
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    library_file = out_dir / "library.json"
    write_atomic(library_file, encode_library(draft))
    root = "0x" + library_root(draft).hex()
    files = write_report(
        out_dir,
        report(spec, final, {"base": asdict(base), "model": llm.model_id, "draft": {"version": draft.version,
                                                                                   "root": root}}),
    )  # fmt: skip
    return {
        "library": str(library_file),
        "report": files["report"],
        "curve": files["curve"],
        "version": draft.version,
        "parent_root": base.root,
        "root": root,
        "experiences": len(draft.experiences),
        "lookup_start": examples_added,
        "steps": final.step,
        "baseline_validation_score": final.baseline_validation_score,
        "validation_score": final.validation_score,
        "llm_calls": final.ledger.calls,
        "wall_s": round(final.wall_s, 3),
    }
