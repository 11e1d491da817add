"""What a Nano episode is made of: the task it is given, its limits, its transcript's messages (each with
who produced it), its state, and what a step returns. The environment that runs it is nano.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from zoo.trainer.rewards.patch import parse_patch
from zoo.trainer.tasks.schema import ID_RE, Task

TokenCounter = Callable[[str], int]
Origin = Literal["model", "environment"]
EndReason = Literal["finished", "tool_call_limit", "token_budget", "wall_clock"]


def approximate_token_count(text: str) -> int:
    """About four characters a token; pass `lambda s: len(tokenizer.encode(s))` for exact budgets."""
    return (len(text) + 3) // 4


class NanoTask(BaseModel):
    """One task: an issue against a repository at a buggy commit, and the patch that fixes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=f"^{ID_RE.pattern}$")
    issue: str = Field(min_length=1, max_length=20_000)
    repo: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a folder name under the repos dir
    buggy_ref: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")  # commit id, tag or branch
    patch: str = Field(min_length=1, max_length=100_000)  # ground truth, a unified diff
    test_command: str = Field(min_length=1)  # fails at buggy_ref, passes with the patch

    @field_validator("patch")
    @classmethod
    def _patch_names_files(cls, value: str) -> str:
        kind, files = parse_patch(value)
        if kind != "diff" or not files:
            raise ValueError("must be a unified diff that changes at least one file")
        return value

    def reward_task(self) -> Task:
        """The task as the reward sees it: the issue as question, the ground-truth patch as answer."""
        return Task(
            id=self.id,
            question=self.issue,
            answer=self.patch,
            domain="code.python",
            verifier="patch_similarity",
        )


class NanoLimits(BaseModel):
    """Per-episode limits; nano.py's docstring says what happens at and near each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tool_calls: int = Field(30, ge=1)
    token_budget: int = Field(16_000, ge=1)
    wall_clock_s: float = Field(600.0, gt=0)
    shell_timeout_s: float = Field(30.0, gt=0)
    output_chars: int = Field(2_000, ge=100)
    warn_at: float = Field(0.8, gt=0, le=1)


@dataclass(frozen=True)
class Message:
    """A transcript message and who produced it (only "model" messages carry trainable tokens)."""

    role: str
    content: str
    origin: Origin

    def chat(self) -> dict[str, str]:
        """The message as a chat template takes it."""
        return {"role": self.role, "content": self.content}


@dataclass
class StepResult:
    messages: list[Message]  # what the environment answered (empty when the model finished)
    warnings: list[str]
    done: bool
    end_reason: EndReason | None = None


@dataclass
class Episode:
    """The state of one episode; `transcript` is the whole conversation in order."""

    task: NanoTask
    workdir: Path  # throwaway; holds the clone, HOME and TMPDIR
    clone: Path
    base_commit: str
    started: float  # time.monotonic() at reset
    transcript: list[Message] = field(default_factory=list)
    tool_calls_used: int = 0
    tokens_used: int = 0
    warned: set[str] = field(default_factory=set)
    done: bool = False
    end_reason: EndReason | None = None

    def chat(self) -> list[dict[str, str]]:
        return [m.chat() for m in self.transcript]
