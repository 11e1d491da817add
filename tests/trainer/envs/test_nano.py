"""The Nano coding environment driven by a scripted "model": real git, real bash, no model weights."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zoo.trainer.envs import nano, nano_repos
from zoo.trainer.envs.isolated_commands import NetworkIsolationUnavailable, network_isolation_prefix
from zoo.trainer.envs.nano import NanoEnv
from zoo.trainer.envs.nano_episode import NanoLimits, NanoTask, StepResult
from zoo.trainer.envs.nano_tools import TOOLS, apply_patch
from zoo.trainer.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls

TASKS = {task.repo: task for task in nano_repos.shipped_tasks()}
PAGER = TASKS["pager"]
NETWORK_ISOLATED = network_isolation_prefix() is not None


def call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def shell(cmd: str) -> str:
    return call("shell", cmd=cmd)


def only_result(step: StepResult) -> str:
    """The text inside the single <tool_response> block of a one-call step."""
    content = step.messages[0].content
    return content.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nano-repos")
    nano_repos.generate_task_repos(out)
    return out


@pytest.fixture
def make_env(repos: Path, tmp_path: Path) -> Iterator[Callable[..., NanoEnv]]:
    made: list[NanoEnv] = []

    def make(**limits: float) -> NanoEnv:
        env = NanoEnv(repos, limits=NanoLimits(**{"shell_timeout_s": 10, **limits}), work_root=tmp_path)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


# ------------------------------------------------------------------------------------------ tool calls


def test_parses_several_calls_in_order_including_a_list_in_one_tag() -> None:
    text = (
        "Let me look.\n" + shell("ls") + '\n<tool_call>[{"name": "shell", "arguments": {"cmd": "pwd"}}, '
        '{"name": "apply_patch", "arguments": {"path": "a", "old_content": "x", "new_content": "y"}}]'
        "</tool_call>"
    )
    calls = parse_tool_calls(text, TOOLS)
    assert calls == [
        ToolCall("shell", {"cmd": "ls"}),
        ToolCall("shell", {"cmd": "pwd"}),
        ToolCall("apply_patch", {"path": "a", "old_content": "x", "new_content": "y"}),
    ]
    assert parse_tool_calls("I am done, the fix is in place.", TOOLS) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
        ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "missing argument(s): cmd"),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls", "sudo": true}}</tool_call>', "unexpected"),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": 42}}</tool_call>', "'cmd' must be a string"),
        ('<tool_call>{"name": "shell", "arguments": "ls"}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}, "id": 1}</tool_call>', "unexpected key"),
        ('<tool_call>"shell ls"</tool_call>', "must be a JSON object"),
        ("<tool_call>[]</tool_call>", "empty list"),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}', "is not closed"),
        ('{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', "without a <tool_call>"),
    ],
)
def test_malformed_calls_become_errors_for_the_model(text: str, expected: str) -> None:
    calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError)
    assert expected in calls[0].message


def test_an_unclosed_call_does_not_swallow_the_next_one() -> None:
    calls = parse_tool_calls("<tool_call>{" + shell("ls"), TOOLS)
    assert isinstance(calls[0], ToolCallError) and calls[1] == ToolCall("shell", {"cmd": "ls"})


# ------------------------------------------------------------------------------------------ apply_patch


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "clone"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("a = 1\nb = 1\naaa\n")
    (root / "empty.py").write_text("")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret = 1\n")
    return root


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "pkg/../../outside/secret.txt",
        "/etc/hostname",
        "dirlink/secret.txt",
        "filelink",
    ],
)
def test_apply_patch_refuses_paths_outside_the_clone_symlinks_included(tree: Path, path: str) -> None:
    (tree / "dirlink").symlink_to(tree.parent / "outside")
    (tree / "filelink").symlink_to(tree.parent / "outside" / "secret.txt")
    result = apply_patch(tree, path, "secret = 1", "secret = 2")
    assert result.startswith("Error:") and "outside the repository" in result
    assert (tree.parent / "outside" / "secret.txt").read_text() == "secret = 1\n"


def test_apply_patch_refuses_to_create_through_a_dangling_symlink_or_in_git(tree: Path) -> None:
    (tree / "dangling").symlink_to(tree.parent / "outside" / "new.txt")
    assert "outside the repository" in apply_patch(tree, "dangling", "", "x = 1\n")
    assert not (tree.parent / "outside" / "new.txt").exists()
    assert "inside .git" in apply_patch(tree, ".git/config", "[core]", "[core]\n\tfsmonitor = evil")
    assert "repository itself" in apply_patch(tree, ".", "", "x")


def test_apply_patch_needs_exactly_one_occurrence(tree: Path) -> None:
    module = tree / "pkg" / "mod.py"
    assert "not found" in apply_patch(tree, "pkg/mod.py", "c = 1", "c = 2")
    assert "occurs 2 times" in apply_patch(tree, "pkg/mod.py", " = 1", " = 2")
    assert "occurs 2 times" in apply_patch(tree, "pkg/mod.py", "aa", "x")  # overlapping matches count
    assert module.read_text() == "a = 1\nb = 1\naaa\n"
    assert apply_patch(tree, "pkg/mod.py", "b = 1", "b = 2\nc = 3").startswith("Edited pkg/mod.py")
    assert module.read_text() == "a = 1\nb = 2\nc = 3\naaa\n"


def test_apply_patch_creates_files_only_with_an_empty_old_content(tree: Path) -> None:
    assert apply_patch(tree, "pkg/sub/new.py", "", "x = 1\n").startswith("Created pkg/sub/new.py")
    assert (tree / "pkg" / "sub" / "new.py").read_text() == "x = 1\n"
    assert "does not exist" in apply_patch(tree, "pkg/other.py", "x", "y")
    assert apply_patch(tree, "empty.py", "", "y = 2\n").startswith("Wrote empty.py")
    assert "old_content is empty" in apply_patch(tree, "pkg/mod.py", "", "z")
    assert "is a directory" in apply_patch(tree, "pkg", "a", "b")


# ---------------------------------------------------------------------------------------------- shell


def test_shell_runs_in_the_clone_and_reports_the_exit_code(make_env) -> None:
    env = make_env()
    opening = env.reset(PAGER)
    assert [m.role for m in opening] == ["system", "user"] and "<tools>" in opening[0].content
    assert PAGER.issue in opening[1].content
    step = env.step(shell("ls pager && exit 3"))
    assert only_result(step) == "exit code: 3\n__init__.py\npages.py\n"
    assert not step.done


def test_shell_timeout_kills_the_whole_process_group(make_env) -> None:
    env = make_env(shell_timeout_s=0.5)
    env.reset(PAGER)
    started = time.monotonic()
    step = env.step(shell('sleep 30 & echo $! > "$TMPDIR/bg.pid"; echo waiting; sleep 30'))
    assert time.monotonic() - started < 5
    result = only_result(step)
    assert result.startswith("timed out after 0.5 s") and "waiting" in result
    background = int((env.episode.workdir / "tmp" / "bg.pid").read_text())
    status = Path(f"/proc/{background}/status")

    def dead() -> bool:
        try:
            return "zombie" in status.read_text()
        except OSError:  # gone
            return True

    deadline = time.monotonic() + 10  # SIGKILL is sent; on a loaded machine it lands a moment later
    while not dead() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead(), status.read_text()


def test_shell_output_is_cut_with_an_explicit_marker(make_env) -> None:
    env = make_env()
    env.reset(PAGER)
    result = only_result(env.step(shell("head -c 5000 /dev/zero | tr '\\0' a; echo -n END")))
    head, marker, tail = result.removeprefix("exit code: 0\n").split("\n")
    assert marker == "[... output truncated: 3003 characters omitted ...]"
    assert head == "a" * 1000 and tail == "a" * 997 + "END"


def test_shell_environment_holds_no_inherited_secrets(make_env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_TEST_API_KEY", "do-not-leak")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    env = make_env()
    env.reset(PAGER)
    result = only_result(env.step(shell("env")))
    assert "do-not-leak" not in result and "proxy.invalid" not in result
    assert f"HOME={env.episode.workdir / 'home'}" in result


@pytest.mark.skipif(not NETWORK_ISOLATED, reason="no network namespace can be created on this machine")
def test_shell_has_no_network(make_env) -> None:
    env = make_env()
    env.reset(PAGER)
    probe = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"
    result = only_result(env.step(shell(f'python -c "{probe}"')))
    assert not result.startswith("exit code: 0") and "Network is unreachable" in result


def test_without_network_isolation_the_env_refuses_unless_told(
    repos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nano, "network_isolation_prefix", lambda: None)
    with pytest.raises(NetworkIsolationUnavailable):
        NanoEnv(repos)
    assert NanoEnv(repos, require_network_isolation=False).network_isolated is False


# ---------------------------------------------------------------------------------------------- episode


def test_malformed_calls_are_answered_not_raised_and_the_transcript_marks_origins(make_env) -> None:
    env = make_env()
    env.reset(PAGER)
    step = env.step(
        "<tool_call>{oops</tool_call>" + call("apply_patch", path="../x", old_content="", new_content="")
    )
    content = step.messages[0].content
    assert content.count("<tool_response>\nError:") == 2 and "outside the repository" in content
    assert not step.done and env.episode.tool_calls_used == 2
    final = env.step("The issue cannot be fixed by me.")
    assert final.done and final.end_reason == "finished" and final.messages == []
    assert [(m.role, m.origin) for m in env.episode.transcript] == [
        ("system", "environment"),
        ("user", "environment"),
        ("assistant", "model"),
        ("user", "environment"),
        ("assistant", "model"),
    ]
    assert env.episode.chat()[2] == {"role": "assistant", "content": env.episode.transcript[2].content}
    with pytest.raises(RuntimeError, match="has ended"):
        env.step(shell("ls"))


def test_tool_call_limit_warns_then_ends(make_env) -> None:
    env = make_env(max_tool_calls=5)
    env.reset(PAGER)
    warnings = [env.step(shell("true")).warnings for _ in range(4)]
    assert warnings[:3] == [[], [], []]
    assert len(warnings[3]) == 1 and "4 of 5 tool calls" in warnings[3][0]
    assert "4 of 5 tool calls" in env.episode.transcript[-1].content
    last = env.step(shell("echo one") + shell("echo two"))
    assert last.done and last.end_reason == "tool_call_limit"
    content = last.messages[0].content
    assert "exit code: 0\none" in content and "Error: not run: the tool call limit is reached" in content
    assert env.episode.tool_calls_used == 5


def test_token_budget_warns_then_ends_without_running_the_calls(
    make_env, repos: Path, tmp_path: Path
) -> None:
    opening = NanoEnv(repos, work_root=tmp_path, token_counter=len)
    opening_chars = sum(len(m.content) for m in opening.reset(PAGER))
    opening.close()
    env = NanoEnv(
        repos, limits=NanoLimits(token_budget=opening_chars + 1000), token_counter=len, work_root=tmp_path
    )
    with env:
        env.reset(PAGER)
        step = env.step(shell("true") + " " + "x" * 600)  # 80% of the budget passed, not 100%
        assert not step.done and any("tokens used" in w for w in step.warnings)
        marker = tmp_path / "should-not-exist"
        step = env.step(shell(f"touch {marker}") + " " + "x" * 600)
        assert step.done and step.end_reason == "token_budget" and not marker.exists()


def test_wall_clock_limit_caps_a_shell_call_and_ends(make_env) -> None:
    env = make_env(wall_clock_s=1.0)
    env.reset(PAGER)
    started = time.monotonic()
    step = env.step(shell("sleep 20") + shell("echo late"))
    assert time.monotonic() - started < 5
    assert step.done and step.end_reason == "wall_clock"
    assert "Error: not run: the time limit is reached" in step.messages[0].content


def test_close_removes_the_clone(make_env) -> None:
    env = make_env()
    env.reset(PAGER)
    workdir = env.episode.workdir
    env.step(shell("mkdir locked && touch locked/file && chmod 500 locked"))
    env.close()
    assert not workdir.exists()


# --------------------------------------------------------------------------------------- diff, reward


def test_diff_is_git_diff_of_the_clone_with_new_files_and_commits(make_env) -> None:
    env = make_env()
    env.reset(PAGER)
    env.step(call("apply_patch", path="NOTES.md", old_content="", new_content="notes\n"))
    env.step(shell("sed -i 's/must be positive/must be > 0/' pager/pages.py && git -c user.name=m "
                   "-c user.email=m@x commit -qam wip"))  # fmt: skip
    diff = env.diff()
    assert "+++ b/NOTES.md" in diff and "+notes" in diff
    assert '+        raise ValueError("per_page must be > 0")' in diff


def test_reward_examples(make_env) -> None:
    env = make_env()
    fix = call("apply_patch", path="pager/pages.py", old_content="    return total_items // per_page",
               new_content="    return -(-total_items // per_page)")  # fmt: skip
    other_hunk = call("apply_patch", path="pager/pages.py", old_content="must be positive",
                      new_content="must be at least 1")  # fmt: skip
    extra_file = call("apply_patch", path="README.md", old_content="", new_content="# pager\n")

    def reward_after(*messages: str) -> float:
        env.reset(PAGER)
        for message in messages:
            env.step(message)
        return env.reward().score

    assert reward_after(fix) == 1.0
    assert 0 < reward_after(other_hunk) < 0.5  # about 0.39: the characters both edits share
    assert reward_after(fix, extra_file) == pytest.approx(0.5)  # (1 + 0) / max(2 files, 1 file)
    assert reward_after() == 0.0
    assert env.reward("").reason.startswith("no file changes")


# ------------------------------------------------------------------------------------------ shipped tasks


@pytest.mark.parametrize("task", list(TASKS.values()), ids=list(TASKS))
def test_shipped_task_fails_before_and_passes_after_its_patch(make_env, task: NanoTask) -> None:
    env = make_env()
    env.reset(task)
    assert env.run_tests().exit_code != 0
    subprocess.run(["git", "apply"], input=task.patch, text=True, cwd=env.episode.clone, check=True)
    after = env.run_tests()
    assert after.exit_code == 0, after.output
    assert env.reward().score == 1.0


def test_task_repos_are_reproducible_and_the_cli_writes_them(repos: Path, tmp_path: Path, capsys) -> None:
    assert 4 <= len(TASKS) <= 6 and len({t.id for t in TASKS.values()}) == len(TASKS)
    nano_repos.main(["--out", str(tmp_path / "again")])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in printed] == [t.id for t in TASKS.values()]

    def head(repo: Path) -> str:
        return subprocess.run(["git", "rev-parse", "buggy"], cwd=repo, capture_output=True, text=True).stdout

    for task in TASKS.values():
        assert head(repos / task.repo) == head(tmp_path / "again" / task.repo)
        log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=repos / task.repo, capture_output=True)
        assert len(log.stdout.splitlines()) == 1  # the fix is nowhere in the history
    (tmp_path / "blocked" / "pager").mkdir(parents=True)
    (tmp_path / "blocked" / "pager" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        nano_repos.generate_task_repos(tmp_path / "blocked")
    assert os.listdir(tmp_path / "blocked" / "pager") == ["keep.txt"]
