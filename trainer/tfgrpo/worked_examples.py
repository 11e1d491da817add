"""Stage 4 of a TF-GRPO step, beside the critic: the worked examples its groups propose.

A short-answer group proposes its best rollout's question and final answer when it has a clear winner, the
question and its reference when it failed wholly; a group of programs (unit tests, no reference) whose
rollouts split proposes its shortest fully passing code block. No LLM call: the rewards pick the example,
and validation decides, as for every candidate, whether it stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from zoo.registry.worked_example import MAX_ANSWER_CHARS, MAX_QUESTION_CHARS, normalise_answer
from zoo.trainer.rewards import SHORT_ANSWER_VERIFIERS
from zoo.trainer.rewards.unit_tests import extract_code
from zoo.trainer.tfgrpo.operations import Proposal
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import Group, failed_with_reference

# Verifiers that check a program: a rollout that passes every test is a worked example of its code block.
CODE_VERIFIERS = ("unit_tests",)


def example_candidate(group: Group, spec: TfGrpoSpec) -> Proposal | None:
    """The worked example a group teaches (an "add" of kind "example"), or None.

    A group with a clear winner (its best reward above its worst) teaches its best rollout's answer: the
    task's reference answer when the winner scored full marks (the verifier accepted "100 feet" as 100, but
    the example must show the answer as it should be written), else the final answer the rollout wrote. A
    group that failed wholly on a task with a reference teaches the reference. The task's own reasoning,
    when it carries some, goes with the answer. Label-free runs never see a reference. Short-answer tasks
    make examples so, programs checked by unit tests through `code_example`, patches none; validation
    decides, as for every candidate, whether the example stays.
    """
    task = group.task
    verifier = "majority_vote" if spec.label_free else (spec.reward or task.verifier)
    if verifier in CODE_VERIFIERS:
        return code_example(group)
    if verifier not in SHORT_ANSWER_VERIFIERS:
        return None
    reference = None if spec.label_free else task.answer
    scores = [r.score for r in group.results]
    answer: str | None = None
    if max(scores) > min(scores):
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        extracted = group.results[best].details.get("extracted")
        if reference is not None and scores[best] >= 1.0:
            answer = reference
        elif isinstance(extracted, str):
            answer = extracted
    elif failed_with_reference(group, spec):
        answer = reference
    if answer is None:
        return None
    answer = " ".join(answer.split())
    if not 0 < len(answer) <= MAX_ANSWER_CHARS or len(task.question) > MAX_QUESTION_CHARS:
        return None
    reasoning = task.reasoning.strip() if reference is not None and task.reasoning else ""
    return Proposal("add", task.question, "", task.domain, task.id, -1, "example", answer, reasoning)


def code_example(group: Group) -> Proposal | None:
    """The worked example a group of programs teaches: the shortest code block among its rollouts that
    passed every test, when some rollout failed (a clear winner; a group that all passed teaches nothing
    new). No reference answer exists or is read: the verifier is the only teacher, as in rejection-sampling
    fine-tuning, but the solution goes into the library instead of the weights. A program too long for an
    example is still proposed, so the library's own check refuses it with its reason in the run's report
    instead of it vanishing uncounted."""
    scores = [r.score for r in group.results]
    if min(scores) >= 1.0 or max(scores) < 1.0 or len(group.task.question) > MAX_QUESTION_CHARS:
        return None
    answers = set()
    for completion, score in zip(group.completions, scores, strict=True):
        code = extract_code(completion).strip()
        if score < 1.0 or not code:
            continue
        try:
            answers.add(normalise_answer(f"```python\n{code}\n```"))
        except ValueError:  # a character an experience cannot hold
            continue
    if not answers:
        return None
    answer = min(answers, key=lambda a: (len(a), a))  # the shortest; ties by text, so runs repeat
    task = group.task
    return Proposal("add", task.question, "", task.domain, task.id, -1, "example", answer, "")


def proposed_examples(groups: Sequence[Group], spec: TfGrpoSpec) -> list[Proposal]:
    """Stage 4, beside the critic: the worked example each short-answer group proposes (unless
    `experience_kinds` is "lessons")."""
    if spec.experience_kinds == "lessons":
        return []
    out = []
    for gi, g in enumerate(groups):
        candidate = example_candidate(g, spec)
        if candidate is not None:
            out.append(replace(candidate, group=gi))
    return out
