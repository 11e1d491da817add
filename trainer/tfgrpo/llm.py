"""The trainer's LLM caller: one backend, a bound on calls in flight, and a ledger of what they cost.

Every rollout, summary, comparison and merge goes through `LLM.chat`, so the job report's cost (calls,
tokens, time spent generating, per role) is counted in one place. The bound matters for remote backends
(an OpenAI-compatible server runs rollouts concurrently up to it); the local transformers backend
serialises generation itself, so a higher bound only queues there.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from zoo.inference.backend_protocol import (
    Backend,
    GenerationRequest,
    GenerationResult,
    ResponseFormat,
    generate,
)
from zoo.registry.errors import ZooError

# What each role's prompt and reply are bounded by, for the message that names what to change.
SETTINGS = {
    "rollout": "rollout_max_tokens, or fewer experiences a prompt (top_k)",
    "validation": "rollout_max_tokens, or fewer experiences a prompt (top_k)",
    "summarise": "critic_max_tokens or rollout_max_tokens",
    "compare": "critic_max_tokens or group_size",
    "consolidate": "critic_max_tokens",
}


class ContextTooSmall(ZooError):
    """A job's LLM call cannot fit the model's context, even after its caller fitted what it could."""

    def __init__(self, role: str, prompt_tokens: int, max_tokens: int, context: int) -> None:
        super().__init__(
            f"a {role} call needs {prompt_tokens} prompt tokens and up to {max_tokens} for its reply, but "
            f"the model serves {context} tokens a request: raise model.context_length, or lower "
            f"{SETTINGS.get(role, 'its token limits')}",
            role=role,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            context=context,
        )


@dataclass
class RoleCost:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass
class Ledger:
    """LLM usage per role ("rollout", "validation", "summarise", "compare", "consolidate")."""

    roles: dict[str, RoleCost] = field(default_factory=lambda: defaultdict(RoleCost))

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.roles.values())

    @property
    def tokens(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self.roles.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": sum(r.prompt_tokens for r in self.roles.values()),
            "completion_tokens": sum(r.completion_tokens for r in self.roles.values()),
            "roles": {
                name: {
                    "calls": r.calls,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "seconds": round(r.seconds, 3),
                }
                for name, r in sorted(self.roles.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Ledger:
        ledger = cls()
        for name, r in ((data or {}).get("roles") or {}).items():
            ledger.roles[name] = RoleCost(
                int(r["calls"]), int(r["prompt_tokens"]), int(r["completion_tokens"]), float(r["seconds"])
            )
        return ledger


class LLM:
    """Chat completions through a backend, at most `concurrency` at a time, each one accounted."""

    def __init__(self, backend: Backend, concurrency: int = 4, ledger: Ledger | None = None) -> None:
        self.backend = backend
        self.ledger = ledger or Ledger()
        self._slots = asyncio.Semaphore(concurrency)

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    @property
    def context_length(self) -> int:
        """Tokens one request may hold, prompt and reply together."""
        return int(getattr(self.backend, "context_length", 0)) or 1 << 30

    def overflow(self, messages: list[dict[str, str]], max_tokens: int) -> int:
        """Tokens by which a prompt and its whole reply exceed the context (0 or less: they fit)."""
        return self.backend.count_prompt_tokens(messages) + max_tokens - self.context_length

    @property
    def constrains_json(self) -> bool:
        """Whether a response_format is enforced while decoding (local backends), so JSON always parses."""
        return bool(getattr(self.backend, "constrains_json", False))

    @property
    def tokenizer(self) -> Any:
        """The local tokenizer when the backend has one (needed to distill token-level factors)."""
        return getattr(self.backend, "tokenizer", None)

    async def chat(
        self,
        messages: list[dict[str, str]],
        *,
        role: str,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        response_format: ResponseFormat | None = None,
        logits_processor: Any = None,
        adapter: Any = None,
    ) -> GenerationResult:
        request = GenerationRequest(
            messages,
            max_tokens,
            temperature,
            top_p,
            seed,
            logits_processor=logits_processor,
            response_format=response_format,
            adapter=adapter,
        )
        # A call that does not fit is refused here, naming what to change, not by the backend mid-step.
        prompt_tokens = self.backend.count_prompt_tokens(messages)
        if prompt_tokens + max_tokens > self.context_length:
            raise ContextTooSmall(role, prompt_tokens, max_tokens, self.context_length)
        async with self._slots:
            started = time.perf_counter()
            result = await generate(self.backend, request)
            spent = time.perf_counter() - started
        cost = self.ledger.roles[role]
        cost.calls += 1
        cost.prompt_tokens += result.prompt_tokens
        cost.completion_tokens += result.completion_tokens
        cost.seconds += spent
        return result
