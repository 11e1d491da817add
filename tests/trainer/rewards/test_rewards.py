"""Rewards on hand-made cases: answer matching, the unit-test sandbox, patch similarity, the LLM judge's
parsing and retries, and the label-free majority vote."""

from __future__ import annotations

import asyncio
import difflib
import itertools
import os
import secrets
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest

from zoo.registry.errors import ValidationError
from zoo.trainer import rewards
from zoo.trainer.rewards import (
    ExactMatch,
    LlmJudge,
    MajorityVote,
    PatchSimilarity,
    RewardResult,
    UnitTests,
    ascore_group,
    get_reward,
    score_group,
)
from zoo.trainer.rewards.answers import Extracted, extract_answer, parse_number
from zoo.trainer.rewards.judge import parse_judge_score
from zoo.trainer.rewards.patch import parse_unified_diff, similarity
from zoo.trainer.rewards.unit_tests import newly_passing_rate
from zoo.trainer.tasks.schema import Task


def math_task(answer: str | None) -> Task:
    return Task(id="m", question="What is it?", answer=answer, domain="math.arithmetic")


# ------------------------------------------------------------------------------------------ exact match


@pytest.mark.parametrize(
    ("completion", "expected", "score"),
    [
        ("So the total is \\boxed{12}.", "12", 1.0),
        ("First 3 + 4 = 7, then \\boxed{7} and finally \\boxed{12}", "12", 1.0),  # the last box counts
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),  # nested braces, LaTeX fraction
        ("\\boxed{\\dfrac{6}{8}}", "3/4", 1.0),
        ("The answer is 3/4.", "0.75", 1.0),
        ("Answer: 0.750 cups", "0.75", 1.0),  # trailing zeros and unit words ignored
        ("The answer is 1,000 meters.", "1000", 1.0),  # thousands separator
        ("**Answer:** 1000.0", "1,000", 1.0),
        ("#### 42", "42", 1.0),
        ("It is 5 km = 5000 m, so 5000", "5000", 1.0),  # last number
        ("The answer is 12 apples. Later she eats 3.", "12", 1.0),  # marker beats the last number
        ("The answer is not obvious, but 2 + 3 = 5", "5", 1.0),  # prose after a marker: last number
        ("x = \u22125", "-5", 1.0),  # Unicode minus
        ("\\boxed{5.}", "5", 1.0),
        ("The answer is Paris.", "paris", 1.0),  # text answers: case and final stop ignored
        ("\\boxed{\\text{Blue Whale}}", "blue  whale", 1.0),
        ("The answer is 11.", "12", 0.0),
        ("\\boxed{3/5}", "0.75", 0.0),
        ("1/3 is about 0.333", "1/3", 0.0),  # exact: 0.333 != 1/3
        ("I do not know.", "12", 0.0),  # no number at all
        ("The answer is London.", "Paris", 0.0),
        # An equation chain states its result last: people read these as 900, not as the 9 they start with.
        ("The answer is 9 * 100 = 900 meters.", "900", 1.0),
        ("The answer is 9 * 100 = 900 meters.", "9", 0.0),
        ("Answer: 2 + 3 = 5 = five", "5", 1.0),  # the last side that holds a number
        ("The answer is 3 - 4 = -1.", "-1", 1.0),
        ("The answer is -1.", "-1", 1.0),
        ("The answer is x = -3 degrees", "-3", 1.0),
        ("The answer is 1,200 + 300 = 1,500 dollars.", "1500", 1.0),
        ("\\boxed{12 \\times 50 = 600}", "600", 1.0),
        ("The answer is 600 g, since 12 * 50 = 600", "600", 1.0),
        ("The answer is 4 * 5 equals 20", "20", 1.0),  # "equals" reads like "="
        ("The answer is x <= 4", "4", 1.0),  # an inequality is not a chain
        # The answer first, then its justification: the first number is the answer.
        ("The answer is 12 = 3 * 4.", "12", 1.0),
        ("Answer: 2 km (= 2000 m)", "2", 1.0),
        ("Answer: 25% (1/4 = 0.25)", "25", 1.0),
        ("Answer: 7 => 8 is next", "7", 1.0),
    ],
)
def test_exact_match(completion: str, expected: str, score: float) -> None:
    result = ExactMatch().score(math_task(expected), completion)
    assert result.score == score, result.reason
    assert repr(expected) in result.reason  # the reason names what was expected...
    if "know" in completion:
        assert result.reason.startswith("no final answer found")
    else:  # ...and what was extracted
        assert result.details["extracted"] is not None
        assert repr(result.details["extracted"][:20])[:-1] in result.reason


def test_extraction_methods() -> None:
    assert extract_answer("\\boxed{\\boxed{3}/4}") == Extracted("\\boxed{3}/4", "boxed")
    assert extract_answer("answer:\n 7 km") == Extracted("7 km", "marker")
    assert extract_answer("we get 4, then 9.5") == Extracted("9.5", "last_number")
    assert extract_answer("\\boxed{} nothing") is None  # an empty box is no answer
    assert extract_answer("no digits here") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234.50", Fraction(246_900, 200)),
        ("-3/4", Fraction(-3, 4)),
        ("5.", Fraction(5)),
        ("1e3", Fraction(1000)),
        ("2/0", None),
        ("abc", None),
        ("1,2", None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_exact_match_needs_a_reference() -> None:
    with pytest.raises(ValidationError, match="majority_vote"):
        ExactMatch().score(math_task(None), "\\boxed{1}")


def test_registry() -> None:
    # Other test modules register rewards of their own (tests/trainer/gspo_rewards.py): the built-ins are
    # checked, not the whole registry.
    assert [n for n in rewards.reward_names() if not n.startswith("test_")] == [
        "exact_match",
        "llm_judge",
        "majority_vote",
        "patch_similarity",
        "unit_tests",
    ]
    assert isinstance(get_reward("exact_match"), ExactMatch)
    assert isinstance(get_reward("unit_tests", timeout_s=3), rewards.Reward)
    with pytest.raises(ValidationError) as caught:
        get_reward("exactmatch")
    assert caught.value.field == "verifier"
    assert "valid names: exact_match, llm_judge, majority_vote, patch_similarity" in str(caught.value)


@pytest.mark.parametrize("score", [-0.1, 1.5, float("nan")])
def test_result_score_must_be_in_unit_interval(score: float) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        RewardResult(score, "x")


# ------------------------------------------------------------------------------------------- unit tests

TESTS = """from solution import add


def test_small():
    assert add(1, 2) == 3


def test_zero():
    assert add(0, 0) == 0


def test_negative():
    assert add(-2, -3) == -5


def test_mixed():
    assert add(-1, 4) == 3
"""


def code_task(tests: str = TESTS, **args: object) -> Task:
    return Task(
        id="c", question="Write add(a, b).", verifier="unit_tests", verifier_args={"tests": tests, **args}
    )


@pytest.fixture(scope="module")
def unit() -> UnitTests:
    return UnitTests(timeout_s=10)


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_all_pass(unit: UnitTests) -> None:
    completion = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    result = unit.score(code_task(), completion)
    assert result.score == 1.0
    assert result.reason == "4/4 tests passed"
    assert result.details["passed_tests"] == ["test_small", "test_zero", "test_negative", "test_mixed"]


def test_half_pass(unit: UnitTests) -> None:
    # abs(a) + abs(b) is right for test_small and test_zero only.
    result = unit.score(code_task(), "def add(a, b):\n    return abs(a) + abs(b)\n")
    assert result.score == 0.5
    assert result.reason.startswith("2/4 tests passed; failed: test_negative: AssertionError")
    assert set(result.details["failed_tests"]) == {"test_negative", "test_mixed"}


def test_syntax_error(unit: UnitTests) -> None:
    result = unit.score(code_task(), "```python\ndef add(a, b)\n    return a + b\n```")
    assert result.score == 0.0
    assert result.reason.startswith("solution does not compile: SyntaxError")
    assert "(line 1)" in result.reason and "0/4 tests passed" in result.reason


def test_crash_at_import_and_missing_function(unit: UnitTests) -> None:
    result = unit.score(code_task(), "raise ValueError('boom')")
    assert result.score == 0.0 and "solution raised ValueError: boom on import" in result.reason
    result = unit.score(code_task(), "def plus(a, b):\n    return a + b\n")
    assert result.score == 0.0 and "tests raised ImportError" in result.reason


def test_infinite_loop_times_out_and_its_process_group_is_gone() -> None:
    unit = UnitTests(timeout_s=2)
    result = unit.score(code_task(), "def add(a, b):\n    while True:\n        pass\n")
    assert result.score == 0.0
    assert result.reason == "timed out after 2 s"
    assert result.details["timed_out"] is True
    assert 1.9 < result.details["elapsed_s"] < 8
    assert gone(result.details["pgid"])
    # A task may ask for a shorter limit than the reward's default.
    result = UnitTests(timeout_s=30).score(code_task(timeout_s=1), "import time\ntime.sleep(60)\n")
    assert result.reason == "timed out after 1 s" and gone(result.details["pgid"])


@pytest.mark.parametrize(
    "how",
    [
        "open(TARGET, 'w').write('escaped')",
        "import pathlib; pathlib.Path(TARGET).write_text('escaped')",
        "import os; os.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "import os; os.symlink(TARGET, 'link')",
    ],
)
def test_write_outside_the_sandbox_is_blocked(unit: UnitTests, how: str) -> None:
    target = Path(tempfile.gettempdir()) / f"outside-{secrets.token_hex(8)}"
    code = f"TARGET = {str(target)!r}\n\ndef add(a, b):\n    {how}\n    return a + b\n"
    result = unit.score(code_task(), code)
    assert not target.exists()
    assert result.score == 0.0
    assert "sandbox blocked" in result.reason and str(target) in result.reason
    assert "PermissionError" in result.reason
    if "symlink" not in how:
        assert f"blocked write to {str(target)!r}" in result.reason


def test_writes_inside_the_sandbox_are_allowed_and_other_escapes_blocked(
    unit: UnitTests, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    tests = f"""import os
from solution import add


def test_inside():
    with open("scratch.txt", "w") as fh:
        fh.write("ok")
    import tempfile
    with tempfile.NamedTemporaryFile() as fh:  # TMPDIR points into the sandbox
        fh.write(b"ok")
    assert add(1, 1) == 2


def test_remove():
    os.remove({str(victim)!r})


def test_rename():
    os.rename({str(victim)!r}, "stolen.txt")


def test_dir_fd():
    fd = os.open({str(tmp_path)!r}, os.O_RDONLY)
    os.unlink("victim.txt", dir_fd=fd)


def test_subprocess():
    os.system("true")


def test_socket():
    import socket
    socket.socket()


def test_kill_parent():
    os.kill(os.getppid(), 0)
"""
    result = unit.score(code_task(tests), "def add(a, b):\n    return a + b\n")
    assert victim.read_text() == "keep"
    assert result.details["passed_tests"] == ["test_inside"]
    assert all("PermissionError: sandbox:" in why for why in result.details["failed_tests"].values())
    blocked = " ".join(result.details["blocked"])
    for what in ("os.remove", "os.rename", "opening directory", "os.system", "socket.__new__", "os.kill"):
        assert what in blocked


def test_a_printed_fake_report_does_not_count(unit: UnitTests) -> None:
    fake = 'print(\'{"passed": ["test_small", "test_zero", "test_negative", "test_mixed"]}\')\n'
    result = unit.score(code_task(), fake + "import os\nos._exit(0)\n")
    assert result.score == 0.0 and "without a result" in result.reason


def test_newly_passing_rate(unit: UnitTests) -> None:
    before = unit.score(code_task(), "def add(a, b):\n    return abs(a) + abs(b)\n")
    after = unit.score(code_task(), "def add(a, b):\n    return a + b\n")
    assert newly_passing_rate(before, after) == 1.0  # both previously failing tests now pass
    assert newly_passing_rate(before, before) == 0.0
    assert newly_passing_rate(after, before) is None  # nothing was failing


# ------------------------------------------------------------------------------------- patch similarity

DIFF_A = """diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 def greet(name):
-    return "hello " + name
+    return f"Hello, {name}!"
"""

DIFF_B = """--- a/util.py
+++ b/util.py
@@ -10,2 +10,3 @@
 x = 1
+y = 2
"""

DISJOINT_A = """--- a/app.py
+++ b/app.py
@@ -1 +1 @@
-import sys
+QQQQ = [7, 7, 7]
"""


def patch_task(reference: str) -> Task:
    return Task(id="p", question="Fix it.", answer=reference, verifier="patch_similarity")


def test_identical_patch_scores_one() -> None:
    result = PatchSimilarity().score(patch_task(DIFF_A + DIFF_B), "```diff\n" + DIFF_A + DIFF_B + "```")
    assert result.score == 1.0
    assert result.details["per_file"] == {"app.py": 1.0, "util.py": 1.0}


def test_disjoint_patch_scores_low() -> None:
    result = PatchSimilarity().score(patch_task(DIFF_A), DISJOINT_A)
    a = '-    return "hello " + name\n+    return f"Hello, {name}!"'
    b = "-import sys\n+QQQQ = [7, 7, 7]"
    assert result.score == pytest.approx(difflib.SequenceMatcher(None, b, a, autojunk=False).ratio())
    assert result.score < 0.3


def test_missing_and_extra_files_average_over_the_larger_set() -> None:
    reward = PatchSimilarity()
    # Reference touches two files, the completion only one of them (identically): (1 + 0) / 2.
    assert reward.score(patch_task(DIFF_A + DIFF_B), DIFF_A).score == 0.5
    # The completion touches an extra file: (1 + 0) / max(2, 1).
    extra = DIFF_A + DIFF_B.replace("util.py", "other.py")
    assert reward.score(patch_task(DIFF_A), extra).score == 0.5
    # Three files against one, the shared one half-similar.
    half = similarity('+    return f"Hello, {name}!"', '+    return f"Hi, {name}"')
    three = DIFF_B + DIFF_B.replace("util.py", "b.py") + '--- a/x\n+++ b/app.py\n+    return f"Hi, {name}"\n'
    ref = '--- a/app.py\n+++ b/app.py\n+    return f"Hello, {name}!"\n'
    assert reward.score(patch_task(ref), three).score == pytest.approx(half / 3)


def test_file_maps_and_mixed_forms() -> None:
    reference = '{"app.py": "def f():\\n    return 1\\n", "b.py": "X = 1\\n"}'
    reward = PatchSimilarity()
    assert reward.score(patch_task(reference), reference).score == 1.0
    same_app = '```json\n{"app.py": "def f():\\n    return 1\\n"}\n```'
    assert reward.score(patch_task(reference), same_app).score == 0.5
    # A diff is compared with a file map through its added lines.
    diff = "--- /dev/null\n+++ b/app.py\n@@ -0,0 +1,2 @@\n+def f():\n+    return 1\n"
    assert reward.score(patch_task(reference), diff).score == pytest.approx(
        similarity("def f():\n    return 1", "def f():\n    return 1\n") / 2
    )


def test_no_patch_in_completion() -> None:
    result = PatchSimilarity().score(patch_task(DIFF_A), "I would change the greeting.")
    assert result.score == 0.0 and "no file changes" in result.reason


def test_diff_parsing_survives_wrong_hunk_counts_and_dash_lines() -> None:
    diff = (
        "--- a/m.md\n+++ b/m.md\n@@ -1,1 +1,1 @@\n---- old rule\n+++++ new rule\n--- a/n.md\n+++ b/n.md\n+x\n"
    )
    files = parse_unified_diff(diff)
    assert files["m.md"].changes == ["---- old rule", "+++++ new rule"]
    assert files["n.md"].changes == ["+x"]


# -------------------------------------------------------------------------------------------- LLM judge


class ScriptedJudge:
    """A deterministic fake LLM: replies from a script, in order, and records the prompts it was given."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.replies.pop(0)


JUDGED = Task(id="j", question="What is 6 * 7?", answer="42", verifier="llm_judge")


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("Correct and well argued.\nSCORE: 0.8", 0.8),
        ("Score: 7/10", 0.7),
        ("SCORE: 8", 0.8),  # a bare value in (1, 10] is a 0-10 grade
        ("SCORE: 1", 1.0),
        ("**Score**: 85%", 0.85),
        ("score = .5", 0.5),
        ("I first thought SCORE: 0.2 but on reflection\nSCORE: 0.9", 0.9),  # the last one counts
    ],
)
def test_judge_score_parsing(reply: str, value: float) -> None:
    parsed = parse_judge_score(reply)
    assert parsed is not None and parsed[0] == pytest.approx(value)


@pytest.mark.parametrize(
    "reply", ["Looks right to me.", "SCORE: 42", "SCORE: -1", "SCORE: 3/0", "", "SCORE: high"]
)
def test_judge_unparseable(reply: str) -> None:
    assert parse_judge_score(reply) is None


def test_judge_prompt_and_reason() -> None:
    judge = ScriptedJudge("The product is right.\nSCORE: 1")
    result = LlmJudge(judge).score(JUDGED, "6 * 7 = 42")
    assert result.score == 1.0 and result.details["retries"] == 0
    assert result.reason == "judge gave 1.00: The product is right."
    (prompt,) = judge.prompts
    assert "What is 6 * 7?" in prompt and "<reference_answer>\n42\n" in prompt and "6 * 7 = 42" in prompt


def test_judge_malformed_output_is_retried_then_counted() -> None:
    judge = ScriptedJudge("It is fine I guess", "SCORE: 0.6")
    result = LlmJudge(judge, max_retries=2).score(JUDGED, "42")
    assert result.score == 0.6 and result.details["retries"] == 1
    assert "could not be read" not in judge.prompts[0] and "could not be read" in judge.prompts[1]

    judge = ScriptedJudge("meh", "still meh", "SCORE: eleven")
    result = LlmJudge(judge, max_retries=2).score(JUDGED, "42")
    assert result.score == 0.0
    assert result.reason == "judge output unparseable after 3 attempts"
    assert result.details["retries"] == 2 and len(judge.prompts) == 3


def test_async_judge() -> None:
    calls: list[str] = []

    async def judge(prompt: str) -> str:
        calls.append(prompt)
        await asyncio.sleep(0)
        return "SCORE: 0.25"

    reward = LlmJudge(judge)
    assert reward.score(JUDGED, "41").score == 0.25  # no event loop running: score() drives it

    async def main() -> list[RewardResult]:
        with pytest.raises(RuntimeError, match="ascore"):
            reward.score(JUDGED, "41")  # inside a loop score() cannot block on it
        return await ascore_group(reward, JUDGED, ["41", "42", "43"])

    assert [r.score for r in asyncio.run(main())] == [0.25] * 3
    assert len(calls) == 4


def test_judge_is_required_and_label_free_tasks_are_judged_without_reference() -> None:
    with pytest.raises(ValidationError, match="judge callable"):
        get_reward("llm_judge")
    judge = ScriptedJudge("SCORE: 0.5")
    LlmJudge(judge).score(math_task(None).model_copy(update={"verifier": "llm_judge"}), "x")
    assert "There is no reference answer" in judge.prompts[0]


# -------------------------------------------------------------------------------- label-free majority


def votes(completions: list[str]) -> list[float]:
    return [r.score for r in MajorityVote().group_scores(math_task(None), completions)]


def test_majority_vote() -> None:
    group = ["\\boxed{1000}", "so 1,000", "The answer is 1000.0 m", "\\boxed{999}", "no idea"]
    results = MajorityVote().group_scores(math_task(None), group)
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert results[0].reason == "answer '1000' agrees with the majority answer '1000' (3/5)"
    assert "differs from the majority answer '1000'" in results[3].reason
    assert results[4].reason == "no final answer found"


def test_majority_vote_ties_are_broken_deterministically() -> None:
    group = ["\\boxed{7}", "\\boxed{5}", "\\boxed{7}", "\\boxed{5}"]
    assert votes(group) == [0.0, 1.0, 0.0, 1.0]  # tie: the smaller answer wins
    for perm in itertools.permutations(group):
        assert {c: s for c, s in zip(perm, votes(list(perm)), strict=True)} == {
            "\\boxed{7}": 0.0,
            "\\boxed{5}": 1.0,
        }
    # Numbers rank before text.
    assert votes(["The answer is cat.", "The answer is cat.", "\\boxed{9}", "\\boxed{9}"]) == [
        0.0,
        0.0,
        1.0,
        1.0,
    ]


def test_majority_vote_without_agreement() -> None:
    assert votes(["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"]) == [0.0, 0.0, 0.0]  # no two agree
    assert votes(["nothing", "nope"]) == [0.0, 0.0]
    assert votes(["\\boxed{4}", "nothing"]) == [1.0, 0.0]  # the only answer is the majority
    assert MajorityVote().score(math_task(None), "\\boxed{4}").score == 1.0


def test_score_group_falls_back_to_majority_vote_for_label_free_tasks() -> None:
    group = ["\\boxed{3}", "\\boxed{3}", "\\boxed{4}"]
    assert [r.score for r in score_group(ExactMatch(), math_task(None), group)] == [1.0, 1.0, 0.0]
    assert [r.score for r in score_group(ExactMatch(), math_task("4"), group)] == [0.0, 0.0, 1.0]
    assert [r.score for r in score_group(ExactMatch(), math_task("4"), group, label_free=True)] == [
        1.0,
        1.0,
        0.0,
    ]
    scored = asyncio.run(ascore_group(ExactMatch(), math_task("4"), group))
    assert [r.score for r in scored] == [0.0, 0.0, 1.0]
    assert [r.score for r in asyncio.run(ascore_group(ExactMatch(), math_task(None), group))] == [
        1.0,
        1.0,
        0.0,
    ]


def test_plain_reward_protocol() -> None:
    class Length:
        def score(self, task: Task, completion: str) -> RewardResult:
            return RewardResult(min(1.0, len(completion) / 10), "length")

    assert isinstance(Length(), rewards.Reward)
    assert [r.score for r in score_group(Length(), math_task("1"), ["abcde", "x" * 20])] == [0.5, 1.0]
    assert asyncio.run(ascore_group(Length(), math_task("1"), ["ab"]))[0].score == 0.2
