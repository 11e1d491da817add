"""The shipped Nano task repositories: tiny Python packages with one bug each, built reproducibly on demand.

Each task is Python data here (the files at the buggy commit, the issue, the ground-truth fix as a
unified diff, the test command); `generate_task_repos(dir)` turns them into git repositories, one per
task, each holding a single commit tagged `buggy` (the fix is nowhere in the history, so an agent cannot
find it with `git log --all`). Author, committer, dates, branch name and configuration are fixed, so the
same tasks always give the same commit ids. The tests are stdlib `unittest` and part of the buggy commit:
the test command fails there and passes once the patch is applied; the patches touch only the package.

    python -m zoo.trainer.envs.nano_repos --out DIR   # writes DIR/<repo>/ for every task, prints the ids
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zoo.trainer.envs.nano_episode import NanoTask

BUGGY_TAG = "buggy"
TEST_COMMAND = "python -m unittest discover -q"
GITIGNORE = "__pycache__/\n*.pyc\n"
_FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "zoo-node nano tasks",
    "GIT_AUTHOR_EMAIL": "nano-tasks@zoo-node.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "zoo-node nano tasks",
    "GIT_COMMITTER_EMAIL": "nano-tasks@zoo-node.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+00:00",
}


def _diff(*lines: str) -> str:
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TaskSource:
    """What a task repository is made of."""

    id: str
    repo: str
    issue: str
    files: Mapping[str, str]  # path -> content at the buggy commit (tests included)
    patch: str  # ground-truth fix, a git unified diff against the buggy commit

    def task(self) -> NanoTask:
        return NanoTask(
            id=self.id,
            issue=self.issue,
            repo=self.repo,
            buggy_ref=BUGGY_TAG,
            patch=self.patch,
            test_command=TEST_COMMAND,
        )


_TEXTSTATS = TaskSource(
    id="nano-textstats-word-count",
    repo="textstats",
    issue=(
        "word_count miscounts text with repeated whitespace\n\n"
        "`textstats.word_count('one  two')` returns 3, and `word_count('')` returns 1. Words are separated "
        "by any run of whitespace (spaces, tabs, newlines), so these should be 2 and 0."
    ),
    files={
        "textstats/__init__.py": '"""Small text statistics."""\n\n'
        'from textstats.counting import word_count\n\n__all__ = ["word_count"]\n',
        "textstats/counting.py": '"""Counting words."""\n\n\ndef word_count(text: str) -> int:\n'
        '    """Number of words in `text`; words are separated by any run of whitespace."""\n'
        '    return len(text.split(" "))\n',
        "tests/__init__.py": "",
        "tests/test_counting.py": "import unittest\n\nfrom textstats import word_count\n\n\n"
        "class WordCountTest(unittest.TestCase):\n"
        "    def test_single_spaces(self):\n"
        '        self.assertEqual(word_count("one two three"), 3)\n\n'
        "    def test_runs_of_whitespace(self):\n"
        '        self.assertEqual(word_count("one  two\\tthree\\n"), 3)\n\n'
        "    def test_empty_text(self):\n"
        '        self.assertEqual(word_count(""), 0)\n',
    },
    patch=_diff(
        "diff --git a/textstats/counting.py b/textstats/counting.py",
        "index 3a78599..b936b63 100644",
        "--- a/textstats/counting.py",
        "+++ b/textstats/counting.py",
        "@@ -3,4 +3,4 @@",
        " ",
        " def word_count(text: str) -> int:",
        '     """Number of words in `text`; words are separated by any run of whitespace."""',
        '-    return len(text.split(" "))',
        "+    return len(text.split())",
    ),
)

_INTERVALS = TaskSource(
    id="nano-intervals-touching",
    repo="intervals",
    issue=(
        "merge() keeps touching intervals apart\n\n"
        "The docstring says closed intervals that overlap or touch are merged, but "
        "`intervals.merge([(1, 3), (3, 5)])` returns `[(1, 3), (3, 5)]` instead of `[(1, 5)]`."
    ),
    files={
        "intervals/__init__.py": '"""Closed integer intervals."""\n\nfrom intervals.merge import merge\n\n'
        '__all__ = ["merge"]\n',
        "intervals/merge.py": '"""Merging intervals."""\n\n\n'
        "def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:\n"
        '    """Merge closed intervals (start, end) that overlap or touch; the result is sorted."""\n'
        "    merged: list[tuple[int, int]] = []\n"
        "    for start, end in sorted(intervals):\n"
        "        if merged and start < merged[-1][1]:\n"
        "            merged[-1] = (merged[-1][0], max(merged[-1][1], end))\n"
        "        else:\n"
        "            merged.append((start, end))\n"
        "    return merged\n",
        "tests/__init__.py": "",
        "tests/test_merge.py": "import unittest\n\nfrom intervals import merge\n\n\n"
        "class MergeTest(unittest.TestCase):\n"
        "    def test_overlapping(self):\n"
        "        self.assertEqual(merge([(5, 8), (1, 4), (3, 6)]), [(1, 8)])\n\n"
        "    def test_disjoint(self):\n"
        "        self.assertEqual(merge([(4, 5), (1, 2)]), [(1, 2), (4, 5)])\n\n"
        "    def test_touching(self):\n"
        "        self.assertEqual(merge([(1, 3), (3, 5)]), [(1, 5)])\n",
    },
    patch=_diff(
        "diff --git a/intervals/merge.py b/intervals/merge.py",
        "index 190a07b..7eab6f2 100644",
        "--- a/intervals/merge.py",
        "+++ b/intervals/merge.py",
        "@@ -5,7 +5,7 @@ def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:",
        '     """Merge closed intervals (start, end) that overlap or touch; the result is sorted."""',
        "     merged: list[tuple[int, int]] = []",
        "     for start, end in sorted(intervals):",
        "-        if merged and start < merged[-1][1]:",
        "+        if merged and start <= merged[-1][1]:",
        "             merged[-1] = (merged[-1][0], max(merged[-1][1], end))",
        "         else:",
        "             merged.append((start, end))",
    ),
)

_PAGER = TaskSource(
    id="nano-pager-last-page",
    repo="pager",
    issue=(
        "page_count forgets the last, partial page\n\n"
        "With 10 items and 3 per page there are 4 pages (3 + 3 + 3 + 1), but `pager.page_count(10, 3)` "
        "returns 3. Exact multiples such as `page_count(9, 3) == 3` are right."
    ),
    files={
        "pager/__init__.py": '"""Pagination helpers."""\n\nfrom pager.pages import page_count\n\n'
        '__all__ = ["page_count"]\n',
        "pager/pages.py": '"""How many pages a list needs."""\n\n\n'
        "def page_count(total_items: int, per_page: int) -> int:\n"
        '    """Pages for `total_items` items, `per_page` to a page (the last may be partial)."""\n'
        "    if per_page <= 0:\n"
        '        raise ValueError("per_page must be positive")\n'
        "    return total_items // per_page\n",
        "tests/__init__.py": "",
        "tests/test_pages.py": "import unittest\n\nfrom pager import page_count\n\n\n"
        "class PageCountTest(unittest.TestCase):\n"
        "    def test_exact_multiple(self):\n"
        "        self.assertEqual(page_count(9, 3), 3)\n\n"
        "    def test_partial_last_page(self):\n"
        "        self.assertEqual(page_count(10, 3), 4)\n\n"
        "    def test_no_items(self):\n"
        "        self.assertEqual(page_count(0, 5), 0)\n",
    },
    patch=_diff(
        "diff --git a/pager/pages.py b/pager/pages.py",
        "index 2dadde6..50e955b 100644",
        "--- a/pager/pages.py",
        "+++ b/pager/pages.py",
        "@@ -5,4 +5,4 @@ def page_count(total_items: int, per_page: int) -> int:",
        '     """Pages for `total_items` items, `per_page` to a page (the last may be partial)."""',
        "     if per_page <= 0:",
        '         raise ValueError("per_page must be positive")',
        "-    return total_items // per_page",
        "+    return -(-total_items // per_page)",
    ),
)

_UNITS = TaskSource(
    id="nano-units-fahrenheit",
    repo="units",
    issue=(
        "fahrenheit_to_celsius gives wrong temperatures\n\n"
        "`units.fahrenheit_to_celsius(212)` returns about 194.2 instead of 100, and 32 °F is not 0 °C. "
        "celsius_to_fahrenheit is fine."
    ),
    files={
        "units/__init__.py": '"""Unit conversions."""\n\n'
        "from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius\n\n"
        '__all__ = ["celsius_to_fahrenheit", "fahrenheit_to_celsius"]\n',
        "units/temperature.py": '"""Temperature scales."""\n\n\n'
        "def celsius_to_fahrenheit(celsius: float) -> float:\n"
        "    return celsius * 9 / 5 + 32\n\n\n"
        "def fahrenheit_to_celsius(fahrenheit: float) -> float:\n"
        "    return fahrenheit - 32 * 5 / 9\n",
        "tests/__init__.py": "",
        "tests/test_temperature.py": "import unittest\n\n"
        "from units import celsius_to_fahrenheit, fahrenheit_to_celsius\n\n\n"
        "class TemperatureTest(unittest.TestCase):\n"
        "    def test_boiling_point(self):\n"
        "        self.assertAlmostEqual(fahrenheit_to_celsius(212), 100)\n\n"
        "    def test_freezing_point(self):\n"
        "        self.assertAlmostEqual(fahrenheit_to_celsius(32), 0)\n\n"
        "    def test_round_trip(self):\n"
        "        self.assertAlmostEqual(fahrenheit_to_celsius(celsius_to_fahrenheit(37.5)), 37.5)\n",
    },
    patch=_diff(
        "diff --git a/units/temperature.py b/units/temperature.py",
        "index 7db88f3..eff491a 100644",
        "--- a/units/temperature.py",
        "+++ b/units/temperature.py",
        "@@ -6,4 +6,4 @@ def celsius_to_fahrenheit(celsius: float) -> float:",
        " ",
        " ",
        " def fahrenheit_to_celsius(fahrenheit: float) -> float:",
        "-    return fahrenheit - 32 * 5 / 9",
        "+    return (fahrenheit - 32) * 5 / 9",
    ),
)

_SETTINGS = TaskSource(
    id="nano-settings-parse-bool",
    repo="settings",
    issue=(
        "parse_bool rejects documented spellings\n\n"
        "The README promises that boolean settings accept true/false, yes/no, on/off and 1/0 in any case, "
        "but `settings.parse_bool('Yes')` and `parse_bool('TRUE')` raise ValueError."
    ),
    files={
        "README.md": "# settings\n\nBooleans accept true/false, yes/no, on/off and 1/0 in any case.\n",
        "settings/__init__.py": '"""Reading settings from text."""\n\n'
        'from settings.parse import parse_bool\n\n__all__ = ["parse_bool"]\n',
        "settings/values.py": '"""Words that spell a boolean."""\n\n'
        'TRUE_WORDS = frozenset({"true", "1"})\nFALSE_WORDS = frozenset({"false", "0"})\n',
        "settings/parse.py": '"""Parsing setting values."""\n\n'
        "from settings.values import FALSE_WORDS, TRUE_WORDS\n\n\n"
        "def parse_bool(text: str) -> bool:\n"
        "    word = text.strip()\n"
        "    if word in TRUE_WORDS:\n"
        "        return True\n"
        "    if word in FALSE_WORDS:\n"
        "        return False\n"
        '    raise ValueError(f"not a boolean: {text!r}")\n',
        "tests/__init__.py": "",
        "tests/test_parse.py": "import unittest\n\nfrom settings import parse_bool\n\n\n"
        "class ParseBoolTest(unittest.TestCase):\n"
        "    def test_canonical_words(self):\n"
        '        self.assertTrue(parse_bool("true"))\n'
        '        self.assertFalse(parse_bool(" 0 "))\n\n'
        "    def test_any_case(self):\n"
        '        self.assertTrue(parse_bool("TRUE"))\n'
        '        self.assertFalse(parse_bool("False"))\n\n'
        "    def test_yes_no_on_off(self):\n"
        '        self.assertTrue(parse_bool("Yes"))\n'
        '        self.assertTrue(parse_bool("on"))\n'
        '        self.assertFalse(parse_bool("no"))\n'
        '        self.assertFalse(parse_bool("OFF"))\n\n'
        "    def test_rejects_other_words(self):\n"
        "        with self.assertRaises(ValueError):\n"
        '            parse_bool("maybe")\n',
    },
    patch=_diff(
        "diff --git a/settings/parse.py b/settings/parse.py",
        "index 116f9a2..9a07e4b 100644",
        "--- a/settings/parse.py",
        "+++ b/settings/parse.py",
        "@@ -4,7 +4,7 @@ from settings.values import FALSE_WORDS, TRUE_WORDS",
        " ",
        " ",
        " def parse_bool(text: str) -> bool:",
        "-    word = text.strip()",
        "+    word = text.strip().lower()",
        "     if word in TRUE_WORDS:",
        "         return True",
        "     if word in FALSE_WORDS:",
        "diff --git a/settings/values.py b/settings/values.py",
        "index 329af6c..6bfe31d 100644",
        "--- a/settings/values.py",
        "+++ b/settings/values.py",
        "@@ -1,4 +1,4 @@",
        ' """Words that spell a boolean."""',
        " ",
        '-TRUE_WORDS = frozenset({"true", "1"})',
        '-FALSE_WORDS = frozenset({"false", "0"})',
        '+TRUE_WORDS = frozenset({"true", "yes", "on", "1"})',
        '+FALSE_WORDS = frozenset({"false", "no", "off", "0"})',
    ),
)

_CODEC = TaskSource(
    id="nano-codec-last-run",
    repo="codec",
    issue=(
        "Run-length encoding drops the last run\n\n"
        "`codec.encode('aaab')` returns `[('a', 3)]`; the final `('b', 1)` is missing, and decoding the "
        "result does not give the input back."
    ),
    files={
        "codec/__init__.py": '"""Run-length encoding."""\n\nfrom codec.rle import decode, encode\n\n'
        '__all__ = ["decode", "encode"]\n',
        "codec/rle.py": '"""Run-length encoding of strings into (character, count) pairs."""\n\n\n'
        "def encode(text: str) -> list[tuple[str, int]]:\n"
        "    runs: list[tuple[str, int]] = []\n"
        "    current: str | None = None\n"
        "    count = 0\n"
        "    for char in text:\n"
        "        if char == current:\n"
        "            count += 1\n"
        "        else:\n"
        "            if current is not None:\n"
        "                runs.append((current, count))\n"
        "            current, count = char, 1\n"
        "    return runs\n\n\n"
        "def decode(runs: list[tuple[str, int]]) -> str:\n"
        '    return "".join(char * count for char, count in runs)\n',
        "tests/__init__.py": "",
        "tests/test_rle.py": "import unittest\n\nfrom codec import decode, encode\n\n\n"
        "class RunLengthTest(unittest.TestCase):\n"
        "    def test_runs(self):\n"
        '        self.assertEqual(encode("aaab"), [("a", 3), ("b", 1)])\n\n'
        "    def test_empty(self):\n"
        '        self.assertEqual(encode(""), [])\n\n'
        "    def test_round_trip(self):\n"
        '        self.assertEqual(decode(encode("xxyzzz")), "xxyzzz")\n',
    },
    patch=_diff(
        "diff --git a/codec/rle.py b/codec/rle.py",
        "index 037aa64..47ab122 100644",
        "--- a/codec/rle.py",
        "+++ b/codec/rle.py",
        "@@ -12,6 +12,8 @@ def encode(text: str) -> list[tuple[str, int]]:",
        "             if current is not None:",
        "                 runs.append((current, count))",
        "             current, count = char, 1",
        "+    if current is not None:",
        "+        runs.append((current, count))",
        "     return runs",
        " ",
        " ",
    ),
)

TASK_SOURCES: tuple[TaskSource, ...] = (_TEXTSTATS, _INTERVALS, _PAGER, _UNITS, _SETTINGS, _CODEC)


def shipped_tasks() -> list[NanoTask]:
    return [source.task() for source in TASK_SOURCES]


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        **_FIXED_IDENTITY,
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def _is_generated(repo: Path) -> bool:
    if not (repo / ".git").is_dir():
        return False
    try:
        _git(repo, "rev-parse", "--verify", "--quiet", f"refs/tags/{BUGGY_TAG}")
    except RuntimeError:
        return False
    return True


def build_repo(source: TaskSource, repo: Path) -> str:
    """Create the task's repository at `repo` (a missing or empty directory); returns the commit id."""
    repo.mkdir(parents=True, exist_ok=True)
    if any(repo.iterdir()):
        raise FileExistsError(f"{repo} is not empty")
    for relative, content in {".gitignore": GITIGNORE, **source.files}.items():
        path = repo / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    _git(repo, "init", "--quiet", "--initial-branch=main")
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "--no-gpg-sign", "-m", f"{source.repo}: state with the reported bug")
    _git(repo, "tag", BUGGY_TAG)
    return _git(repo, "rev-parse", "HEAD")


def generate_task_repos(out_dir: Path) -> list[NanoTask]:
    """Make sure `out_dir/<repo>` exists for every shipped task (repositories already there are reused).

    A directory in the way that is not such a repository raises FileExistsError; nothing is deleted.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for source in TASK_SOURCES:
        repo = out_dir / source.repo
        if not (repo.exists() and _is_generated(repo)):
            # Built aside and renamed into place: a build killed halfway leaves no half repository behind
            # in the way of the next attempt.
            if repo.exists() and any(repo.iterdir()):
                raise FileExistsError(f"{repo} is in the way: not a generated task repository")
            staging = out_dir / f".{source.repo}.building"
            shutil.rmtree(staging, ignore_errors=True)
            build_repo(source, staging)
            os.replace(staging, repo)
    return shipped_tasks()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the shipped Nano task repositories.")
    parser.add_argument("--out", type=Path, required=True, help="directory to write <repo>/ folders into")
    args = parser.parse_args(argv)
    for task in generate_task_repos(args.out):
        print(f"{task.id}\t{args.out / task.repo}\t{task.buggy_ref}")


if __name__ == "__main__":
    main()
