"""Training-Free GRPO (HLLM paper §4, Algorithm 1): learn a library of experiences from group rollouts.

Per epoch the training tasks are shuffled (seeded) and cut into batches; one batch is one *step*:

1. Rollouts: G completions per task with the current library in the prompt (the same assembly as the
   inference engine: the top-k experiences retrieved for the task, ranked by similarity).
2. Rewards per completion; the group-relative advantage A = (r - mean) / (std + eps). Each experience in
   a rollout's prompt (those it cited, when it cited any) is credited with A; its confidence moves from
   where it started by the shrunken mean of those advantages (confidence_of), and the report counts its
   helpful (A > 0) and harmful (A < 0) uses. With `distill_factors`, rollouts and validation decode with
   the factors of the experiences in the prompt, weighted by confidence as serving weighs them when a
   client asks for factors.
3. Groups whose rewards are all equal carry no comparison signal and are skipped (no LLM calls), except
   a group that failed wholly on a task with a reference answer: the critic compares its rollouts with
   the reference. With G = 1 (the paper's ablation without group computation) the single rollout is
   critiqued on its own.
4. Stage 1 summarises every rollout of those groups; stage 2 compares each group and proposes at most
   `max_ops_per_group` lesson operations. Beside them, every short-answer group proposes a worked example:
   its best rollout's question and final answer when it has a clear winner, the question and its reference
   when it failed wholly; a group of programs (unit tests, no reference) whose rollouts split proposes its
   shortest fully passing code block (`experience_kinds` picks lessons, examples or both). Stage 3
   consolidates the batch's operations (operations.py), then prunes: mostly harmful experiences after
   `drop_after_uses` uses, and the lowest-valued ones over `max_library_size`.
5. Validation: the changed library is scored on the validation split (greedy, one completion a task);
   if the score drops by more than `revert_tolerance` the step is reverted (the library stays as it was).
   The paper asks for this; its public implementation does not do it. A step that proposes both kinds
   offers its lessons and examples together and each kind alone as candidates (beside the library with
   only the prune applied, and each candidate with new factors also without them); the best-scoring one
   that passes is kept, so each kind earns its place on the model at hand and a rule that confuses a small
   model cannot take the examples down with it. Nothing enters without earning a better score: a candidate
   that grows the library must score above the current one, and a tie goes to the smaller library.

The run state after each completed step is a JSON checkpoint (`TrainState`); a run given that state
continues with the next step and, since every seed derives from (seed, step, task, rollout), makes the
same calls an uninterrupted run would have made.

Label-free mode scores rollouts by agreement with the group's majority answer (paper Table 5); the
validation split is then scored against its reference answers where it has them (held out: the learner
never sees them), and validation is off when it has none.

This module runs the rollouts and the validation and takes each step through its stages in order; the
stages are their own modules: credit.py (2: advantages, credit, confidence), lessons.py (3 and 4: the
critic's lessons), worked_examples.py (4: examples), selection.py (4's prune and 5: the candidates, the
choice, what keeping one records), over what a step works on (step_work.py); run_state.py holds the state,
its checkpoint, the learning curve and the report.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from zoo.inference.embedder import Embedder
from zoo.inference.factors import processor_builder
from zoo.inference.prompt import PromptTooLong, parse_citations
from zoo.inference.retrieval import Hit, RetrievalIndex
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.trainer.prompting import PromptPath
from zoo.trainer.rewards import RewardCache, ascore_group
from zoo.trainer.schedule import batches, seed_of, total_steps
from zoo.trainer.tasks.schema import Task
from zoo.trainer.tfgrpo.credit import INITIAL_CONFIDENCE, advantages_of, credit_uses
from zoo.trainer.tfgrpo.lessons import consolidate_lessons, critique, informative_groups
from zoo.trainer.tfgrpo.llm import LLM, ContextTooSmall
from zoo.trainer.tfgrpo.operations import Outcome, Proposal
from zoo.trainer.tfgrpo.run_state import TrainState, curve_point, json_totals
from zoo.trainer.tfgrpo.selection import candidate_libraries, choose, keep_chosen, size_of
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import Group, StepWork
from zoo.trainer.tfgrpo.worked_examples import proposed_examples

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
Checkpoint = Callable[[int, dict[str, Any], tuple[str, dict[str, Any]]], Awaitable[None]]


@dataclass
class Context:
    """What a run needs besides its spec and tasks."""

    llm: LLM
    embedder: Embedder
    base: Library  # the library the run starts from (its experiences; version and parent are the caller's)
    author: str  # "job:<id>": provenance of the lessons it writes
    created_at: datetime  # provenance timestamp of the lessons it writes (fixed per run: resumable)
    critic: LLM | None = None  # who summarises, compares and merges (None: the policy model itself)


class TfGrpoRun:
    """One run: its prompts, rollouts and validation, and the steps that take them through the stages."""

    def __init__(
        self,
        spec: TfGrpoSpec,
        train: Sequence[Task],
        validation: Sequence[Task],
        ctx: Context,
        *,
        emit: Emit,
        checkpoint: Checkpoint,
    ) -> None:
        self.spec = spec
        self.train = list(train)
        self.validation = list(validation)
        self.ctx = ctx
        self.llm = ctx.llm
        # The critic's calls count in the run's one ledger, whichever model answers them.
        self.critic = ctx.critic or ctx.llm
        self.emit = emit
        self.checkpoint = checkpoint
        self.base_model = ctx.base.base_model
        self.reward_for = RewardCache(spec.reward, judge=self._judge)
        self.steps_total = total_steps(len(self.train), spec.batch_size, spec.epochs)
        self.per_epoch = math.ceil(len(self.train) / spec.batch_size)
        # Unset, the serving defaults: a library is validated under the conditions it is served in.
        self.serving = spec.serving()
        self.k = self.serving.k
        self.prompts = PromptPath(
            self.llm.backend,
            ctx.embedder,
            self.serving,
            self.base_model,
            instruction=spec.instruction,
            max_tokens=spec.rollout_max_tokens,
        )
        # With factors on, rollouts and validation decode with the factors of the experiences in the prompt,
        # weighted as serving weights them, so validation can catch (and revert) harmful ones.
        self._factor_builder = (
            processor_builder(self.llm.backend, self.serving.factor_eta, self.serving.factor_cap)
            if spec.distill_factors
            else None
        )
        # A factor trial needs factors that act (a backend that applies them, eta > 0) and a validation
        # that scores: otherwise new factors start at the neutral confidence, where they weigh nothing.
        self.factor_trials = bool(
            self._factor_builder is not None and self.serving.factor_eta > 0 and self._scored_validation()
        )

    # -- rewards and prompts ------------------------------------------------------------------------

    async def _judge(self, prompt: str) -> str:
        reply = await self.llm.chat(
            [{"role": "user", "content": prompt}], role="judge", max_tokens=self.spec.critic_max_tokens
        )
        return reply.text

    def make_experience(self, text: str, domain: str, **kind: str) -> Experience:
        """A new lesson (or, with kind="example" and answer=..., a worked example) written by this run."""
        return Experience.create(
            text=text,
            domain=domain,
            confidence=INITIAL_CONFIDENCE,
            author=self.ctx.author,
            base_model=self.base_model,
            created_at=self.ctx.created_at,
            **kind,  # type: ignore[arg-type]
        )

    def make_example(self, p: Proposal) -> Experience:
        """The worked example an "example" proposal describes."""
        reasoning = {"reasoning": p.reasoning} if p.reasoning else {}
        return self.make_experience(p.text, p.domain, kind="example", answer=p.answer, **reasoning)

    def _index(self, library: Sequence[Experience]) -> RetrievalIndex | None:
        return self.prompts.index(library)

    def offered(
        self,
        task: Task,
        library: Sequence[Experience],
        index: RetrievalIndex | None,
        *,
        training: bool = False,
    ) -> list[Hit]:
        """What the prompt path retrieves for `task`; for a training rollout, never the task's own worked
        example (under `lookup_start` every training task has one)."""
        return self.prompts.offered(task, library, index, leave_out_own=training)

    def messages(self, task: Task, hits: Sequence[Hit]) -> tuple[list[dict[str, str]], list[Experience]]:
        """The rollout prompt (as many experiences as fit); ContextTooSmall when not even the bare task
        leaves its reply room."""
        try:
            return self.prompts.messages(task, hits)
        except PromptTooLong as e:
            prompt_tokens = int(e.values.get("prompt_tokens", 0))
            raise ContextTooSmall("rollout", prompt_tokens, self.spec.rollout_max_tokens,
                                  self.llm.context_length) from None  # fmt: skip

    def factors_for(self, experiences: Sequence[Experience]) -> Any:
        """The logits processor of these experiences' factors (None: factors off, or none apply)."""
        if self._factor_builder is None or not any(e.factors is not None for e in experiences):
            return None
        return self._factor_builder(experiences)

    # -- validation ---------------------------------------------------------------------------------

    def _scored_validation(self) -> list[Task]:
        if not self.spec.validate_steps:
            return []
        if self.spec.label_free:
            return [t for t in self.validation if t.answer is not None]
        return self.validation

    async def evaluate(self, library: Sequence[Experience], tag: str) -> float | None:
        """Mean reward on the validation split: greedy, one completion a task; None without one."""
        tasks = self._scored_validation()
        if not tasks:
            return None
        index = await asyncio.to_thread(self._index, library)

        async def one(task: Task) -> float:
            messages, used = self.messages(task, self.offered(task, library, index))
            reply = await self.llm.chat(
                messages,
                logits_processor=self.factors_for(used),
                role="validation",
                max_tokens=self.spec.rollout_max_tokens,
                temperature=0.0,
                seed=seed_of("validation", self.spec.seed, tag, task.id),
            )
            results = await ascore_group(self.reward_for(task), task, [reply.text])
            return results[0].score

        scores = await asyncio.gather(*(one(t) for t in tasks))
        return statistics.fmean(scores)

    # -- the run --------------------------------------------------------------------------------------

    async def run(self, state: TrainState | None = None) -> TrainState:
        fresh = state is None
        if state is None:
            state = TrainState(library=list(self.ctx.base.experiences), ledger=self.llm.ledger)
        else:
            self.llm.ledger = state.ledger  # a resumed run keeps counting where the checkpoint stopped
            self.critic.ledger = state.ledger
        await self.emit(
            "started" if fresh else "resumed",
            {
                "train_tasks": len(self.train),
                "validation_tasks": len(self._scored_validation()),
                "epochs": self.spec.epochs,
                "steps_total": self.steps_total,
                "group_size": self.spec.group_size,
                "from_step": state.step,
                "library_size": len(state.library),
            },
        )
        if self.spec.distill_factors and self._factor_builder is None and self.llm.tokenizer is not None:
            note = (
                f"distill_factors: the {self.llm.model_id} backend cannot apply logits processors; "
                "rollouts and validation decode without the factors"
            )
            if note not in state.notes:
                state.notes.append(note)
        if fresh:
            started = time.perf_counter()
            score = await self.evaluate(state.library, "baseline")
            state.baseline_validation_score = state.validation_score = score
            state.wall_s += time.perf_counter() - started
            event = ("baseline", {"validation_score": score})
            await self.checkpoint(0, state.to_json(self.base_model), event)
        while state.step < self.steps_total:
            await self.step(state)
        return state

    async def step(self, state: TrainState) -> None:
        """One step on one batch: the stages the module docstring numbers, in order, then the checkpoint."""
        spec = self.spec
        s = await self._begin(state)
        s.groups = await self._rollouts(s)
        credit_uses(s.groups, state)
        informative = informative_groups(s.groups, spec)
        s.skipped = len(s.groups) - len(informative)
        s.json_before = json_totals(state)
        s.proposed, s.screened = await critique(s, informative, state, spec, self.critic)
        s.proposed += proposed_examples(s.groups, spec)
        s.lessons = await consolidate_lessons(
            s,
            state,
            spec,
            self.critic,
            policy=self.llm,
            embed=self.ctx.embedder.embed,
            make=self.make_experience,
        )
        s.candidates, rejected = candidate_libraries(
            s.library,
            s.lessons,
            s.example_ops,
            state.credit,
            spec,
            make_example=self.make_example,
            factor_trials=self.factor_trials,
        )
        s.rejected = s.screened + rejected
        s.scores_of = await self._validate(s.candidates, s.number)
        s.chosen = choose(
            s.scores_of,
            state.validation_score,
            spec.revert_tolerance,
            {name: size_of(o.experiences) for name, o in s.candidates.items()},
            size_of(s.library),
        )
        keep_chosen(s, state)
        await self._complete(s, state)

    async def _begin(self, state: TrainState) -> StepWork:
        """Before stage 1: the step's batch (from its epoch's seeded shuffle), announced, and the library its
        rollouts and critic see, with its retrieval index."""
        spec = self.spec
        index_in_run = state.step
        epoch, b = divmod(index_in_run, self.per_epoch)
        batch = batches(self.train, spec.batch_size, spec.seed, epoch)[b]
        number = index_in_run + 1
        started = time.perf_counter()
        calls_before = self.llm.ledger.calls
        await self.emit(
            "step_started",
            {
                "epoch": epoch + 1,
                "step": number,
                "steps_total": self.steps_total,
                "tasks": [t.id for t in batch],
            },
        )
        library = list(state.library)
        index = await asyncio.to_thread(self._index, library)
        return StepWork(number, epoch, batch, library, index, started, calls_before)

    async def _rollouts(self, s: StepWork) -> list[Group]:
        """Stages 1 and 2: G rollouts per task with the library in the prompt, their rewards, and the
        group-relative advantages."""
        spec = self.spec
        total = len(s.batch) * spec.group_size
        done = [0]

        async def rollouts(task: Task) -> Group:
            messages, offered = self.messages(task, self.offered(task, s.library, s.index, training=True))
            processor = self.factors_for(offered)

            async def one(g: int) -> str:
                reply = await self.llm.chat(
                    messages,
                    logits_processor=processor,
                    role="rollout",
                    max_tokens=spec.rollout_max_tokens,
                    temperature=spec.temperature,
                    top_p=spec.top_p,
                    seed=seed_of("rollout", spec.seed, s.number, task.id, g),
                )
                return reply.text

            completions = list(await asyncio.gather(*(one(g) for g in range(spec.group_size))))
            results = await ascore_group(self.reward_for(task), task, completions, label_free=spec.label_free)
            offered_ids = [e.id for e in offered]
            used = [parse_citations(c, offered_ids) or offered_ids for c in completions]
            done[0] += len(completions)
            await self.emit(
                "rollouts", {"epoch": s.epoch + 1, "step": s.number, "done": done[0], "total": total}
            )
            scores = [r.score for r in results]
            return Group(task, completions, results, advantages_of(scores), used, offered)

        return list(await asyncio.gather(*(rollouts(t) for t in s.batch)))

    async def _validate(self, candidates: Mapping[str, Outcome], number: int) -> dict[str, float | None]:
        """Stage 5: each candidate's validation score, by name (None without a scored validation split)."""
        if not candidates:
            return {}
        evaluated = await asyncio.gather(
            *(self.evaluate(o.experiences, f"step-{number}-{name}") for name, o in candidates.items())
        )
        return dict(zip(candidates, evaluated, strict=True))

    async def _complete(self, s: StepWork, state: TrainState) -> None:
        """After stage 5: the step's learning-curve point, and the checkpoint of the state it leaves."""
        wall = time.perf_counter() - s.started
        state.wall_s += wall
        calls = self.llm.ledger.calls - s.calls_before
        point = curve_point(s, state, steps_total=self.steps_total, llm_calls=calls, wall=wall)
        state.curve.append(point)
        state.step = s.number
        await self.checkpoint(s.number, state.to_json(self.base_model), ("step_completed", point))
