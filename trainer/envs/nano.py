"""The Nano coding environment: a policy fixes an issue in a throwaway git clone using two tools.

An episode (`NanoEnv.reset(task)`) clones the task's repository at its buggy commit into a fresh temporary
directory and opens the chat with a system message (the tools, the call format, the limits) and the issue.
Each `step(assistant_text)` runs the tool calls in the model's message (format: tool_calls.py) and answers
with one message holding their results. The episode ends when a message calls no tool, or at a limit.
The answer is not text the model wrote but `diff()`: `git diff` of the clone against the buggy commit,
new files included. `reward()` scores that diff with the existing patch_similarity reward (thesis
eq. 3.1, zoo.trainer.rewards) against the task's ground-truth patch. Every transcript message records who
produced it (`origin`: "model" or "environment"), so a trainer can mask the loss to the model's tokens.

Tools
- shell(cmd): `bash -c cmd` with the clone as working directory, a per-call timeout after which the
  whole process group is killed with SIGKILL (anything the command left running in the background is
  killed after every call too), stdout and stderr together cut to the first and last halves of
  `output_chars` characters with a `[... output truncated: N characters omitted ...]` marker, and the
  exit code reported. The environment is built from scratch (PATH with this interpreter's directory
  first, HOME and TMPDIR in the episode's directory outside the clone, a UTF-8 locale, no .pyc files),
  so no variable of the trainer (keys, tokens, proxies) reaches the command.
- apply_patch(path, old_content, new_content): a literal search and replace. The path (relative to the
  clone, or absolute) is resolved with every symlink, parents included, and must land inside the clone
  and outside `.git`. `old_content` must occur exactly once (overlapping occurrences count); 0 or several
  occurrences is an error naming the count. An empty `old_content` creates a missing file (parent
  directories too) or fills an empty one; on a non-empty file it is an error. Every problem comes back
  as a tool result starting with "Error:"; nothing the model does raises.

No network. Commands run in a network namespace of their own that has only a loopback interface, which
is down, so every connection fails ("Network is unreachable"), DNS included. The first launcher that
works here is used, probed once per process: `unshare --net` (root, or CAP_SYS_ADMIN), else
`unshare --user --map-root-user --net` (an unprivileged user namespace; the command then sees itself as
root of that namespace but keeps the real user's rights on files). When neither works, `NanoEnv` refuses
to start (`NetworkIsolationUnavailable`) unless built with `require_network_isolation=False`; then
commands run with the network of the host, which is logged and visible as `network_isolated = False`.
The git commands the environment itself runs in the clone after reset (`git add`, `git diff`) go
through the same launcher, so hooks, filters or config the model planted run no more freely than its
own shell calls.

This is network isolation, not a sandbox: commands run with the trainer's user rights and can read and
write outside the clone (the path rule binds apply_patch only), and a process that starts its own
session escapes the group kill. Untrusted policies belong in a container or VM as well.

Limits (`NanoLimits`): at most `max_tool_calls` calls (malformed ones count), a token budget over every
message of the transcript (system, issue, model turns and tool results, measured by a pluggable counter;
the default is about four characters a token), and a wall-clock limit from reset that also caps each
shell call's timeout. At `warn_at` (80%) of a limit, the next results message carries a warning, once per
limit. Reaching a limit ends the episode cleanly: calls beyond the call limit or the time are not run
(their results say so), a model message that overruns the token budget has none of its calls run, and
the step returns done with `end_reason` naming the limit.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from zoo.registry.errors import ZooError
from zoo.trainer.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    ToolParameter,
    ToolSpec,
    parse_tool_calls,
    tool_results_message,
    tools_prompt,
)
from zoo.trainer.rewards import RewardResult, get_reward
from zoo.trainer.rewards.patch import parse_patch
from zoo.trainer.tasks.schema import ID_RE, Task

log = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]
Origin = Literal["model", "environment"]
EndReason = Literal["finished", "tool_call_limit", "token_budget", "wall_clock"]

GIT_TIMEOUT_S = 60.0
_NETWORK_LAUNCHERS: tuple[tuple[str, ...], ...] = (
    ("unshare", "--net"),
    ("unshare", "--user", "--map-root-user", "--net"),
)

SHELL_TOOL = ToolSpec(
    name="shell",
    description="Run a bash command in the repository (no network). Returns the exit code and output.",
    parameters=(ToolParameter("cmd", "string", "the bash command line"),),
)
APPLY_PATCH_TOOL = ToolSpec(
    name="apply_patch",
    description=(
        "Edit a file: replace old_content, which must occur exactly once in the file, with new_content. "
        "An empty old_content creates a new file."
    ),
    parameters=(
        ToolParameter("path", "string", "file path relative to the repository root"),
        ToolParameter("old_content", "string", "exact text to replace (unique in the file)"),
        ToolParameter("new_content", "string", "the replacement text"),
    ),
)
TOOLS: tuple[ToolSpec, ...] = (SHELL_TOOL, APPLY_PATCH_TOOL)


def approximate_token_count(text: str) -> int:
    """About four characters a token; pass `lambda s: len(tokenizer.encode(s))` for exact budgets."""
    return (len(text) + 3) // 4


class NetworkIsolationUnavailable(ZooError, RuntimeError):
    """No way to run commands without network was found on this machine."""


# ------------------------------------------------------------------------------------------------ data


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
    """Per-episode limits; see the module docstring for what happens at and near each."""

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


# ------------------------------------------------------------------------------------- running commands


@functools.cache
def network_isolation_prefix() -> tuple[str, ...] | None:
    """The first launcher prefix that runs a command in a new network namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in _NETWORK_LAUNCHERS:
        try:
            probe = subprocess.run(
                [*prefix, "true"], capture_output=True, timeout=10, check=False, env={"PATH": _base_path()}
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def _base_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed at its timeout
    output: str  # stdout and stderr interleaved, possibly truncated
    timed_out: bool
    omitted_chars: int = 0


class _OutputCapture:
    """Keeps the first and last halves of `limit` characters of a stream and counts what falls between."""

    def __init__(self, limit: int | None) -> None:
        self._head_limit = limit // 2 if limit is not None else None
        self._tail_limit = limit - limit // 2 if limit is not None else 0
        self._head: list[str] = []
        self._head_chars = 0
        self._tail = ""
        self._total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        self._total += len(text)
        if self._head_limit is None or self._head_chars < self._head_limit:
            take = text if self._head_limit is None else text[: self._head_limit - self._head_chars]
            self._head.append(take)
            self._head_chars += len(take)
            text = text[len(take) :]
        if text:
            self._tail = (self._tail + text)[-self._tail_limit :]

    def result(self) -> tuple[str, int]:
        omitted = self._total - self._head_chars - len(self._tail)
        head = "".join(self._head)
        if omitted <= 0:
            return head + self._tail, 0
        return f"{head}\n[... output truncated: {omitted} characters omitted ...]\n{self._tail}", omitted


def run_command(
    argv: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float, output_chars: int | None
) -> CommandResult:
    """Run argv in its own session; SIGKILL its whole process group at the timeout and afterwards."""
    capture = _OutputCapture(output_chars)
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    stream = proc.stdout

    def pump() -> None:
        while chunk := stream.read1(65536):
            capture.feed(chunk)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(timeout_s, 0.01))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill()
        proc.wait()
    # A process that left the group (setsid) may hold the pipe open: give up on it rather than hang.
    reader.join(timeout=2)
    if not reader.is_alive():
        capture.feed(b"", final=True)
        stream.close()
    output, omitted = capture.result()
    return CommandResult(None if timed_out else proc.returncode, output, timed_out, omitted)


# ------------------------------------------------------------------------------------------- apply_patch


def _occurrences(text: str, part: str) -> int:
    count, index = 0, text.find(part)
    while index != -1:
        count += 1
        index = text.find(part, index + 1)
    return count


def _lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def apply_patch(root: Path, path: str, old_content: str, new_content: str) -> str:
    """Replace the single occurrence of old_content in root/path; returns the tool result text."""
    root = root.resolve()
    if not path.strip() or "\x00" in path:
        return "Error: path is empty or invalid."
    try:
        target = (root / path).resolve()
    except (OSError, RuntimeError) as exc:
        return f"Error: cannot resolve {path!r}: {exc}"
    if not target.is_relative_to(root):
        return f"Error: {path!r} is outside the repository; only files inside it can be edited."
    relative = target.relative_to(root)
    if not relative.parts:
        return f"Error: {path!r} is the repository itself, not a file."
    if relative.parts[0] == ".git":
        return f"Error: {path!r} is inside .git; edit the working tree only."
    shown = relative.as_posix()
    try:
        if target.is_dir():
            return f"Error: {shown} is a directory."
        if not target.exists():
            if old_content:
                return (
                    f"Error: {shown} does not exist. To create it, call apply_patch with an empty "
                    "old_content and the file's text as new_content."
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(new_content.encode("utf-8"))
            return f"Created {shown} ({_lines(new_content)} lines)."
        try:
            text = target.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return f"Error: {shown} is not a UTF-8 text file."
        if not old_content:
            if text:
                return (
                    f"Error: old_content is empty but {shown} is not; give a piece of the file that occurs "
                    "exactly once (an empty old_content only creates a file or fills an empty one)."
                )
            target.write_bytes(new_content.encode("utf-8"))
            return f"Wrote {shown} ({_lines(new_content)} lines)."
        count = _occurrences(text, old_content)
        if count == 0:
            return f"Error: old_content was not found in {shown}; it must match the file exactly."
        if count > 1:
            return (
                f"Error: old_content occurs {count} times in {shown}; include more surrounding lines so "
                "that it occurs exactly once."
            )
        target.write_bytes(text.replace(old_content, new_content, 1).encode("utf-8"))
    except OSError as exc:
        return f"Error: cannot edit {shown}: {exc.strerror or exc}"
    return f"Edited {shown}: replaced {_lines(old_content)} line(s) with {_lines(new_content)} line(s)."


# ---------------------------------------------------------------------------------------------- the env


SYSTEM_INSTRUCTION = """You fix bugs in a git repository. The repository is checked out in your working \
directory. Read the issue, explore the code with the shell tool, edit files with apply_patch (or shell), \
and run the tests to check your fix. When you are done, reply without calling any tool: the changes in \
the working tree (git diff) are your answer.

{tools}

Limits: {max_tool_calls} tool calls in all; each shell command is stopped after {timeout:g} seconds; \
there is no network; shell output longer than {output_chars} characters is cut in the middle."""


class NanoEnv:
    """Runs Nano episodes, one at a time, in throwaway clones of the repositories under `repos_dir`."""

    def __init__(
        self,
        repos_dir: Path,
        *,
        limits: NanoLimits | None = None,
        token_counter: TokenCounter = approximate_token_count,
        work_root: Path | None = None,
        require_network_isolation: bool = True,
    ) -> None:
        self.repos_dir = Path(repos_dir)
        self.limits = limits or NanoLimits()
        self.token_counter = token_counter
        self.work_root = work_root
        self._launcher = network_isolation_prefix()
        if self._launcher is None:
            if require_network_isolation:
                raise NetworkIsolationUnavailable(
                    "cannot create a network namespace here (tried `unshare --net` and "
                    "`unshare --user --map-root-user --net`); pass require_network_isolation=False to run "
                    "shell commands with the host's network"
                )
            log.warning("Nano shell commands will run WITH network access: no network namespace available")
        self.episode: Episode | None = None

    @property
    def network_isolated(self) -> bool:
        return self._launcher is not None

    # ---------------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> NanoEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reset(self, task: NanoTask) -> list[Message]:
        """Start an episode on `task` (closing any previous one); returns the opening messages."""
        self.close()
        self.episode = None
        source = self.repos_dir / task.repo
        if not source.is_dir():
            raise FileNotFoundError(f"task repository {source} does not exist (see nano_repos)")
        workdir = Path(tempfile.mkdtemp(prefix=f"nano-{task.id}-", dir=self.work_root))
        try:
            clone = workdir / "repo"
            for name in ("home", "tmp"):
                (workdir / name).mkdir()
            self._trusted_git(
                workdir, "clone", "--quiet", "--no-hardlinks", "--no-checkout", str(source), "repo"
            )
            self._trusted_git(clone, "checkout", "--quiet", "--detach", task.buggy_ref)
            self._trusted_git(clone, "remote", "remove", "origin")
            base_commit = self._trusted_git(clone, "rev-parse", "HEAD").strip()
        except BaseException:
            _remove_tree(workdir)
            raise
        self.episode = Episode(task, workdir, clone, base_commit, started=time.monotonic())
        limits = self.limits
        system = SYSTEM_INSTRUCTION.format(
            tools=tools_prompt(TOOLS),
            max_tool_calls=limits.max_tool_calls,
            timeout=limits.shell_timeout_s,
            output_chars=limits.output_chars,
        )
        issue = (
            f"Issue in the repository {task.repo}:\n\n{task.issue}\n\n"
            f"The repository's tests run with: {task.test_command}"
        )
        opening = [Message("system", system, "environment"), Message("user", issue, "environment")]
        for message in opening:
            self._record(message)
        return opening

    def close(self) -> None:
        """Remove the current episode's clone and scratch directories (the transcript stays readable)."""
        if self.episode is not None and self.episode.workdir.exists():
            _remove_tree(self.episode.workdir)

    # --------------------------------------------------------------------------------------------- step

    def step(self, assistant_message: str) -> StepResult:
        """Run the tool calls of the model's message; done when it calls none or a limit is reached."""
        episode = self._current()
        if episode.done:
            raise RuntimeError("the episode has ended; call reset() to start another")
        self._record(Message("assistant", assistant_message, "model"))
        calls = parse_tool_calls(assistant_message, TOOLS)
        if not calls:
            return self._finish("finished", [])
        if episode.tokens_used >= self.limits.token_budget:
            return self._finish("token_budget", [])

        results: list[str] = []
        end_reason: EndReason | None = None
        for call in calls:
            if end_reason is not None:
                results.append(f"Error: not run: {_END_TEXT[end_reason]}.")
                continue
            if self._seconds_left() <= 0:
                end_reason = "wall_clock"
                results.append(f"Error: not run: {_END_TEXT[end_reason]}.")
                continue
            episode.tool_calls_used += 1
            results.append(self._run_call(call))
            if episode.tool_calls_used >= self.limits.max_tool_calls:
                end_reason = "tool_call_limit"
        if end_reason is None and self._seconds_left() <= 0:
            end_reason = "wall_clock"

        notes = self._limit_warnings()
        if end_reason is None and self._tokens_after(results, notes) >= self.limits.token_budget:
            end_reason = "token_budget"
        if end_reason is not None:
            notes = [f"[episode ended: {_END_TEXT[end_reason]}]"]
        chat = tool_results_message(results, notes)
        message = Message(chat["role"], chat["content"], "environment")
        self._record(message)
        if end_reason is not None:
            return self._finish(end_reason, [message])
        return StepResult([message], notes, done=False)

    def _run_call(self, call: ToolCall | ToolCallError) -> str:
        if isinstance(call, ToolCallError):
            return f"Error: {call.message}"
        if call.name == SHELL_TOOL.name:
            return self._shell(call.arguments["cmd"])
        args = call.arguments
        return apply_patch(self._current().clone, args["path"], args["old_content"], args["new_content"])

    def _shell(self, cmd: str) -> str:
        timeout = min(self.limits.shell_timeout_s, self._seconds_left())
        try:
            result = self.run_in_clone(
                ["bash", "--noprofile", "--norc", "-c", cmd], timeout, self.limits.output_chars
            )
        except OSError as exc:  # e.g. the model removed the clone directory itself
            return f"Error: cannot run the command: {exc.strerror or exc}"
        if result.timed_out:
            status = f"timed out after {timeout:g} s; the command and everything it started were killed"
        else:
            status = f"exit code: {result.exit_code}"
        return f"{status}\n{result.output}" if result.output else status

    # ------------------------------------------------------------------------------------------- limits

    def _seconds_left(self) -> float:
        return self.limits.wall_clock_s - (time.monotonic() - self._current().started)

    def _tokens_after(self, results: list[str], notes: list[str]) -> int:
        return self._current().tokens_used + self.token_counter(
            tool_results_message(results, notes)["content"]
        )

    def _limit_warnings(self) -> list[str]:
        episode, limits = self._current(), self.limits
        usage = {
            "tool calls": (episode.tool_calls_used, limits.max_tool_calls, ""),
            "tokens": (episode.tokens_used, limits.token_budget, " (approximately)"),
            "seconds": (time.monotonic() - episode.started, limits.wall_clock_s, ""),
        }
        warnings = []
        for name, (used, limit, note) in usage.items():
            if name not in episode.warned and used >= limits.warn_at * limit:
                episode.warned.add(name)
                warnings.append(
                    f"[warning] {used:.0f} of {limit:g} {name} used{note}; the episode ends at the limit. "
                    "Finish your fix soon."
                )
        return warnings

    def _finish(self, reason: EndReason, messages: list[Message]) -> StepResult:
        episode = self._current()
        episode.done, episode.end_reason = True, reason
        return StepResult(messages, [], done=True, end_reason=reason)

    # ------------------------------------------------------------------------------------ diff, reward

    def diff(self) -> str:
        """`git diff` of the clone against the buggy commit, untracked files included ("" if git fails)."""
        episode = self._current()
        out = episode.workdir / "diff.patch"
        out.unlink(missing_ok=True)
        # Options pin the format whatever the model wrote into .git/config (prefixes, renames, drivers).
        git = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"]
        diff_options = [
            "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.relative=false",
            "diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
            "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/", f"--output={out}",
        ]  # fmt: skip
        try:
            add = self.run_in_clone([*git, "add", "--all"], GIT_TIMEOUT_S, 2_000)
            diff = self.run_in_clone([*git, *diff_options, episode.base_commit], GIT_TIMEOUT_S, 2_000)
        except OSError as exc:
            log.warning("git diff failed in %s: %s", episode.clone, exc)
            return ""
        if add.exit_code != 0 or diff.exit_code != 0 or not out.is_file():
            log.warning("git diff failed in %s: %s", episode.clone, (add.output + diff.output).strip()[:500])
            return ""
        return out.read_bytes().decode("utf-8", errors="replace")

    def reward(self, diff: str | None = None) -> RewardResult:
        """patch_similarity of the episode's diff (or the one given) against the ground-truth patch."""
        task = self._current().task
        return get_reward("patch_similarity").score(task.reward_task(), self.diff() if diff is None else diff)

    def run_tests(self, timeout_s: float = 120.0) -> CommandResult:
        """Run the task's test command in the clone, under the same isolation as shell calls."""
        command = self._current().task.test_command
        return self.run_in_clone(["bash", "--noprofile", "--norc", "-c", command], timeout_s, 20_000)

    # ------------------------------------------------------------------------------------------ helpers

    def run_in_clone(self, argv: Sequence[str], timeout_s: float, output_chars: int | None) -> CommandResult:
        """Run argv in the clone with the minimal environment, in the network namespace if there is one."""
        episode = self._current()
        return run_command(
            [*(self._launcher or ()), *argv],
            episode.clone,
            self._command_env(episode),
            timeout_s,
            output_chars,
        )

    @staticmethod
    def _command_env(episode: Episode) -> dict[str, str]:
        return {
            "PATH": _base_path(),
            "HOME": str(episode.workdir / "home"),
            "TMPDIR": str(episode.workdir / "tmp"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _trusted_git(self, cwd: Path, *args: str) -> str:
        # Only before the model has touched the clone: the source repository is trusted.
        env = {
            "PATH": _base_path(),
            "HOME": str(cwd),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _record(self, message: Message) -> None:
        episode = self._current()
        episode.transcript.append(message)
        episode.tokens_used += self.token_counter(message.content)

    def _current(self) -> Episode:
        if self.episode is None:
            raise RuntimeError("no episode: call reset(task) first")
        return self.episode


_END_TEXT: dict[str, str] = {
    "finished": "the model stopped calling tools",
    "tool_call_limit": "the tool call limit is reached",
    "token_budget": "the token budget is used up",
    "wall_clock": "the time limit is reached",
}


def _remove_tree(path: Path) -> None:
    def make_writable_and_retry(function: Callable[..., Any], failed: str, _exc: Any) -> None:
        # Directories the model made read-only cannot have entries removed until they are writable again.
        with contextlib.suppress(OSError):
            parent = os.path.dirname(failed)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            function(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable_and_retry)
    else:
        shutil.rmtree(path, onerror=make_writable_and_retry)
