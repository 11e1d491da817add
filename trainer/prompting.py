"""The node's prompt path for a given library, outside the daemon: retrieve a task's top-k experiences,
assemble them into its prompt as serving does (lesson position, experience budget, worked examples as
earlier turns), under the task's instruction.

Everything that scores or learns from a library goes through here (TF-GRPO's rollouts and validation,
`zoo-node eval`, distillation's rollouts), so a figure measured offline is what a client of the node
would see with the same library and serving settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from zoo.inference.defaults import ServingDefaults
from zoo.inference.prompt import assemble
from zoo.inference.retrieval import Hit, RetrievalIndex
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.trainer.tasks.schema import Task, instruction_for

Messages = list[dict[str, str]]


class MemoryVectors:
    """Experience vectors kept for a run, so a retrieval index over a library that changes step by step
    only embeds new experiences (the EmbeddingCache interface RetrievalIndex.build takes, without the
    SQLite file)."""

    def __init__(self) -> None:
        self._vectors: dict[tuple[str, str], np.ndarray] = {}

    def get_many(self, model: str, ids: Iterable[str], dim: int | None = None) -> dict[str, np.ndarray]:
        found = {i: v for i in ids if (v := self._vectors.get((model, i))) is not None}
        return {i: v for i, v in found.items() if dim is None or v.shape == (dim,)}

    def put_many(self, model: str, vectors: Mapping[str, np.ndarray]) -> None:
        for i, v in vectors.items():
            self._vectors[(model, i)] = v


class PromptPath:
    """How a task is asked of `backend` with a library in the prompt, exactly as the node serves it."""

    def __init__(
        self,
        backend: Any,
        embedder: Any,
        serving: ServingDefaults,
        base_model: str,
        *,
        instruction: str | None = None,
        max_tokens: int = 256,
    ) -> None:
        self.backend = backend
        self.embedder = embedder
        self.serving = serving
        self.base_model = base_model
        self.instruction = instruction  # for tasks without their own
        self.max_tokens = max_tokens  # the answer's room, which the experience budget must leave
        self._vectors = MemoryVectors()

    @property
    def k(self) -> int:
        return self.serving.k

    def index(self, library: Sequence[Experience]) -> RetrievalIndex | None:
        """The retrieval index of `library` (None when nothing is retrieved: empty, or k = 0). Ranked by
        similarity even when every experience fits: the prompt puts the closest worked example right
        before the question, which is the one a small model copies."""
        if not library or self.k == 0:
            return None
        lib = Library.create(version=1, base_model=self.base_model, experiences=library)
        return RetrievalIndex.build(lib, self.embedder, self._vectors)  # type: ignore[arg-type]

    def offered(
        self,
        task: Task,
        library: Sequence[Experience],
        index: RetrievalIndex | None,
        *,
        leave_out_own: bool = False,
    ) -> list[Hit]:
        """The experiences retrieved for `task`, best first, those below the relevance gate left out. With
        `leave_out_own`, a worked example of this very question is left out too (the next one moves up):
        training rollouts that could copy their own reference answer would all succeed and teach nothing."""
        if self.k == 0 or not library:
            return []
        own = task.question.strip() if leave_out_own else None

        def mine(h: Hit) -> bool:
            return h.experience.kind == "example" and h.experience.text == own

        if index is None:
            return [h for e in library if not mine(h := Hit(e, 1.0))]
        extra = 1 if leave_out_own else 0
        hits = index.search(task.question, k=self.k + extra, min_score=self.serving.min_similarity)
        return [h for h in hits if not mine(h)][: self.k]

    def messages(self, task: Task, hits: Sequence[Hit]) -> tuple[Messages, list[Experience]]:
        """The prompt for `task` with `hits` assembled into it, and the experiences that fitted."""
        instruction = instruction_for(task, self.instruction)
        base = [{"role": "system", "content": instruction}, {"role": "user", "content": task.question}]
        assembled = assemble(
            base,
            hits,
            self.backend.count_prompt_tokens,
            experience_budget=self.serving.experience_budget_tokens,
            context_length=self.backend.context_length,
            max_tokens=self.max_tokens,
            lesson_position=self.serving.lesson_position,
        )
        return assembled.messages, [h.experience for h in assembled.used]


def bare_messages(task: Task, instruction: str | None = None) -> Messages:
    """The prompt for `task` with no library: its instruction and its question."""
    return [
        {"role": "system", "content": instruction_for(task, instruction)},
        {"role": "user", "content": task.question},
    ]
