"""The Nano coding environment: a policy fixes an issue in a throwaway git clone using two tools.

An episode (`NanoEnv.reset(task)`) clones the task's repository at its buggy commit into a fresh temporary
directory and opens the chat with a system message (the tools, the call format, the limits) and the issue.
Each `step(assistant_text)` runs the tool calls in the model's message (format: tool_calls.py) and answers
with one message holding their results. The episode ends when a message calls no tool, or at a limit.
The answer is not text the model wrote but `diff()`: `git diff` of the clone against the buggy commit,
new files included. `reward()` scores that diff with the existing patch_similarity reward (thesis
eq. 3.1, zoo.trainer.rewards) against the task's ground-truth patch. Every transcript message records who
produced it (`origin`: "model" or "environment"), so a trainer can mask the loss to the model's tokens.
The task, the limits and the transcript's records are in nano_episode.py.

Tools (nano_tools.py): shell(cmd), bash in the clone, and apply_patch(path, old_content, new_content), a
literal search and replace inside the clone. Every problem comes back as a tool result starting with
"Error:"; nothing the model does raises.

No network (isolated_commands.py): every shell call runs in a network namespace of its own in which
every connection fails. When no launcher for one works here, `NanoEnv` refuses to start
(`NetworkIsolationUnavailable`) unless built with `require_network_isolation=False`; then commands run
with the network of the host, which is logged and visible as `network_isolated = False`. The git
commands the environment itself runs in the clone after reset (`git add`, `git diff`) go through the
same launcher, so hooks, filters or config the model planted run no more freely than its own shell calls.
This is network isolation, not a sandbox: commands run with the trainer's user rights and can read and
write outside the clone (the path rule binds apply_patch only). Untrusted policies belong in a container
or VM as well.

Limits (`NanoLimits`): at most `max_tool_calls` calls (malformed ones count), a token budget over every
message of the transcript (system, issue, model turns and tool results, measured by a pluggable counter;
the default is about four characters a token), and a wall-clock limit from reset that also caps each
shell call's timeout. At `warn_at` (80%) of a limit, the next results message carries a warning, once per
limit. Reaching a limit ends the episode cleanly: calls beyond the call limit or the time are not run
(their results say so), a model message that overruns the token budget has none of its calls run, and
the step returns done with `end_reason` naming the limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zoo.trainer.envs.isolated_commands import (
    CommandResult,
    NetworkIsolationUnavailable,
    minimal_path,
    network_isolation_prefix,
    run_command,
)
from zoo.trainer.envs.nano_episode import (
    EndReason,
    Episode,
    Message,
    NanoLimits,
    NanoTask,
    StepResult,
    TokenCounter,
    approximate_token_count,
)
from zoo.trainer.envs.nano_tools import SHELL_TOOL, TOOLS, apply_patch
from zoo.trainer.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    tool_results_message,
    tools_prompt,
)
from zoo.trainer.rewards import RewardResult, get_reward

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 60.0


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
            "PATH": minimal_path(),
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
            "PATH": minimal_path(),
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
