"""unit_tests (ASO paper eq. 9): r_pass = (test functions that pass) / (test functions in the task's
test code), and its sandbox.

A test function is a top-level `def test_*` of the task's tests; it passes when calling it returns without
raising. The count comes from parsing the (trusted) tests, not from the run, so a crash or a forged report
cannot change the denominator. Eq. 10 (r_new = newly passing / previously failing) compares two runs:
`newly_passing_rate`. A time-out scores 0.

Sandbox of unit_tests, and its limits. The completion's code and the tests are written into a fresh
temporary directory and run by a small runner, sandbox_runner.py (not pytest: starting fast and counting
exactly matter here) in `python -I -S -B` (so stdlib only) with cwd, HOME and TMPDIR inside that directory, an
environment holding only PATH, HOME and TMPDIR, its own session and process group (killed with SIGKILL on
time-out and after every run), and a wall-clock time-out. Before any task code runs, the runner lowers
its own resource limits, soft and hard: RLIMIT_CPU, RLIMIT_AS (512 MiB by default), RLIMIT_FSIZE,
RLIMIT_NOFILE, RLIMIT_CORE = 0 and RLIMIT_NPROC = 0 (no fork or threads; the kernel does not apply this
one to root). The limits are set by the runner rather than in a preexec_fn because preexec_fn is unsafe
in a multi-threaded parent such as the daemon. The runner then installs an audit hook (sys.addaudithook)
that raises PermissionError in the child for: opening a file for writing, or a directory at all, outside
the sandbox; remove, rename, mkdir, rmdir, link, symlink, chmod, chown, utime and truncate outside it
(dir_fd-relative paths are resolved through /proc/self/fd); starting processes (subprocess, os.system,
exec*, fork, posix_spawn); creating or using sockets; signalling other processes; changing resource
limits; ctypes' dlopen and raw memory access; and importing _ctypes or _posixsubprocess, whose functions
skip the audit events. Blocked attempts are reported in the reason ("blocked write to '/tmp/x'").

Audit hooks are a guard against mistakes and casual misbehaviour of generated code, not a security
boundary: code that reaches native code some way the hook does not cover (a C extension already loaded, a
race on a path between the check and the open, an interpreter bug) acts with the runner's full user
rights; reading files outside the sandbox is allowed; and under root RLIMIT_NPROC does not apply and hard
limits can be raised again by such code. Likewise the result line carries a random nonce and is written
to a private duplicate of stdout, which stops a completion from printing a fake result, not one that
inspects the runner's memory. Completions that may be adversarial belong in a container or namespace
sandbox (no network, read-only root, an unprivileged user of its own); in production this runner is meant
to run inside one. The sandbox needs a POSIX system with /proc (Linux).
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zoo.registry.errors import ValidationError
from zoo.trainer.rewards.base import _FENCE_RE, BaseReward, RewardResult, _clip, register
from zoo.trainer.tasks.schema import Task

_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_TIMEOUT_S = 600.0


def extract_code(completion: str) -> str:
    """The last ```python fenced block (an unclosed one runs to the end), else the last untagged block,
    else the whole text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(completion)]
    for wanted in (_PYTHON_TAGS, {""}):
        tagged = [body for tag, body in blocks if tag in wanted]
        if tagged:
            return tagged[-1]
    return completion


def unit_test_names(tests: str) -> list[str]:
    """Top-level `def test_*` functions of test code, in source order (the denominator of eq. 9)."""
    tree = ast.parse(tests)
    return [
        node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


# The runner is a standalone script (it must not import zoo: the sandboxed interpreter runs with -I), kept
# as sandbox_runner.py next to this module; each run writes this text out of the sandbox (see run()).
_RUNNER = Path(__file__).with_name("sandbox_runner.py").read_text(encoding="utf-8")


def _tail(path: Path, limit: int = 65536) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - limit))
        return fh.read().decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The child leads its own session and group (start_new_session); SIGKILL reaches anything it left.
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()


@register("unit_tests")
class UnitTests(BaseReward):
    """Pass rate of the task's unit tests on the completion's code, run in a sandboxed subprocess.

    Task arguments: `tests` (Python source with top-level test_* functions that import the solution
    module), optional `timeout_s` (overrides the reward's default, capped at max_timeout_s) and
    `module` (the solution's module name, default "solution").
    """

    task_args = frozenset({"tests", "timeout_s", "module"})

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        max_timeout_s: float = 60.0,
        memory_mb: int = 512,
        max_file_mb: int = 16,
        python: str | None = None,
        temp_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not 0 < timeout_s <= max_timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"need 0 < timeout_s <= max_timeout_s <= {MAX_TIMEOUT_S:g}")
        self.timeout_s = timeout_s
        self.max_timeout_s = max_timeout_s
        self.memory_bytes = memory_mb * 1024 * 1024
        self.max_file_bytes = max_file_mb * 1024 * 1024
        self.python = python or sys.executable
        self.temp_dir = temp_dir

    @classmethod
    def check_task(cls, task: Task) -> None:
        super().check_task(task)
        tests = task.verifier_args.get("tests")
        if not isinstance(tests, str) or not tests.strip():
            raise ValidationError("verifier_args.tests", "unit_tests needs the test code as a string")
        try:
            names = unit_test_names(tests)
        except SyntaxError as err:
            raise ValidationError(
                "verifier_args.tests", f"does not parse: {err.msg} (line {err.lineno})"
            ) from None
        if not names:
            raise ValidationError("verifier_args.tests", "defines no top-level test_* function")
        timeout = task.verifier_args.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= MAX_TIMEOUT_S
        ):
            raise ValidationError("verifier_args.timeout_s", f"must be a number in (0, {MAX_TIMEOUT_S:g}]")
        module = task.verifier_args.get("module", "solution")
        if not isinstance(module, str) or not _IDENT_RE.fullmatch(module) or module.startswith("test"):
            raise ValidationError(
                "verifier_args.module", "must be a Python identifier not starting with 'test'"
            )

    def timeout_for(self, task: Task) -> float:
        return float(min(task.verifier_args.get("timeout_s", self.timeout_s), self.max_timeout_s))

    def score(self, task: Task, completion: str) -> RewardResult:
        self.check_task(task)
        tests: str = task.verifier_args["tests"]
        module: str = task.verifier_args.get("module", "solution")
        return self.run(extract_code(completion), tests, module=module, timeout_s=self.timeout_for(task))

    def run(
        self, code: str, tests: str, *, module: str = "solution", timeout_s: float | None = None
    ) -> RewardResult:
        """Run `tests` against `code` (saved as `module`.py) in a fresh sandbox; see the module docstring."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        names = unit_test_names(tests)
        total = len(names)
        with tempfile.TemporaryDirectory(
            prefix="zoo-tests-", dir=self.temp_dir, ignore_cleanup_errors=True
        ) as tmp:
            root = Path(tmp)
            sandbox = root / "sandbox"
            (sandbox / "tmp").mkdir(parents=True)
            (sandbox / f"{module}.py").write_text(code, encoding="utf-8")
            (sandbox / f"test_{module}.py").write_text(tests, encoding="utf-8")
            runner = root / "runner.py"  # outside the sandbox: the completion cannot rewrite it
            runner.write_text(_RUNNER, encoding="utf-8")
            nonce = secrets.token_hex(16)
            env = {
                "PATH": os.environ.get("PATH", os.defpath),
                "HOME": str(sandbox),
                "TMPDIR": str(sandbox / "tmp"),
            }
            # -I: no environment variables or user site; -S: no site-packages (tasks are stdlib-only, and
            # the venv's .pth hooks stay out of the sandbox); -B: no .pyc files.
            flags = ["-I", "-S", "-B"]
            limits = [str(math.ceil(timeout) + 1), str(self.memory_bytes), str(self.max_file_bytes)]
            argv = [
                self.python,
                *flags,
                str(runner),
                str(sandbox),
                module,
                f"test_{module}",
                json.dumps(names),
            ]
            argv += limits
            started = time.monotonic()
            timed_out = False
            with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=sandbox, env=env,
                    start_new_session=True, close_fds=True,
                )  # fmt: skip
            try:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(nonce.encode() + b"\n")
                except BrokenPipeError:
                    pass  # the child is already gone; its missing report says so
                finally:
                    with contextlib.suppress(BrokenPipeError):
                        proc.stdin.close()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
            finally:
                _kill_group(proc)
                proc.wait()
            elapsed = time.monotonic() - started
            stdout = _tail(root / "stdout")
            output_bytes = (root / "stdout").stat().st_size
            stderr = _tail(root / "stderr", 2000)
        details: dict[str, Any] = {
            "total": total,
            "passed": 0,
            "passed_tests": [],
            "failed_tests": {},
            "blocked": [],
            "timed_out": timed_out,
            "pgid": proc.pid,
            "returncode": proc.returncode,
            "elapsed_s": round(elapsed, 3),
        }
        if timed_out:
            return RewardResult(0.0, f"timed out after {timeout:g} s", details)
        report = self._report(stdout, nonce)
        if report is None:
            if output_bytes >= self.max_file_bytes:
                why = f"its output reached the {self.max_file_bytes // (1024 * 1024)} MiB limit"
            else:
                why = (stderr.strip().splitlines() or ["no output"])[-1]
            reason = f"test runner exited with code {proc.returncode} without a result: {why}"
            return RewardResult(0.0, _clip(reason), details)
        known = set(names)
        passed = [n for n in dict.fromkeys(report.get("passed") or []) if n in known]
        failed = {n: str(why) for n, why in (report.get("failed") or {}).items() if n in known}
        blocked = [str(b) for b in report.get("blocked") or []]
        details.update(passed=len(passed), passed_tests=passed, failed_tests=failed, blocked=blocked)
        parts = []
        if report.get("error"):
            parts.append(str(report["error"]))
        parts.append(f"{len(passed)}/{total} tests passed")
        if failed:
            parts.append("failed: " + "; ".join(f"{n}: {why}" for n, why in list(failed.items())[:2]))
        if blocked:
            parts.append("sandbox blocked " + ", ".join(b.removeprefix("blocked ") for b in blocked[:3]))
        return RewardResult(len(passed) / total, _clip("; ".join(parts)), details)

    @staticmethod
    def _report(stdout: str, nonce: str) -> dict[str, Any] | None:
        for line in reversed(stdout.splitlines()):
            if line.startswith(nonce + " "):
                try:
                    report = json.loads(line[len(nonce) + 1 :])
                except json.JSONDecodeError:
                    return None
                return report if isinstance(report, dict) else None
        return None


def newly_passing_rate(before: RewardResult, after: RewardResult) -> float | None:
    """ASO eq. 10, r_new = (tests failing before and passing after) / (tests failing before).

    Both results come from unit_tests on the same task. Tests that did not pass before (failed, or never
    ran because of a time-out or crash) count as failing. None when nothing was failing before.
    """
    passed_before = set(before.details.get("passed_tests", []))
    failing_before = int(before.details.get("total", 0)) - len(passed_before)
    if failing_before <= 0:
        return None
    now_passing = set(after.details.get("passed_tests", [])) - passed_before
    return len(now_passing) / failing_before
