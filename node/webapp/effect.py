"""A library proposal's measured effect for the web app, as `zoo-node dao review --eval` measures it: the
parent version (A) and the proposed one (B) scored on one of the task files this node ships, through this
node's own model and prompt path (trainer/evaluate.py), with the paired difference B - A and its interval.

It costs the node's model time, so the work is bounded: it is asked for by proposal id (the CIDs are read
from the chain, never taken from the request), task files are the shipped ones only (named, never
uploaded), one evaluation runs at a time, and each result is kept by (parent CID, proposed CID, task file),
so one proposal's effect on one task file is computed once; with server.api_key set, only holders of the
key may ask (site.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from zoo.registry.canonical import decode_library
from zoo.registry.errors import NotFound, Overloaded, ValidationError
from zoo.registry.experience import Experience
from zoo.registry.ipfs import local_cid
from zoo.registry.library import Library
from zoo.trainer.tasks.schema import DATA_DIR

TASK_NAME = re.compile(r"[a-z0-9_-]+(/[a-z0-9_-]+)?")
PROPOSAL_ID = re.compile(r"0x[0-9a-fA-F]{64}")
MAX_TOKENS = 128  # per answer: the shipped tasks answer in a few words or a short function
MAX_KEPT = 256  # results remembered


def task_files() -> list[str]:
    """The shipped task files by name (`families/habitats-test`: trainer/tasks/data/families/...jsonl)."""
    return sorted(str(p.relative_to(DATA_DIR).with_suffix("")) for p in DATA_DIR.rglob("*.jsonl"))


def _check_task(task: str) -> None:
    if not TASK_NAME.fullmatch(task) or task not in task_files():
        raise ValidationError("task", f"{task[:80]!r} is not a task file this node ships ({task_files()})")


class Effects:
    """Measures and remembers proposals' effects on this node's model (None while it serves none)."""

    def __init__(
        self,
        backend: Callable[[], Any],
        embedder: Callable[[], Any],
        serving: Any,
        model_id: str,
        fetch_cid: Callable[[str], Awaitable[bytes]],
        library_cids: Callable[[int], Awaitable[tuple[str, str]]],
        current_cid: Callable[[], Awaitable[str]],
    ) -> None:
        self.backend, self.embedder, self.serving, self.model_id = backend, embedder, serving, model_id
        self.fetch_cid = fetch_cid
        self.library_cids = library_cids  # a library proposal's (parent CID or "", CID), from the chain
        self.current_cid = current_cid  # the current version's CID ("" before the first), from the chain
        self._lock = asyncio.Lock()
        self._kept: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def measure(self, proposal: str, task: str) -> dict[str, Any]:
        """B - A of library proposal `proposal` (0x + 64 hex) on `task` (a name of task_files())."""
        _check_task(task)
        if not PROPOSAL_ID.fullmatch(proposal):
            raise ValidationError(
                "proposal", f"{proposal[:80]!r} is not a proposal id (0x and 64 hex digits)"
            )
        parent_cid, cid = await self.library_cids(int(proposal, 16))
        return await self._kept_or_measured(parent_cid, cid, task)

    async def measure_draft(self, document: bytes, task: str) -> dict[str, Any]:
        """B - A of a contributor's draft (its canonical bytes) against the current version on `task`: what
        its proposal would measure, before it is made (the same result once it is, kept by the same CIDs)."""
        _check_task(task)
        draft = await asyncio.to_thread(decode_library, document, max_size=len(document))  # else 400
        return await self._kept_or_measured(await self.current_cid(), local_cid(document), task, draft)

    async def _kept_or_measured(
        self, parent_cid: str, cid: str, task: str, draft: Library | None = None
    ) -> dict[str, Any]:
        key = (parent_cid, cid, task)
        if key in self._kept:
            return self._kept[key]
        backend = self.backend()
        if backend is None:
            raise NotFound("this node serves no model now (a light node, or still loading): ask a full node")
        if self._lock.locked():
            raise Overloaded("another proposal's effect is being measured: ask again in a minute")
        async with self._lock:
            result = await self._measure(backend, parent_cid, cid, task, draft)
        if len(self._kept) >= MAX_KEPT:
            self._kept.pop(next(iter(self._kept)))
        self._kept[key] = result
        return result

    async def _measure(
        self, backend: Any, parent_cid: str, cid: str, task: str, draft: Library | None
    ) -> dict[str, Any]:
        from zoo.trainer.evaluate import Scorer, report
        from zoo.trainer.prompting import PromptPath
        from zoo.trainer.tasks.loading import load_jsonl
        from zoo.trainer.tfgrpo.llm import LLM

        tasks = await asyncio.to_thread(load_jsonl, DATA_DIR / f"{task}.jsonl")
        sides: list[tuple[str, Sequence[Experience]]] = []
        for which, given in ((parent_cid, None), (cid, draft)):
            if not which:  # a proposal on version 0: A is the model with no library
                sides.append(("none", ()))
                continue
            library = given or await asyncio.to_thread(decode_library, await self.fetch_cid(which))
            sides.append((which, library.experiences))
        embedder = self.embedder()
        if embedder is None and any(experiences for _, experiences in sides):
            raise NotFound("this node's embedder is still loading: ask again in a minute")
        prompts = PromptPath(backend, embedder, self.serving, self.model_id, max_tokens=MAX_TOKENS)
        # Half the batch: answers to clients keep room beside the evaluation.
        concurrency = max(1, int(getattr(backend, "max_batch_size", 4)) // 2)
        scorer = Scorer(LLM(backend, concurrency=concurrency), prompts, max_tokens=MAX_TOKENS)
        runs = []
        for which, experiences in sides:
            started = time.perf_counter()
            scores = await scorer.score_tasks(tasks, experiences)
            runs.append(({"library": which, "model": self.model_id}, scores, time.perf_counter() - started))
        return {"task": task, "parent_cid": parent_cid, "cid": cid, **report(runs)}
