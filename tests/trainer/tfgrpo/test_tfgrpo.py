"""The TF-GRPO loop in process: a scripted model controls the replies, the embedder is the real MiniLM.

The scripted model answers "What is A plus B?" right or wrong as each test needs and plays the critic
stages; the real bundled model runs the same loop in tests/node/jobs/test_runner.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.scripted import Call, ScriptedBackend, arithmetic_policy, boxed, one_wrong_in, ops_json
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.inference.prompt import worked_answer
from zoo.registry.canonical import decode_library
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.trainer.baselines import LOOKUP_AUTHOR
from zoo.trainer.rewards import RewardResult
from zoo.trainer.tasks.schema import Task, instruction_for, write_jsonl
from zoo.trainer.tfgrpo.credit import advantages_of, confidence_of
from zoo.trainer.tfgrpo.job import run_tf_grpo
from zoo.trainer.tfgrpo.llm import LLM, ContextTooSmall
from zoo.trainer.tfgrpo.loop import Context, TfGrpoRun
from zoo.trainer.tfgrpo.operations import Outcome, add_examples
from zoo.trainer.tfgrpo.run_state import TrainState
from zoo.trainer.tfgrpo.selection import choose
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import Group
from zoo.trainer.tfgrpo.worked_examples import example_candidate

GOOD = "When adding two numbers, add the ones digits first and then the tens digits."
POISON = "When adding two numbers, always add one more to the total at the end."
MODEL = "scripted"


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def tasks_file(tmp_path: Path, n: int, name: str = "tasks.jsonl", start: int = 0) -> Path:
    tasks = [
        Task(
            id=f"add-{i}",
            question=f"What is {i} plus {i + 3}?",
            answer=str(2 * i + 3),
            domain="math.arithmetic",
        )
        for i in range(start, start + n)
    ]
    path = tmp_path / name
    write_jsonl(path, tasks)
    return path


class Run:
    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.saves: list[tuple[int, dict[str, Any]]] = []

    async def emit(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    async def save(self, step: int, state: dict[str, Any], event: tuple[str, dict[str, Any]]) -> None:
        self.saves.append((step, json.loads(json.dumps(state))))
        self.events.append(event)

    def steps(self) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == "step_completed"]


def run_job(
    tmp_path: Path,
    embedder: SentenceTransformerEmbedder,
    policy: Callable[[Call], str],
    spec: dict[str, Any],
    *,
    current: Library | None = None,
    resume: dict[str, Any] | None = None,
    out: str = "out",
) -> tuple[Run, dict[str, Any]]:
    run = Run(ScriptedBackend(policy, MODEL))
    # The critic's lesson mechanics, learned from nothing, are what most tests here examine; tests of worked
    # examples and of the lookup start say so.
    spec = {"experience_kinds": "lessons", "lookup_start": False, **spec}
    result = asyncio.run(
        run_tf_grpo(
            TfGrpoSpec.parse(spec),
            LLM(run.backend, 4),
            embedder,
            current,
            "0x" + "ab" * 32 if current is not None else "",
            author="job:test",
            out_dir=tmp_path / out,
            emit=run.emit,
            save=run.save,
            resume=resume,
        )
    )
    return run, result


def test_advantages_and_confidence() -> None:
    assert advantages_of([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = advantages_of([1.0, 0.0])
    assert a[0] > 0 > a[1] and abs(a[0] + a[1]) < 1e-9
    assert advantages_of([0.5]) == [0.0]
    assert confidence_of(0.5, 0.0, 0) == pytest.approx(0.5)
    assert confidence_of(0.8, 0.0, 0) == pytest.approx(0.8), "no uses: where it started"
    # Offered to a whole group, an experience's advantages cancel: it drifts to neutral, whatever the
    # group's success rate, instead of being condemned by a group that mostly failed.
    assert confidence_of(0.5, sum(advantages_of([1, 0, 0, 0, 0])), 5) == pytest.approx(0.5)
    assert confidence_of(0.8, 0.0, 50) == pytest.approx(0.5, abs=0.03)
    # Used only by the better rollouts it rises; only by the worse ones it falls, below 0.5 (a negative
    # factor weight).
    assert confidence_of(0.5, 2.0, 2) == pytest.approx(1 / (1 + math.exp(-0.5)))
    assert confidence_of(0.5, -2.0, 2) < 0.5 < confidence_of(0.5, 1.0, 1)
    assert 0 < confidence_of(1.0, -100.0, 1) < confidence_of(0.0, 100.0, 1) < 1


def test_a_step_keeps_its_best_candidate_that_does_not_drop() -> None:
    assert choose({"both": 0.5, "examples": 0.75, "lessons": 0.25}, 0.5, 0.0) == "examples"
    sizes = {
        "both": (3, 0),
        "examples": (2, 0),
        "prune": (0, 0),
        "lessons": (1, 1),
        "lessons-no-factors": (1, 0),
    }
    assert choose({"both": 0.75, "examples": 0.75}, 0.5, 0.0, sizes) == "examples", "a tie: the smaller"
    assert choose({"both": 0.5, "examples": 0.5}, 0.5, 0.0, sizes, (1, 0)) is None, (
        "no better: nothing enters"
    )
    assert choose({"both": 0.5, "prune": 0.5}, 0.5, 0.0, sizes, (1, 0)) == "prune", "a prune may tie"
    assert choose({"lessons": 0.75, "lessons-no-factors": 0.75}, 0.5, 0.0, sizes) == "lessons-no-factors"
    assert choose({"lessons": 1.0, "lessons-no-factors": 0.75}, 0.5, 0.0, sizes) == "lessons"
    assert choose({"both": 0.25, "examples": 0.4}, 0.5, 0.0) is None, "all drop: reverted"
    assert choose({"both": 0.25, "examples": 0.4}, 0.5, 0.1) == "examples", "within the tolerance"
    assert choose({"lessons": None, "lessons-no-factors": None}, None, 0.0) == "lessons", "no validation"
    assert choose({}, 0.5, 0.0) is None


def test_one_epoch_learns_a_lesson_and_writes_outputs(tmp_path: Path, embedder) -> None:
    policy = arithmetic_policy(
        correct=one_wrong_in(3), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 4)),
        "validation": str(tasks_file(tmp_path, 2, "val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
    }
    run, result = run_job(tmp_path, embedder, policy, spec)
    types = [t for t, _ in run.events]
    assert types[:3] == ["started", "baseline", "step_started"]
    assert types.count("step_completed") == 2 and types[-1] == "step_completed"
    steps = run.steps()
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["rollouts"] == 6 and s["groups"] == 2 for s in steps)
    # Some group had mixed rewards, so a comparison ran and the lesson was added and kept.
    assert steps[0]["operations_applied"] >= 1 and steps[0]["decision"] == "kept"
    lib = decode_library((tmp_path / "out" / "library.json").read_bytes())
    assert lib.version == 1 and lib.parent_root == "" and lib.base_model == MODEL
    assert [e.text for e in lib.experiences] == [GOOD]
    assert lib.experiences[0].provenance.author == "job:test"
    assert result["root"].startswith("0x") and result["experiences"] == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(report["curve"]) == 2 and report["operations"][0]["op"] == "add"
    assert report["cost"]["calls"] == len(run.backend.recorder.calls)
    assert (tmp_path / "out" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The lesson was in the prompt of every later rollout (small library: all lessons are injected).
    later = [c for c in run.backend.recorder.calls if c.stage == "rollout" and GOOD in c.system]
    assert later, "the learned lesson never reached a rollout prompt"


def test_homogeneous_groups_are_skipped_without_llm_critique(tmp_path: Path, embedder) -> None:
    policy = arithmetic_policy(
        correct=lambda c: True, compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
    }
    run, _ = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    assert (
        step["groups_skipped"] == 2 and step["operations_proposed"] == 0 and step["decision"] == "no_change"
    )
    assert set(run.backend.recorder.stages()) == {"rollout"}


def test_malformed_json_is_retried_with_a_stricter_instruction_and_counted(tmp_path: Path, embedder) -> None:
    def compare(call: Call) -> str:
        if call.retry:
            return "Sure! ```json\n" + ops_json({"op": "add", "text": GOOD}) + "\n```"
        return "I think we should add a lesson about carrying {op: add"

    policy = arithmetic_policy(correct=one_wrong_in(3), compare=compare)
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
    }
    run, result = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    informative = step["groups"] - step["groups_skipped"]
    assert informative >= 1
    assert step["json_retries"] == informative and step["json_failures"] == 0
    assert step["operations_applied"] == 1
    retried = [c for c in run.backend.recorder.calls if c.stage == "compare" and c.retry]
    assert len(retried) == informative
    assert "invalid JSON" in retried[0].last or "no JSON" in retried[0].last
    report = json.loads(Path(result["report"]).read_text())
    assert report["json"]["compare"] == {"retries": informative, "failures": 0, "cut": 0}


def test_json_that_never_parses_is_given_up_and_reported_not_fatal(tmp_path: Path, embedder) -> None:
    policy = arithmetic_policy(correct=one_wrong_in(3), compare=lambda c: "no JSON here, sorry")
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "max_json_retries": 2,
    }
    run, result = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    informative = step["groups"] - step["groups_skipped"]
    assert step["json_failures"] == informative and step["json_retries"] == 2 * informative
    assert step["operations_applied"] == 0 and result["experiences"] == 0


def test_a_step_that_lowers_validation_is_reverted(tmp_path: Path, embedder) -> None:
    mixed = one_wrong_in(3)

    def correct(call: Call) -> bool:  # greedy answers are right until the poison is in the prompt
        return POISON not in call.system and (call.temperature == 0 or mixed(call))

    policy = arithmetic_policy(correct=correct, compare=lambda c: ops_json({"op": "add", "text": POISON}))
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation": str(tasks_file(tmp_path, 2, "val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
    }
    run, result = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    assert step["operations_proposed"] >= 1
    assert step["decision"] == "reverted"
    assert step["candidate_validation_score"] == 0.0 and step["validation_score"] == 1.0
    assert step["operations_applied"] == 0 and result["experiences"] == 0
    # The validation rollouts did see the poisoned library before it was thrown away.
    assert any(POISON in c.system for c in run.backend.recorder.calls if c.temperature == 0)


def test_consolidation_delete_beats_modify_and_duplicates_merge(tmp_path: Path, embedder) -> None:
    old = Experience.create(
        text="When adding numbers, write them in a column first.",
        domain="math.arithmetic",
        confidence=0.7,
        author="job:seed",
        base_model=MODEL,
        created_at="2026-01-01T00:00:00Z",
    )
    gone = Experience.create(
        text="When adding, guess the answer quickly.",
        domain="math.arithmetic",
        confidence=0.5,
        author="job:seed",
        base_model=MODEL,
        created_at="2026-01-01T00:00:00Z",
    )
    current = Library.create(version=4, base_model=MODEL, experiences=[old, gone])
    merged = "When adding two numbers, add the ones first, then the tens, and carry."

    def compare(call: Call) -> str:
        return ops_json(
            {"op": "delete", "id": gone.id},
            {"op": "modify", "id": gone.id, "text": "When adding, never guess."},
            {"op": "add", "text": GOOD},
        )

    def merge(call: Call) -> str:
        return json.dumps({"text": merged})

    policy = arithmetic_policy(correct=one_wrong_in(3), compare=compare, merge=merge)
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "k": 8,
    }
    _, result = run_job(tmp_path, embedder, policy, spec, current=current)
    lib = decode_library(Path(result["library"]).read_bytes())
    texts = {e.text for e in lib.experiences}
    assert gone.text not in texts and "When adding, never guess." not in texts  # delete beat modify
    assert old.text in texts  # untouched lessons keep their id
    assert old.id in {e.id for e in lib.experiences}
    # Both groups proposed GOOD: near-duplicates merge into one lesson (via the merge stage).
    assert sum(1 for t in texts if t in (GOOD, merged)) == 1
    report = json.loads(Path(result["report"]).read_text())
    ops = {o["op"] for o in report["operations"]}
    assert "delete" in ops
    assert any(r["reason"] == "deleted in the same batch" for r in report["rejected_operations"])
    assert lib.version == 5 and lib.parent_root == "0x" + "ab" * 32


def test_invalid_lesson_text_gets_one_rewrite_then_is_rejected(tmp_path: Path, embedder) -> None:
    long_text = "When adding numbers, " + " ".join(["carefully"] * 40)
    policy = arithmetic_policy(
        correct=one_wrong_in(3),
        compare=lambda c: ops_json(
            {"op": "add", "text": long_text}, {"op": "modify", "id": "exp-0000000000000000", "text": GOOD}
        ),
        merge=lambda c: json.dumps({"text": "Adding is fun"}),  # still no trigger word
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 1,
        "group_size": 3,
    }
    _, result = run_job(tmp_path, embedder, policy, spec)
    report = json.loads(Path(result["report"]).read_text())
    reasons = [r["reason"] for r in report["rejected_operations"]]
    assert "unknown id" in reasons
    assert any("not a valid lesson" in r for r in reasons)
    assert result["experiences"] == 0


def test_label_free_rewards_agreement_with_the_majority(tmp_path: Path, embedder) -> None:
    tasks = [
        Task(id=f"lf-{i}", question=f"What is {i} plus {i}?", domain="math.arithmetic") for i in range(2)
    ]
    write_jsonl(tmp_path / "lf.jsonl", tasks)

    policy = arithmetic_policy(
        correct=one_wrong_in(4), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tmp_path / "lf.jsonl"),
        "validation_limit": 0,
        "label_free": True,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 4,
    }
    run, _ = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    assert step["rollouts"] == 8
    # Without answers exact_match could not score at all; majority vote did (rewards are not all zero).
    assert step["reward_mean"] > 0
    compares = [c for c in run.backend.recorder.calls if c.stage == "compare"]
    assert all("Reference answer" not in c.user for c in compares)


def test_resume_from_a_checkpoint_makes_the_same_library(tmp_path: Path, embedder) -> None:
    counter = {"n": 0}

    def compare(call: Call) -> str:
        counter["n"] += 1
        q = call.user.split("What is ", 1)[1].split("?", 1)[0]
        return ops_json({"op": "add", "text": f"When asked what is {q}, add carefully and check the sum."})

    policy = arithmetic_policy(correct=one_wrong_in(3), compare=compare)
    spec = {
        "dataset": str(tasks_file(tmp_path, 6)),
        "validation": str(tasks_file(tmp_path, 1, "val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "merge_threshold": 0.999,
    }
    full, full_result = run_job(tmp_path, embedder, policy, spec, out="full")
    assert [s for s, _ in full.saves] == [0, 1, 2, 3]
    after_one = {
        "base": {"version": 0, "root": "", "experiences_from": "current"},
        "created_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        **full.saves[1][1],
    }
    resumed, resumed_result = run_job(tmp_path, embedder, policy, spec, resume=after_one, out="resumed")
    assert resumed.events[0][0] == "resumed"
    assert [s["step"] for s in resumed.steps()] == [2, 3]
    a = decode_library(Path(full_result["library"]).read_bytes())
    b = decode_library(Path(resumed_result["library"]).read_bytes())
    assert a.experiences == b.experiences and a.experiences, "the same experiences, confidences included"
    assert resumed_result["llm_calls"] == full_result["llm_calls"]  # the ledger continued, not restarted
    full_report = json.loads(Path(full_result["report"]).read_text())
    resumed_report = json.loads(Path(resumed_result["report"]).read_text())
    strip = [{k: v for k, v in p.items() if k != "wall_s"} for p in full_report["curve"]]
    assert [{k: v for k, v in p.items() if k != "wall_s"} for p in resumed_report["curve"]] == strip
    for key in ("operations", "reverted_operations", "rejected_operations", "experiences"):
        assert resumed_report[key] == full_report[key], key


def test_checkpoint_state_round_trips() -> None:
    e = Experience.create(
        text="When in doubt, check the units.",
        domain="math.units",
        confidence=0.5,
        author="job:x",
        base_model=MODEL,
        created_at="2026-01-01T00:00:00Z",
    )
    state = TrainState(step=3, library=[e], validation_score=0.5, counts={e.id: [2, 1]}, curve=[{"step": 3}],
                       credit={e.id: [1.5, 3.0]}, priors={e.id: 0.25},
                       reverted=[{"op": "add", "id": e.id, "step": 2}])  # fmt: skip
    data = json.loads(json.dumps(state.to_json(MODEL)))
    back = TrainState.from_json(data)
    assert back.library == [e] and back.counts == {e.id: [2, 1]} and back.step == 3
    assert back.credit == state.credit and back.priors == state.priors and back.reverted == state.reverted
    with pytest.raises(ValueError, match="state_version"):
        TrainState.from_json({**data, "state_version": 99})


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    return AutoTokenizer.from_pretrained(prepare_bundled_chat_model(default_cache_dir()).path)


def factor_run(
    tmp_path: Path, embedder, tokenizer, policy: Callable[[Call], str], **spec: Any
) -> tuple[Run, dict[str, Any]]:
    """A lessons run with distilled factors, on a scripted model that has the real tokenizer and takes
    logits processors (the policy sees whether a call decodes with factors)."""
    backend = ScriptedBackend(policy)
    backend.tokenizer = tokenizer  # type: ignore[attr-defined]
    backend.supports_logits_processors = True  # type: ignore[misc]
    run = Run(backend)
    parsed = TfGrpoSpec.parse({"dataset": str(tasks_file(tmp_path, 4)), "epochs": 1, "batch_size": 2,
                               "group_size": 3, "distill_factors": True, "experience_kinds": "lessons",
                               "lookup_start": False, **spec})  # fmt: skip
    result = asyncio.run(run_tf_grpo(parsed, LLM(backend), embedder, None, "", author="job:f",
                                     out_dir=tmp_path / "f", emit=run.emit, save=run.save))  # fmt: skip
    return run, result


def good_lesson(call: Call) -> str:
    return ops_json({"op": "add", "text": GOOD})


def test_distilled_factors_are_tried_and_then_decode_later_rollouts(
    tmp_path: Path, embedder, tokenizer
) -> None:
    from zoo.inference.factors import tokenizer_tag
    from zoo.trainer.tfgrpo.selection import FACTOR_TRIAL_CONFIDENCE

    sampled = one_wrong_in(3)

    def correct(call: Call) -> bool:  # greedy answers are right when decoded with the factors
        return call.logits_processor is not None if call.temperature == 0 else sampled(call)

    policy = arithmetic_policy(correct=correct, compare=good_lesson)
    val = str(tasks_file(tmp_path, 2, "val.jsonl", 10))
    run, result = factor_run(tmp_path, embedder, tokenizer, policy, validation=val)
    (lesson,) = decode_library(Path(result["library"]).read_bytes()).experiences
    assert lesson.factors is not None and lesson.factors.tokenizer == tokenizer_tag(tokenizer)
    first, _ = run.steps()
    assert first["chosen"] == "lessons" and first["candidates"] == {"lessons": 1.0, "lessons-no-factors": 0.0}
    # Validation tried the factor at log-odds 1 (it earned a better score): step 2's rollouts decode with it.
    step2 = [c for c in run.backend.recorder.calls if c.stage == "rollout" and c.temperature > 0][6:]
    assert step2 and all(c.logits_processor is not None for c in step2)
    assert all(c.logits_processor.bias.abs().max() > 0 for c in step2)
    assert abs(lesson.confidence - 0.5) > 0.01 or lesson.confidence == pytest.approx(FACTOR_TRIAL_CONFIDENCE)


def test_unvalidated_factors_start_where_they_weigh_nothing(tmp_path: Path, embedder, tokenizer) -> None:
    policy = arithmetic_policy(correct=one_wrong_in(3), compare=good_lesson)
    run, result = factor_run(tmp_path, embedder, tokenizer, policy, validation_limit=0)
    (lesson,) = decode_library(Path(result["library"]).read_bytes()).experiences
    assert lesson.factors is not None and lesson.confidence == 0.5
    assert run.steps()[0]["candidates"] == {"lessons": None}, "no trial without validation"
    assert not any("-no-factors" in name for s in run.steps() for name in s["candidates"])
    rollouts = [c for c in run.backend.recorder.calls if c.stage == "rollout"]
    assert rollouts and all(c.logits_processor is None for c in rollouts), "weight 0: no processor"


def test_a_harmful_factor_set_is_reverted_and_its_lesson_kept(tmp_path: Path, embedder, tokenizer) -> None:
    """Validation decodes with the new factors (tried at weight eta): they make the model wrong, so the
    step keeps the lesson without them and records the drop."""
    sampled = arithmetic_policy(correct=one_wrong_in(3), compare=good_lesson)

    def policy(call: Call) -> str:
        if call.stage == "rollout" and call.temperature == 0 and call.logits_processor is not None:
            return boxed(-1)  # decoding with the factors derails the answer
        return sampled(call)

    spec = {"validation": str(tasks_file(tmp_path, 2, "val.jsonl", 10)), "epochs": 1}
    run, result = factor_run(tmp_path, embedder, tokenizer, policy, **spec)
    first = run.steps()[0]
    assert first["candidates"] == {"lessons": 0.0, "lessons-no-factors": 1.0}, first
    assert first["decision"] == "kept" and first["chosen"] == "lessons-no-factors"
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    assert [e.text for e in learned] == [GOOD] and learned[0].factors is None
    report = json.loads(Path(result["report"]).read_text())
    assert any(op["op"] == "drop_factors" and op["step"] == 1 for op in report["operations"])
    assert report["final_validation_score"] == 1.0


@pytest.mark.parametrize("position", ["system", "user"])
def test_context_base_experiences_are_the_starting_library(tmp_path: Path, embedder, position: str) -> None:
    e = Experience.create(
        text="When adding, line up the digits.",
        domain="math.arithmetic",
        confidence=0.5,
        author="job:x",
        base_model=MODEL,
        created_at="2026-01-01T00:00:00Z",
    )
    backend = ScriptedBackend(arithmetic_policy(correct=lambda c: True, compare=lambda c: ops_json()))
    run = Run(backend)
    spec = TfGrpoSpec.parse(
        {"dataset": str(tasks_file(tmp_path, 1)), "validation_limit": 0, "epochs": 1, "group_size": 2,
         "lesson_position": position}
    )  # fmt: skip
    ctx = Context(
        LLM(backend),
        embedder,
        Library.create(version=1, base_model=MODEL, experiences=[e]),
        "job:x",
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    state = asyncio.run(
        TfGrpoRun(
            spec,
            [Task(id="t", question="What is 1 plus 2?", answer="3")],
            [],
            ctx,
            emit=run.emit,
            checkpoint=run.save,
        ).run()
    )
    assert state.library == [e]
    # Rollouts carry the lesson where the spec (by default the node's serving config) puts it.
    rollouts = [c for c in backend.recorder.calls if c.stage == "rollout"]
    assert rollouts and all((e.text in c.system) == (position == "system") for c in rollouts)
    assert all((e.text in c.user) == (position == "user") for c in rollouts)
    assert all(c.user.endswith("What is 1 plus 2?") for c in rollouts)


def test_a_rewritten_lesson_keeps_its_record(tmp_path: Path, embedder) -> None:
    """Step 2 rewrites the starting lesson: the new id carries the old one's uses and its starting
    confidence, so its confidence is what one uninterrupted record gives (not the evidence counted twice)."""
    old = Experience.create(text="When adding, line up the digits.", domain="math.arithmetic", confidence=0.8,
                            author="job:x", base_model=MODEL, created_at="2026-01-01T00:00:00Z")  # fmt: skip
    compares = [0]
    lock = threading.Lock()

    def compare(call: Call) -> str:
        with lock:
            compares[0] += 1
            n = compares[0]
        return ops_json({"op": "modify", "id": old.id, "text": GOOD}) if n > 2 else ops_json()

    policy = arithmetic_policy(correct=one_wrong_in(3), compare=compare)
    spec = {"dataset": str(tasks_file(tmp_path, 4)), "validation_limit": 0, "epochs": 1, "batch_size": 2,
            "group_size": 3}  # fmt: skip
    run, result = run_job(tmp_path, embedder, policy, spec,
                          current=Library.create(version=1, base_model=MODEL, experiences=[old]))  # fmt: skip
    assert [s["decision"] for s in run.steps()] == ["no_change", "kept"]
    (new,) = decode_library(Path(result["library"]).read_bytes()).experiences
    assert new.text == GOOD and new.id != old.id
    # Every rollout of both steps saw the lesson (uncited): uses whose advantages cancel, from 0.8.
    uses = sum(s["rollouts"] for s in run.steps())
    assert uses == 9  # 3 training tasks (the split holds one back), G = 3
    assert new.confidence == pytest.approx(confidence_of(0.8, 0.0, uses), abs=1e-6)


def test_group_size_one_critiques_the_single_rollout(tmp_path: Path, embedder) -> None:
    policy = arithmetic_policy(
        correct=lambda c: True, compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 1,
    }
    run, result = run_job(tmp_path, embedder, policy, spec)
    (step,) = run.steps()
    assert step["groups_skipped"] == 0 and step["rollouts"] == 2
    assert run.backend.recorder.stages().count("summarise") == 2 and result["experiences"] == 1


def test_factor_distillation_without_a_local_tokenizer_is_noted_not_fatal(tmp_path: Path, embedder) -> None:
    policy = arithmetic_policy(
        correct=one_wrong_in(3), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "distill_factors": True,
    }
    _, result = run_job(tmp_path, embedder, policy, spec)
    report = json.loads(Path(result["report"]).read_text())
    assert any("no local tokenizer" in n for n in report["notes"])
    (lesson,) = decode_library(Path(result["library"]).read_bytes()).experiences
    assert lesson.factors is None


def test_a_library_larger_than_k_is_retrieved_top_k_per_task(tmp_path: Path, embedder) -> None:
    def lesson(text: str, domain: str) -> Experience:
        return Experience.create(
            text=text,
            domain=domain,
            confidence=0.5,
            author="job:x",
            base_model=MODEL,
            created_at="2026-01-01T00:00:00Z",
        )

    adding = lesson("When adding two numbers plus each other, add the ones digits first.", "math.arithmetic")
    others = [
        lesson("When converting miles to kilometres, multiply by 1.609.", "math.units"),
        lesson("When writing a Python function, handle the empty list first.", "code.python"),
    ]
    current = Library.create(version=2, base_model=MODEL, experiences=[adding, *others])
    policy = arithmetic_policy(correct=lambda c: True, compare=lambda c: ops_json())
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation_limit": 0,
        "epochs": 2,
        "batch_size": 2,
        "group_size": 2,
        "k": 1,
    }
    run, _ = run_job(tmp_path, embedder, policy, spec, current=current)
    rollouts = [c for c in run.backend.recorder.calls if c.stage == "rollout"]
    assert len(rollouts) == 8
    assert all(adding.text in c.system and not any(o.text in c.system for o in others) for c in rollouts)


def test_rollouts_ask_each_task_under_its_own_instruction(tmp_path: Path, embedder) -> None:
    own = "Reply with the label only."
    tasks = [
        Task(id="m", question="What is 2 plus 2?", answer="4", domain="math.arithmetic"),
        Task(id="l", question="Label for 'sunny'?", answer="CLEAR", domain="labels.weather"),
        Task(id="o", question="Label for 'rain'?", answer="WET", domain="labels.weather", instruction=own),
    ]
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    spec = {
        "dataset": str(tmp_path / "tasks.jsonl"),
        "validation": str(tasks_file(tmp_path, 1, "val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 3,
        "group_size": 2,
        "validate_steps": False,
    }
    run, _ = run_job(tmp_path, embedder, lambda call: "Answer: 4", spec)
    rollouts = [c for c in run.backend.recorder.calls if c.stage == "rollout"]
    by_question = {t.question: t for t in tasks}
    seen = set()
    for call in rollouts:
        task = by_question[call.user]
        seen.add(task.id)
        assert call.system.startswith(instruction_for(task)), (task.id, call.system[:120])
    assert seen == {"m", "l", "o"}
    assert all("boxed" not in c.system for c in rollouts if by_question[c.user].domain != "math.arithmetic")


# -- worked examples ----------------------------------------------------------------------------------

CODE_RE = re.compile(r"code of item (\d+)")


def code_tasks(tmp_path: Path, n: int, name: str, start: int = 0) -> Path:
    """A convention family: the code of item N is ITEM-N, which no model can guess without being shown."""
    tasks = [Task(id=f"code-{i}", question=f"What is the code of item {i}?", answer=f"ITEM-{i}",
                  domain="codes.items") for i in range(start, start + n)]  # fmt: skip
    write_jsonl(tmp_path / name, tasks)
    return tmp_path / name


def shown_the_convention(call: Call) -> bool:
    """A small model follows a worked example, or a lesson that states the convention: it writes the code
    right when one is among the turns or in the system turn."""
    shown = any(m["role"] == "assistant" and "ITEM-" in m["content"] for m in call.messages[:-1])
    return shown or "ITEM-" in call.system


def convention_policy(*, sampled_right_every: int | None, compare: str = "") -> Callable[[Call], str]:
    """Rollouts: greedy ones are right exactly when shown the convention; of sampled ones every n-th is
    right (None: none). Critic stages answer `compare` (default: no operations) and a fixed summary."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def policy(call: Call) -> str:
        if call.stage == "summarise":
            return "It gave a code; the reference shows the expected form."
        if call.stage == "compare":
            return compare or ops_json()
        n = int(m.group(1)) if (m := CODE_RE.search(call.user)) else -1
        if call.temperature == 0:
            right = shown_the_convention(call)
        else:
            with lock:
                k = seen[call.user] = seen.get(call.user, -1) + 1
            right = sampled_right_every is not None and k % sampled_right_every == 0
        return f"Answer: ITEM-{n}" if right else f"Answer: code {n}"

    return policy


def code_spec(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return {
        "dataset": str(code_tasks(tmp_path, 4, "codes.jsonl")),
        "validation": str(code_tasks(tmp_path, 2, "codes-val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "experience_kinds": "both",
        **changes,
    }


def test_a_run_starts_where_lookup_is_and_keeps_only_what_beats_it(tmp_path: Path, embedder) -> None:
    # Greedy answers are right exactly when a worked example is in the prompt; sampled ones never are.
    policy = convention_policy(sampled_right_every=None)
    run, result = run_job(tmp_path, embedder, policy, code_spec(tmp_path, lookup_start=True))
    library = decode_library(Path(result["library"]).read_bytes())
    # A training rollout sees the other tasks' worked examples, never its own (it would copy the answer).
    sampled = [c for c in run.backend.recorder.calls if c.stage == "rollout" and c.temperature > 0]
    assert sampled
    for c in sampled:
        shown = [m["content"] for m in c.messages[:-1] if m["role"] == "user"]
        assert shown and c.user not in shown, (c.user, shown)
    seeded = [e for e in library.experiences if e.provenance.author == LOOKUP_AUTHOR]
    assert result["lookup_start"] == 4
    assert sorted(e.answer for e in seeded) == [f"ITEM-{i}" for i in range(4)]
    assert all(e.kind == "example" for e in seeded)
    # It began at lookup's validation score, and nothing that did not beat it came in.
    assert result["baseline_validation_score"] == 1.0 == result["validation_score"]
    assert len(library.experiences) == 4, [e.text for e in library.experiences]
    assert "started from 4 of them as worked examples" in library.description
    # The same run from nothing starts at zero: the lookup start is what put it at 1.0.
    _, cold = run_job(tmp_path, embedder, policy, code_spec(tmp_path, lookup_start=False), out="cold")
    assert cold["lookup_start"] == 0 and cold["baseline_validation_score"] == 0.0


def test_the_lookup_start_reads_no_label_under_label_free_and_keeps_the_size_cap(
    tmp_path: Path, embedder
) -> None:
    policy = convention_policy(sampled_right_every=None)
    spec = code_spec(tmp_path, lookup_start=True, label_free=True, validate_steps=False)
    _, free = run_job(tmp_path, embedder, policy, spec, out="free")
    assert free["lookup_start"] == 0
    spec = code_spec(tmp_path, lookup_start=True, max_library_size=2)
    _, capped = run_job(tmp_path, embedder, policy, spec, out="capped")
    assert capped["lookup_start"] == 2
    assert capped["experiences"] <= 2


def test_a_clear_winner_becomes_a_worked_example_that_validation_keeps(tmp_path: Path, embedder) -> None:
    run, result = run_job(tmp_path, embedder, convention_policy(sampled_right_every=3), code_spec(tmp_path))
    steps = run.steps()
    assert steps[0]["decision"] == "kept"
    assert steps[0]["candidate_validation_score"] == 1.0 > 0.0 == json.loads(
        Path(result["report"]).read_text())["baseline_validation_score"]  # fmt: skip
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    examples = [e for e in learned if e.kind == "example"]
    assert examples and all(e.answer == "ITEM-" + e.text.split()[-1].rstrip("?") for e in examples)
    assert {e.domain for e in examples} == {"codes.items"}
    # The winner's answer as the rollout wrote it and the verifier accepted it.
    report = json.loads(Path(result["report"]).read_text())
    added = [op for op in report["operations"] if op.get("kind") == "example"]
    assert added and all(op["op"] == "add" and op["answer"].startswith("ITEM-") for op in added)


def program_tasks(tmp_path: Path, factors: Sequence[int], name: str) -> Path:
    """Verifier-only tasks: write `times_N(x)`, checked by real unit tests; no reference answer exists."""
    tasks = [
        Task(id=f"times-{n}", answer=None,
             question=f"Write a Python function `times_{n}(x)` that returns x multiplied by {n}.",
             domain="code.functions", verifier="unit_tests",
             verifier_args={"tests": f"from solution import times_{n}\n\n\ndef test_0():\n"
                                     f"    assert times_{n}(2) == {2 * n}\n"})
        for n in factors
    ]  # fmt: skip
    write_jsonl(tmp_path / name, tasks)
    return tmp_path / name


def program_policy() -> Callable[[Call], str]:
    """Greedy rollouts write working code exactly when a worked code example is among the turns; of each
    task's sampled ones every third works, the first included (so every group splits)."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def policy(call: Call) -> str:
        n = int(m.group(1)) if (m := re.search(r"times_(\d+)", call.user)) else 0
        if call.temperature == 0:
            right = any(t["role"] == "assistant" and "```python" in t["content"] for t in call.messages[:-1])
        else:
            with lock:
                k = seen[call.user] = seen.get(call.user, -1) + 1
            right = k % 3 == 0
        body = f"x * {n}" if right else f"x + {n}"
        return f"Here it is:\n```python\ndef times_{n}(x):\n    return {body}\n```"

    return policy


def test_a_passing_program_becomes_a_worked_code_example_without_any_reference(
    tmp_path: Path, embedder
) -> None:
    spec = {"dataset": str(program_tasks(tmp_path, [3, 4], "programs.jsonl")),
            "validation": str(program_tasks(tmp_path, [7], "programs-val.jsonl")), "epochs": 1,
            "batch_size": 2, "group_size": 3, "experience_kinds": "examples"}  # fmt: skip
    run, result = run_job(tmp_path, embedder, program_policy(), spec)
    assert result["baseline_validation_score"] == 0.0 and result["validation_score"] == 1.0
    (example, *_) = decode_library(Path(result["library"]).read_bytes()).experiences
    # The code block as the rollout wrote it, indentation kept, shown as the assistant's whole turn.
    assert example.kind == "example" and example.answer.startswith("```python\ndef times_")
    assert "\n    return x * " in example.answer and worked_answer(example.answer, None) == example.answer
    assert run.steps()[0]["decision"] == "kept"


def test_a_group_that_failed_wholly_learns_from_its_reference(tmp_path: Path, embedder) -> None:
    """Zero-shot the family scores 0 everywhere: the reference answer is the only teacher, and the critic
    compares the failed rollouts with it instead of skipping the group as homogeneous."""
    run, result = run_job(
        tmp_path, embedder, convention_policy(sampled_right_every=None), code_spec(tmp_path)
    )
    steps = run.steps()
    assert steps[0]["groups_skipped"] == 0
    compares = [c for c in run.backend.recorder.calls if c.stage == "compare"]
    assert compares and all("ITEM-" in c.user for c in compares), "the critic did not see the reference"
    examples = [
        e for e in decode_library(Path(result["library"]).read_bytes()).experiences if e.kind == "example"
    ]
    assert examples and {e.answer for e in examples} <= {f"ITEM-{i}" for i in range(4)}
    assert steps[0]["decision"] == "kept"


def test_label_free_runs_skip_failed_groups_and_make_no_reference_examples(tmp_path: Path, embedder) -> None:
    spec = code_spec(tmp_path, label_free=True, validate_steps=False)
    run, result = run_job(tmp_path, embedder, convention_policy(sampled_right_every=None), spec)
    assert all(s["groups_skipped"] == s["groups"] for s in run.steps())
    assert not [c for c in run.backend.recorder.calls if c.stage in ("summarise", "compare")]
    assert decode_library(Path(result["library"]).read_bytes()).experiences == ()


def test_a_harmful_example_is_reverted(tmp_path: Path, embedder) -> None:
    def contrary(call: Call) -> str:  # right zero-shot, wrong whenever shown an example
        n = int(m.group(1)) if (m := CODE_RE.search(call.user)) else -1
        if call.stage != "rollout":
            return ops_json()
        if call.temperature == 0:
            return f"Answer: code {n}" if shown_the_convention(call) else f"Answer: ITEM-{n}"
        return f"Answer: ITEM-{n}" if call.seed % 2 else f"Answer: code {n}"

    run, result = run_job(tmp_path, embedder, contrary, code_spec(tmp_path, epochs=1))
    decisions = [s["decision"] for s in run.steps()]
    assert "reverted" in decisions and "kept" not in decisions, decisions
    assert decode_library(Path(result["library"]).read_bytes()).experiences == ()


def test_a_steps_examples_are_kept_without_the_lesson_that_would_drag_them_down(
    tmp_path: Path, embedder
) -> None:
    """The step's lessons and examples are validated apart as well as together: here the critic's rule
    makes the model ignore the examples, so the examples alone win and the rule is reverted."""
    misleading = "When asked for an item's code, write the word code and then its number."
    shown = convention_policy(sampled_right_every=3)

    def policy(call: Call) -> str:
        if call.stage == "compare":
            return ops_json({"op": "add", "text": misleading})
        misled = any(misleading in m["content"] for m in call.messages if m["role"] == "system")
        if call.stage == "rollout" and call.temperature == 0 and misled:
            n = int(m.group(1)) if (m := CODE_RE.search(call.user)) else -1
            return f"Answer: code {n}"
        return shown(call)

    run, result = run_job(tmp_path, embedder, policy, code_spec(tmp_path))
    first = run.steps()[0]
    assert first["decision"] == "kept" and first["chosen"] == "examples", first
    assert first["candidates"] == {"both": 0.0, "examples": 1.0, "lessons": 0.0}
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    assert learned and {e.kind for e in learned} == {"example"}
    report = json.loads(Path(result["report"]).read_text())
    reverted = report["reverted_operations"]
    assert any(op["text"] == misleading and op["step"] == 1 for op in reverted), reverted
    assert not any(op.get("kind") == "example" for op in reverted if op["step"] == 1)


def test_an_example_shows_the_reference_and_its_working(tmp_path: Path) -> None:
    """A full-marks winner teaches the answer as it should be written (the verifier also accepted "300
    feet"), with the task's working; a part-marks winner teaches what it wrote; a label-free run never
    sees the reference or the working."""
    task = Task(
        id="len", question="A rope is 3 m long. Record?", answer="300", reasoning="3 m = 3 × 100 = 300 cm."
    )
    spec = TfGrpoSpec.parse({"dataset": str(tasks_file(tmp_path, 1))})

    def group(*graded: tuple[float, str]) -> Group:
        results = [RewardResult(score, "", {"extracted": said}) for score, said in graded]
        n = len(results)
        return Group(task, [f"Answer: {said}" for _, said in graded], results, [0.0] * n, [[]] * n, [])

    won = example_candidate(group((0.0, "3"), (1.0, "300 feet")), spec)
    assert won is not None and (won.kind, won.text, won.answer) == ("example", task.question, "300")
    assert won.reasoning == task.reasoning and won.source == "len"
    partial = example_candidate(group((0.0, "3"), (0.5, "300 m")), spec)
    assert partial is not None and (partial.answer, partial.reasoning) == ("300 m", task.reasoning)
    failed = example_candidate(group((0.0, "3"), (0.0, "30")), spec)
    assert failed is not None and (failed.answer, failed.reasoning) == ("300", task.reasoning)
    assert example_candidate(group((1.0, "300"), (1.0, "300")), spec) is None, "no winner, no failure"
    label_free = TfGrpoSpec.parse({"dataset": str(tasks_file(tmp_path, 1)), "label_free": True})
    agreed = example_candidate(group((0.0, "3"), (1.0, "300 feet")), label_free)
    assert agreed is not None and (agreed.answer, agreed.reasoning) == ("300 feet", "")
    assert example_candidate(group((0.0, "3"), (0.0, "30")), label_free) is None


def test_a_group_of_programs_proposes_its_shortest_passing_one_and_a_long_one_is_refused_on_record(
    tmp_path: Path,
) -> None:
    task = Task(id="fn", question="Write a Python function `triple(x)` that returns x times 3.",
                verifier="unit_tests", verifier_args={"tests": "from solution import triple\n"})  # fmt: skip
    spec = TfGrpoSpec.parse({"dataset": str(tasks_file(tmp_path, 1))})
    short = "def triple(x):\n    return 3 * x"
    long = "def triple(x):\n    # three times x, written out step by step\n    y = x + x\n    return y + x"
    wrong = "def triple(x):\n    return x + 3"

    def group(*graded: tuple[float, str]) -> Group:
        n = len(graded)
        return Group(task, [f"```python\n{code}\n```" for _, code in graded],
                     [RewardResult(score, "") for score, _ in graded], [0.0] * n, [[]] * n, [])  # fmt: skip

    for order in ((long, short), (short, long)):  # neither the first nor the last that passed: the shortest
        chosen = example_candidate(group((1.0, order[0]), (0.0, wrong), (1.0, order[1])), spec)
        assert chosen is not None and chosen.answer == f"```python\n{short}\n```", order
    assert example_candidate(group((1.0, short), (1.0, long)), spec) is None, "all passed: nothing to teach"
    assert example_candidate(group((0.0, wrong), (0.0, wrong)), spec) is None, "nothing passed"
    # A program too long for an example is proposed, and the library's check refuses it on the record.
    body = "\n".join(f"    v{i} = x" for i in range(40))
    huge = example_candidate(group((1.0, f"def triple(x):\n{body}\n    return 3 * x"), (0.0, wrong)), spec)
    assert huge is not None and len(huge.answer) > 300

    def make_example(p: Any) -> Experience:
        return Experience.create(text=p.text, domain="code.functions", kind="example", answer=p.answer,
                                 confidence=0.5, author="job:t", base_model=MODEL)  # fmt: skip

    outcome = add_examples(Outcome([]), [huge], make_example)
    assert outcome.experiences == [] and outcome.applied == []
    assert [r["source"] for r in outcome.rejected] == ["fn"] and "300" in outcome.rejected[0]["reason"]


def test_lessons_that_teach_nothing_are_screened_and_reported(tmp_path: Path, embedder) -> None:
    template = "When [insert the item] is asked, answer it."
    kept = "When asked for an item's code, write ITEM- and its number."
    shown = convention_policy(sampled_right_every=3)

    def policy(call: Call) -> str:
        if call.stage != "compare":
            return shown(call)
        n = int(m.group(1)) if (m := CODE_RE.search(call.user)) else -1
        restated = {"op": "add", "text": f"When the code of item {n} is asked."}  # the group's own question
        return ops_json(restated, {"op": "add", "text": template}, {"op": "add", "text": kept})

    run, result = run_job(tmp_path, embedder, policy, code_spec(tmp_path, experience_kinds="lessons"))
    report = json.loads(Path(result["report"]).read_text())
    reasons = {r["text"]: r["reason"] for r in report["rejected_operations"]}
    restatements = [t for t in reasons if t.startswith("When the code of item")]
    assert restatements and all("restates the question" in reasons[t] for t in restatements), reasons
    assert "template" in reasons[template] and kept not in reasons
    texts = {e.text for e in decode_library(Path(result["library"]).read_bytes()).experiences}
    assert kept in texts and not any(t.startswith("When the code of item") or "[" in t for t in texts)
    first = run.steps()[0]
    assert first["critic_operations"] > first["critic_operations_usable"] > 0, first


def test_ties_go_to_the_smaller_library(tmp_path: Path, embedder) -> None:
    """When the step's lessons neither help nor hurt, they do not enter: the examples alone score as well
    as both kinds together, and the smaller library wins; the lesson is reported as reverted."""
    harmless = "When asked for an item's code, answer with the code alone."
    policy = convention_policy(sampled_right_every=3, compare=ops_json({"op": "add", "text": harmless}))
    run, result = run_job(tmp_path, embedder, policy, code_spec(tmp_path))
    first = run.steps()[0]
    assert first["chosen"] == "examples" and first["candidates"]["both"] == first["candidates"]["examples"]
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    assert {e.kind for e in learned} == {"example"} and harmless not in {e.text for e in learned}
    report = json.loads(Path(result["report"]).read_text())
    assert any(op.get("text") == harmless for op in report["reverted_operations"])


@pytest.mark.parametrize("kinds", ["examples", "lessons"])
def test_kinds_pick_what_a_run_learns(tmp_path: Path, embedder, kinds: str) -> None:
    lesson = ops_json({"op": "add", "text": "When asked for an item's code, write ITEM- and its number."})
    policy = convention_policy(sampled_right_every=3, compare=lesson)
    run, result = run_job(tmp_path, embedder, policy, code_spec(tmp_path, experience_kinds=kinds))
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    critic_calls = [c for c in run.backend.recorder.calls if c.stage in ("summarise", "compare")]
    if kinds == "examples":
        assert learned and {e.kind for e in learned} == {"example"}
        assert critic_calls == [], "an examples-only run needs no critic"
    else:
        assert critic_calls and all(e.kind == "lesson" for e in learned)


def test_a_library_over_its_cap_drops_its_lowest_valued_experiences(tmp_path: Path, embedder) -> None:
    """The starting library already fills the cap; the step's new lesson stays and the least useful of the
    old ones go, each drop recorded in the step's operations."""
    old = [
        Experience.create(text=f"When adding case {x}, write the digits neatly in columns.",
                          domain="math.arithmetic", confidence=0.5, author="job:x", base_model=MODEL,
                          created_at="2026-01-01T00:00:00Z")
        for x in "abc"
    ]  # fmt: skip
    current = Library.create(version=1, base_model=MODEL, experiences=old)
    policy = arithmetic_policy(
        correct=one_wrong_in(3), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {
        "dataset": str(tasks_file(tmp_path, 2)),
        "validation": str(tasks_file(tmp_path, 1, "val.jsonl", 10)),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "max_library_size": 2,
    }
    run, result = run_job(tmp_path, embedder, policy, spec, current=current)
    [step] = run.steps()
    assert step["decision"] == "kept" and step["library_size"] == 2
    learned = decode_library(Path(result["library"]).read_bytes()).experiences
    assert GOOD in {e.text for e in learned}
    drops = [op for op in json.loads(Path(result["report"]).read_text())["operations"] if op["op"] == "drop"]
    assert len(drops) == 2 and all("over the cap of 2" in d["reason"] for d in drops), drops
    assert {d["id"] for d in drops} <= {e.id for e in old}


def test_a_critic_endpoint_writes_the_lessons_the_policy_uses(tmp_path: Path, embedder) -> None:
    """--critic-base-url/--critic-model: summaries, comparisons and merges go to the critic's endpoint (a
    real HTTP server), rollouts and validation to the policy; the run's cost counts both, and the critic's
    lesson enters because the policy does better with it."""
    from tests.trainer.scripted import ScriptedServer
    from zoo.registry.errors import ValidationError

    policy_calls = arithmetic_policy(correct=one_wrong_in(3), compare=lambda c: "the policy is no critic")
    critic_policy = arithmetic_policy(
        correct=lambda c: False, compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    spec = {"dataset": str(tasks_file(tmp_path, 2)), "epochs": 1, "batch_size": 2, "group_size": 3,
            "validation": str(tasks_file(tmp_path, 2, "val.jsonl", 10))}  # fmt: skip
    with ScriptedServer(critic_policy) as critic:
        run, result = run_job(tmp_path, embedder, policy_calls,
                              {**spec, "critic_base_url": critic.url, "critic_model": "teacher"})  # fmt: skip
    stages = {c.stage for c in critic.recorder.calls}
    assert stages == {"summarise", "compare"}, stages
    assert {c.stage for c in run.backend.recorder.calls} == {"rollout"}
    assert [e.text for e in decode_library(Path(result["library"]).read_bytes()).experiences] == [GOOD]
    report = json.loads(Path(result["report"]).read_text())
    assert report["cost"]["calls"] == len(run.backend.recorder.calls) + len(critic.recorder.calls)
    for bad, words in [
        ({"critic_model": "teacher"}, "go together"),
        ({"critic_base_url": "ftp://x", "critic_model": "m"}, "http"),
    ]:
        with pytest.raises(ValidationError, match=words):
            TfGrpoSpec.parse({**spec, **bad})


# -- the critic's context -------------------------------------------------------------------------------

LONG_SUMMARY = (
    "Step 1 read the problem and the offered experiences. "
    + "Then it worked through the addition digit by digit, carrying where needed, and wrote each partial "
    "sum down before going on. "
    * 18
    + "The final answer disagreed with the reference because the last carry was dropped."
)


def long_summaries_policy() -> Callable[[Call], str]:
    add_good = arithmetic_policy(
        correct=one_wrong_in(3), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    return lambda call: LONG_SUMMARY if call.stage == "summarise" else add_good(call)


def run_in(context: int, spec: dict[str, Any], tmp_path: Path, embedder) -> Run:
    """A TF-GRPO run of `spec` on the scripted model serving `context` tokens a request."""
    run = Run(ScriptedBackend(long_summaries_policy(), MODEL))
    run.backend.context_length = context
    job = run_tf_grpo(
        TfGrpoSpec.parse(spec),
        LLM(run.backend, 4),
        embedder,
        None,
        "",
        author="job:test",
        out_dir=tmp_path / "out",
        emit=run.emit,
        save=run.save,
    )
    asyncio.run(job)
    return run


def arithmetic_spec(tmp_path: Path, tasks: int, validation: int = 2, **extra: Any) -> dict[str, Any]:
    """One epoch over `tasks` sums in one step, groups of 5, validated on `validation` others."""
    return {
        "dataset": str(tasks_file(tmp_path, tasks)),
        "validation": str(tasks_file(tmp_path, validation, "val.jsonl", 100)),
        "epochs": 1,
        "batch_size": tasks,
        "group_size": 5,
        **extra,
    }


def compares_of(run: Run) -> list[Call]:
    return [c for c in run.backend.recorder.calls if c.stage == "compare"]


def test_a_comparison_that_outgrows_the_context_is_fitted_by_its_rule_and_the_run_completes(
    tmp_path: Path, embedder
) -> None:
    # The shape that crashed on llama.cpp's 2048-token slots: a labelled family of 59 short tasks, the lookup
    # start (all 59 as worked examples in the library the critic sees), groups of 5, long summaries.
    spec = arithmetic_spec(tmp_path, 59, validation=4)
    run = run_in(2048, spec, tmp_path, embedder)
    assert run.steps(), "the step did not complete"
    assert compares_of(run), "no group was compared"
    critic_max_tokens = TfGrpoSpec.parse(spec).critic_max_tokens
    for call in compares_of(run):
        assert run.backend.count_prompt_tokens(call.messages) + critic_max_tokens <= 2048
        # The rule: the worked examples left the listing first (no lesson was learned yet), then every
        # summary was cut to one length keeping its start and its end.
        library, attempts = call.user.split("Graded attempts:")
        assert "(the library is empty)" in library
        assert attempts.count(" […] ") == 5 and attempts.count("the last carry was dropped.") == 5
        assert attempts.count("Step 1 read the problem") == 5


def test_the_same_comparison_with_room_is_sent_whole(tmp_path: Path, embedder) -> None:
    run = run_in(32_768, arithmetic_spec(tmp_path, 6), tmp_path, embedder)
    assert compares_of(run) and all(c.user.count(LONG_SUMMARY) == 5 for c in compares_of(run))


def test_a_context_too_small_for_any_comparison_fails_the_job_naming_the_setting(
    tmp_path: Path, embedder
) -> None:
    spec = arithmetic_spec(tmp_path, 6, critic_max_tokens=400, lookup_start=False)
    # Rollouts fit in 600 tokens; a comparison of five attempts cannot, even cut to the rule's floor.
    with pytest.raises(
        ContextTooSmall, match=r"a compare call needs \d+ prompt tokens .*model\.context_length"
    ):
        run_in(600, spec, tmp_path, embedder)
