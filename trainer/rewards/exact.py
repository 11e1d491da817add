"""Rewards on the final answer: exact_match against the reference, and majority_vote without one.

- exact_match: 1 when the completion's final answer (zoo.trainer.rewards.answers: extraction order and
  how numbers and text are compared) equals the task's reference answer, else 0.
- majority_vote (label-free, HLLM paper Table 5): within a group, 1 for each completion whose exact_match
  answer equals the group's majority answer, else 0. The majority answer is the most frequent one; ties
  go to the smallest answer (numbers before text, numbers by value, text by code points), so the result
  does not depend on the order of the group. When at least two completions have answers but no two agree
  there is no majority and all score 0 (an arbitrary winner would be noise). No extractable answer: 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from zoo.trainer.rewards.answers import _key_text, answer_key, answers_match, extract_answer
from zoo.trainer.rewards.base import BaseReward, RewardResult, _require_answer, _show, register
from zoo.trainer.tasks.schema import Task

# The verifiers whose reference and extracted answers are short final answers: what a worked example shows.
SHORT_ANSWER_VERIFIERS = ("exact_match", "majority_vote")


@register("exact_match")
class ExactMatch(BaseReward):
    """1 when the completion's final answer equals the task's reference answer, else 0."""

    needs_answer = True

    def score(self, task: Task, completion: str) -> RewardResult:
        expected = _require_answer(task, self.name)
        found = extract_answer(completion)
        if found is None:
            return RewardResult(
                0.0, f"no final answer found; expected {_show(expected)}", {"extracted": None}
            )
        ok = answers_match(found.text, expected)
        verdict = "correct" if ok else "wrong"
        reason = f"{verdict}: answer {_show(found.text)} (from {found.method}), expected {_show(expected)}"
        return RewardResult(float(ok), reason, {"extracted": found.text, "method": found.method})


@register("majority_vote")
class MajorityVote(BaseReward):
    """Label-free reward: agreement with the group's majority answer (see the module docstring)."""

    @classmethod
    def check_task(cls, task: Task) -> None:
        # Any task can be scored label-free; its arguments belong to its usual verifier.
        return None

    def score(self, task: Task, completion: str) -> RewardResult:
        return self.group_scores(task, [completion])[0]

    def group_scores(self, task: Task, completions: Sequence[str]) -> list[RewardResult]:
        found = [extract_answer(c) for c in completions]
        keys = [answer_key(f.text) if f is not None else None for f in found]
        counts = Counter(k for k in keys if k is not None)
        answered = sum(counts.values())
        majority: tuple[int, Fraction | str] | None = None
        if counts:
            top = max(counts.values())
            if top >= 2 or answered == 1:
                majority = min(k for k, n in counts.items() if n == top)
        results = []
        size = len(completions)
        for f, key in zip(found, keys, strict=True):
            details = {
                "extracted": f.text if f else None,
                "majority": _key_text(majority) if majority else None,
            }
            if f is None or key is None:
                results.append(RewardResult(0.0, "no final answer found", details))
            elif majority is None:
                reason = (
                    f"answer {_show(f.text)}; no two of the {size} answers agree, so there is no majority"
                )
                results.append(RewardResult(0.0, reason, details))
            else:
                votes = f"{counts[majority]}/{size}"
                ok = key == majority
                relation = "agrees with" if ok else "differs from"
                reason = (
                    f"answer {_show(f.text)} {relation} the majority answer {_key_text(majority)!r} ({votes})"
                )
                results.append(RewardResult(float(ok), reason, details))
        return results
