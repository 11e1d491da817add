"""Training pairs made of completions a verifier passed: rejection sampling (`rft`: sample, keep what
passes, learn it) and the rollouts a library makes successful (`distill`: asked with the library's
experiences in the prompt, learned without them, so what the experiences changed moves into the weights).

Completions are sampled from the job's own policy before any training (its adapters start at zero, so
that is the base model), prompts built by the node's prompt path (trainer/prompting.py), several tasks'
groups in one `generate`, each row seeded by its task (not its batch), as GSPO samples. `on_collect` hears
how far it got: before the first `generate` and after each (`Collected.point`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.rollouts import generate
from zoo.trainer.prompting import Messages, bare_messages
from zoo.trainer.rewards import BaseReward, score_group
from zoo.trainer.schedule import seed_of
from zoo.trainer.sft.pairs import Pair
from zoo.trainer.sft.spec import SftSpec
from zoo.trainer.tasks.schema import Task

TASKS_PER_GENERATE = 8  # bounds the KV cache of one generate call: 8 tasks x `samples` rows

OnCollect = Callable[[dict[str, Any]], None]


@dataclass
class Collected:
    """The pairs kept, and what sampling them cost and found."""

    pairs: list[Pair] = field(default_factory=list)
    tasks: int = 0
    sampled: int = 0
    passed: int = 0  # completions the verifier passed (before the per-task cap and de-duplication)
    tasks_passed: int = 0  # tasks with at least one passing completion

    def to_json(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "sampled": self.sampled, "passed": self.passed,
                "tasks_passed": self.tasks_passed, "kept": len(self.pairs)}  # fmt: skip

    def point(self, done: int, wall_s: float, *, end: bool = False) -> dict[str, Any]:
        """The progress event of a collection `done` tasks in (`end`: the phase is over)."""
        return {"done": done, "total": self.tasks, "sampled": self.sampled, "passed": self.passed,
                "kept": len(self.pairs), "wall_s": round(wall_s, 3), "end": end}  # fmt: skip


class PolicyTokens:
    """What the prompt path needs of a backend (token counts, the context window), from the policy."""

    def __init__(self, policy: LoraPolicy) -> None:
        self.tokenizer = policy.tokenizer
        self.context_length = int(getattr(policy.model.config, "max_position_embeddings", 2048))

    def count_prompt_tokens(self, messages: Messages) -> int:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def verified_pairs(
    policy: LoraPolicy,
    tasks: Sequence[Task],
    spec: SftSpec,
    reward_for: Callable[[Task], BaseReward],
    *,
    prompt_for: Callable[[Task], Messages] | None = None,
    tag: str = "rft",
    on_collect: OnCollect | None = None,
) -> Collected:
    """`spec.samples` completions of every task, asked with `prompt_for(task)` (default: the bare prompt);
    those scoring at least `spec.min_reward` become pairs with the bare prompt, at most `spec.per_task`
    distinct ones per task. `on_collect` is told the counts so far before the first chunk of tasks and
    after each."""
    out = Collected(tasks=len(tasks))
    started = time.perf_counter()
    if on_collect is not None:
        on_collect(out.point(0, 0.0))
    for start in range(0, len(tasks), TASKS_PER_GENERATE):
        part = list(tasks[start : start + TASKS_PER_GENERATE])
        chats = [prompt_for(t) if prompt_for else bare_messages(t, spec.instruction) for t in part]
        rows = generate(
            policy,
            part,
            group_size=spec.samples,
            max_new_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=1.0,
            seeds=[seed_of(tag, spec.seed, t.id) for t in part],
            chats=chats,
        )
        n = spec.samples
        for i, task in enumerate(part):
            completions = rows.completions[i * n : (i + 1) * n]
            scores = [r.score for r in score_group(reward_for(task), task, completions)]
            out.sampled += len(completions)
            kept: list[str] = []
            for text, score in zip(completions, scores, strict=True):
                if score >= spec.min_reward and text.strip():
                    out.passed += 1
                    if text not in kept and len(kept) < spec.per_task:
                        kept.append(text)
                        out.pairs.append(
                            Pair(task.id, bare_messages(task, spec.instruction), text, "rollout", score)
                        )
            out.tasks_passed += bool(kept)
        if on_collect is not None:
            on_collect(out.point(start + len(part), time.perf_counter() - started))
    return out
