"""Task files: schema, line-numbered errors, the deterministic split and the shipped task set."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from zoo.registry.errors import ValidationError
from zoo.trainer.rewards import get_reward
from zoo.trainer.rewards.unit_tests import unit_test_names
from zoo.trainer.tasks import generate as gen_tasks
from zoo.trainer.tasks.loading import load_jsonl, load_shipped, parse_task
from zoo.trainer.tasks.schema import (
    DATA_DIR,
    GENERAL_INSTRUCTION,
    MATH_INSTRUCTION,
    Task,
    instruction_for,
    split,
    task_id,
    write_jsonl,
)

TESTS = "from solution import f\n\n\ndef test_f():\n    assert f() == 1\n"


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_round_trip(tmp_path: Path) -> None:
    tasks = [
        Task(id="a", question="1+1?", answer="2", domain="math.arithmetic"),
        Task(id="b", question="Free-form?"),  # label-free: no answer
        Task(
            id="c",
            question="f",
            answer="def f(): return 1",
            verifier="unit_tests",
            verifier_args={"tests": TESTS},
        ),
    ]
    write_jsonl(tmp_path / "t.jsonl", tasks)
    assert load_jsonl(tmp_path / "t.jsonl") == tasks
    assert [t.label_free for t in tasks] == [False, True, False]


def test_defaults_and_number_answers(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl", [{"question": "2*3?", "answer": 6}, {"question": "1/4?", "answer": 0.25}]
    )
    first, second = load_jsonl(path)
    assert (first.answer, second.answer) == ("6", "0.25")
    assert (first.domain, first.verifier, first.verifier_args) == ("general", "exact_match", {})
    # A missing id is derived from the content, so regenerating an unchanged task keeps it.
    assert first.id == task_id("2*3?", "general") == load_jsonl(path)[0].id
    assert first.id != second.id


@pytest.mark.parametrize(
    ("bad_line", "field", "words"),
    [
        ('{"question": "x", "answer": ', "line 3", "invalid JSON"),
        ('["not", "an", "object"]', "line 3", "JSON object"),
        ({"answer": "1"}, "line 3: question", "required"),
        ({"question": "   "}, "line 3: question", "blank"),
        ({"question": "x", "answer": True}, "line 3: answer", "boolean"),
        ({"question": "x", "colour": "red"}, "line 3: colour", "unknown field"),
        ({"question": "x", "domain": "Math Stuff"}, "line 3: domain", "lower-case"),
        ({"question": "x", "id": "bad id!"}, "line 3: id", "pattern"),
        (
            {"question": "x", "verifier": "exact_mach"},
            "line 3: verifier",
            "valid names: exact_match, llm_judge",
        ),
        ({"question": "x", "verifier": "unit_tests"}, "line 3: verifier_args.tests", "test code"),
        (
            {"question": "x", "verifier": "unit_tests", "verifier_args": {"tests": "def helper(): pass"}},
            "line 3: verifier_args.tests",
            "no top-level test_",
        ),
        (
            {"question": "x", "verifier": "unit_tests", "verifier_args": {"tests": "def test_x(:"}},
            "line 3: verifier_args.tests",
            "does not parse",
        ),
        (
            {"question": "x", "verifier_args": {"tests": TESTS}},
            "line 3: verifier_args.tests",
            "not an argument",
        ),
        (
            {"question": "x", "verifier": "patch_similarity", "answer": "no diff here"},
            "line 3: answer",
            "no file",
        ),
        ({"id": "one", "question": "again"}, "line 3: id", "duplicate id 'one' (first on line 1)"),
    ],
)
def test_bad_line_names_the_line(tmp_path: Path, bad_line: object, field: str, words: str) -> None:
    # Line 2 is blank: line numbers count physical lines, so an editor's line number finds the problem.
    path = write_lines(tmp_path / "t.jsonl", [{"id": "one", "question": "ok?", "answer": "1"}, "", bad_line])
    with pytest.raises(ValidationError) as caught:
        load_jsonl(path)
    assert caught.value.field == field
    assert words in str(caught.value)
    assert str(caught.value).startswith(field + ": ")


def test_instructions_belong_to_tasks(tmp_path: Path) -> None:
    """A label or unit task is not told to box a number: the math instruction is for math domains only."""
    own = "Reply with one word: the label."
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {"question": "2*3?", "answer": 6, "domain": "math.arithmetic"},
            {"question": "Weather for 'sunny'?", "answer": "CLEAR", "domain": "labels.weather"},
            {"question": "Rain?", "answer": "WET", "domain": "labels.weather", "instruction": own},
            {"question": "f", "answer": "def f(): return 1", "verifier": "unit_tests",
             "verifier_args": {"tests": TESTS}, "domain": "math.code"},
        ],
    )  # fmt: skip
    math_task, label_task, own_task, code_task = load_jsonl(path)
    assert instruction_for(math_task) == MATH_INSTRUCTION and "boxed" in MATH_INSTRUCTION
    assert instruction_for(label_task) == GENERAL_INSTRUCTION and "boxed" not in GENERAL_INSTRUCTION
    assert instruction_for(own_task) == own
    assert "```python" in instruction_for(code_task)  # what its verifier reads, whatever the domain
    # A run's instruction (a whole dataset's) applies to every task without its own.
    assert instruction_for(label_task, "Say the label.") == instruction_for(math_task, "Say the label.")
    assert instruction_for(own_task, "Say the label.") == own
    # A task's own instruction survives the round trip through JSONL.
    write_jsonl(tmp_path / "again.jsonl", [own_task])
    assert load_jsonl(tmp_path / "again.jsonl")[0].instruction == own


@pytest.mark.parametrize(("instruction", "words"), [("  ", "is blank"), ("x" * 4001, "at most 4000")])
def test_bad_instruction_is_refused(instruction: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_task({"question": "x", "instruction": instruction})
    assert caught.value.field == "instruction" and words in str(caught.value)


def test_a_tasks_reasoning_round_trips_and_is_checked(tmp_path: Path) -> None:
    worked = Task(
        id="w", question="A rope is 2 m long. Record?", answer="200", reasoning="2 m = 2 × 100 = 200 cm."
    )
    write_jsonl(tmp_path / "t.jsonl", [worked, Task(id="bare", question="q", answer="1")])
    assert load_jsonl(tmp_path / "t.jsonl")[0] == worked
    assert "reasoning" not in (tmp_path / "t.jsonl").read_text().splitlines()[1], "an unset field is written"
    for bad, words in [
        ({"question": "x", "reasoning": "no answer to lead to"}, "leads to a reference answer"),
        ({"question": "x", "answer": "1", "reasoning": " "}, "is blank"),
        ({"question": "x", "answer": "1", "reasoning": "x" * 1001}, "at most 1000"),
    ]:
        with pytest.raises(ValidationError) as caught:
            parse_task(bad)
        assert caught.value.field == "reasoning" and words in str(caught.value), caught.value


def test_parse_task_without_line() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_task({"question": "x", "verifier": "nope"})
    assert caught.value.field == "verifier"


def make_tasks() -> list[Task]:
    tasks = [Task(id=f"m{i}", question=f"q{i}", answer="1", domain="math") for i in range(50)]
    tasks += [Task(id=f"c{i}", question=f"c{i}", answer="1", domain="code") for i in range(10)]
    return tasks


def test_split_is_deterministic_stratified_and_order_independent() -> None:
    tasks = make_tasks()
    train, val = split(tasks, 0.2, seed=0)
    assert split(tasks, 0.2, seed=0) == (train, val)
    assert Counter(t.domain for t in val) == {"math": 10, "code": 2}
    assert len(train) + len(val) == len(tasks)
    assert not {t.id for t in train} & {t.id for t in val}
    # Both parts keep the input order.
    order = {t.id: i for i, t in enumerate(tasks)}
    assert [order[t.id] for t in train] == sorted(order[t.id] for t in train)
    assert [order[t.id] for t in val] == sorted(order[t.id] for t in val)
    # The split does not depend on the order of the input, only on ids and the seed.
    _, val_r = split(list(reversed(tasks)), 0.2, seed=0)
    assert {t.id for t in val_r} == {t.id for t in val}
    assert {t.id for t in split(tasks, 0.2, seed=1)[1]} != {t.id for t in val}
    # Adding a task moves at most one other task across (the one it displaces, or the one now added).
    extra = [*tasks, Task(id="m-new", question="new", answer="1", domain="math")]
    _, val_extra = split(extra, 0.2, seed=0)
    assert len(({t.id for t in val} ^ {t.id for t in val_extra}) - {"m-new"}) <= 1
    assert split(tasks, 0.0, seed=0) == (tasks, [])


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_split_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValidationError, match="validation_fraction"):
        split(make_tasks(), fraction, seed=0)


def test_split_rejects_duplicate_ids() -> None:
    task = Task(id="same", question="q")
    with pytest.raises(ValidationError, match="unique"):
        split([task, task], 0.5, seed=0)


def test_shipped_data_sizes_and_domains() -> None:
    train, val = load_shipped("train"), load_shipped("validation")
    assert (len(train), len(val)) == (86, 22)
    everything = train + val
    assert len({t.id for t in everything}) == len(everything)
    assert len({t.question for t in everything}) == len(everything)
    assert Counter(t.domain for t in everything) == {
        "math.arithmetic": 60,
        "math.units": 40,
        "code.python": 8,
    }
    assert Counter(t.domain for t in val) == {"math.arithmetic": 12, "math.units": 8, "code.python": 2}
    for task in everything:
        if task.domain.startswith("math."):
            assert task.verifier == "exact_match" and task.answer is not None
            assert 0 <= int(task.answer) <= 12000  # whole numbers, small enough for a 135M model
        else:
            assert task.verifier == "unit_tests"
            assert 3 <= len(unit_test_names(task.verifier_args["tests"])) <= 5


def test_every_shipped_task_accepts_its_reference_answer() -> None:
    exact, tests = get_reward("exact_match"), get_reward("unit_tests", timeout_s=20)
    for task in load_shipped("train") + load_shipped("validation"):
        assert task.answer is not None
        reward = exact if task.verifier == "exact_match" else tests
        result = reward.score(task, task.answer)
        assert result.score == 1.0, (task.id, result.reason)
        if task.verifier == "unit_tests":
            # And a wrong solution fails: the tests do test something.
            assert tests.score(task, "def unrelated():\n    pass\n").score == 0.0


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    assert gen_tasks.write(tmp_path, seed=0) == (86, 22)
    for name in ("train.jsonl", "validation.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), f"{name}: run gen_tasks"
    other = tmp_path / "other"
    gen_tasks.write(other, seed=1)
    assert (other / "train.jsonl").read_bytes() != (DATA_DIR / "train.jsonl").read_bytes()


def test_convention_families_are_reproducible_balanced_and_disjoint(tmp_path: Path) -> None:
    from zoo.trainer.tasks import families

    sizes = families.write(tmp_path)
    names = [*families.FAMILIES, *families.VERIFIER_ONLY]
    assert sizes == {name: {"train": 24, "validation": 12, "test": 16} for name in names}
    for name in names:
        questions: set[str] = set()
        for split_name, _ in families.SPLITS:
            shipped = families.path(name, split_name)
            assert (tmp_path / shipped.name).read_bytes() == shipped.read_bytes(), f"{shipped}: regenerate it"
            tasks = load_jsonl(shipped)
            assert not questions & {t.question for t in tasks}, f"{name}: {split_name} repeats a question"
            questions |= {t.question for t in tasks}
            assert all(t.instruction is None and not t.domain.startswith("math") for t in tasks)
            if name in families.VERIFIER_ONLY:
                assert all(t.answer is None and t.verifier == "unit_tests" for t in tasks)
            if name == "habitats":
                assert sum(t.answer == "WET" for t in tasks) * 2 == len(tasks), "labels must be balanced"
    # The reference answers are what the verifier accepts, as a person would write them.
    length = load_jsonl(families.path("lengths", "test"))[0]
    assert get_reward("exact_match").score(length, f"Answer: {length.answer} cm").score == 1.0
    # The lengths' working is right: it ends at the answer, and the arithmetic it shows gives it.
    for task in load_jsonl(families.path("lengths", "train")):
        assert task.reasoning is not None and task.reasoning.endswith(f"= {task.answer} cm.")
        shown = task.reasoning.split(" = ")[1].replace("\N{MULTIPLICATION SIGN}", "*")
        assert eval(shown) == int(task.answer), task.reasoning


def test_sums_are_every_single_digit_pair_in_disjoint_splits_written_where_asked(tmp_path: Path) -> None:
    from zoo.trainer.tasks import families

    paths = families.write_sums(tmp_path / "sums")
    splits = {name: load_jsonl(p) for name, p in paths.items()}
    assert {name: len(tasks) for name, tasks in splits.items()} == {"train": 24, "validation": 12, "test": 16}
    questions = [t.question for tasks in splits.values() for t in tasks]
    assert len(set(questions)) == 52, "no question in two splits"
    for task in (t for tasks in splits.values() for t in tasks):
        a, b = (int(x) for x in task.question.removeprefix("What is ").removesuffix("?").split(" + "))
        assert 1 <= a <= 9 and 1 <= b <= 9 and task.answer == str(a + b)
    # The split the benchmarks' sums figures were measured on (issue 13's shuffle): its first tasks pinned.
    firsts = (splits["train"][0].id, splits["test"][0].id, splits["validation"][0].id)
    assert firsts == ("sum-4-4", "sum-3-9", "sum-5-8")


def test_unset_prompt_settings_come_from_the_serving_side() -> None:
    from zoo.inference.defaults import ServingDefaults
    from zoo.trainer.tfgrpo.spec import TfGrpoSpec

    served = ServingDefaults(k=3, experience_budget_tokens=256, lesson_position="user", factor_eta=0.5,
                             factor_cap=2.0)  # fmt: skip
    spec = TfGrpoSpec.parse({})
    assert (spec.k, spec.experience_budget_tokens, spec.lesson_position) == (None, None, None)
    assert spec.serving() == ServingDefaults(), "unset and outside a node: the built-in serving defaults"
    filled = spec.with_serving_defaults(served)
    assert filled.serving() == served
    assert (filled.k, filled.experience_budget_tokens, filled.lesson_position) == (3, 256, "user")
    own = TfGrpoSpec.parse({"k": 7, "experience_budget_tokens": 900, "lesson_position": "system",
                            "factor_eta": 2.0}).with_serving_defaults(served)  # fmt: skip
    assert (own.k, own.experience_budget_tokens, own.lesson_position) == (7, 900, "system"), (
        "a job may override"
    )
    assert (own.factor_eta, own.factor_cap) == (2.0, 2.0)
    with pytest.raises(ValidationError, match="lesson_position"):
        TfGrpoSpec.parse({"lesson_position": "footer"})
    with pytest.raises(ValidationError, match="factor_eta"):
        TfGrpoSpec.parse({"factor_eta": float("nan")})


def test_the_functions_family_checks_code_by_its_behaviour() -> None:
    """Each function's tests pass a right implementation (built from its template) and fail a wrong one."""
    from zoo.trainer.tasks import families

    unit_tests = get_reward("unit_tests")
    templates = {
        name.format(k=k): (result, k) for name, _, result, _ in families._FUNCTIONS for k in range(2, 10)
    }
    for task in load_jsonl(families.path("functions", "test"))[:4]:
        fn = task.question.split("`")[1].split("(")[0]
        result, k = templates[fn]
        right = f"```python\ndef {fn}(x):\n    k = {k}\n    return {result}\n```"
        wrong = f"```python\ndef {fn}(x):\n    return None\n```"
        assert unit_tests.score(task, right).score == 1.0, (task.question, right)
        assert unit_tests.score(task, wrong).score < 1.0
