"""The statistics behind `zoo-node eval`: bootstrap intervals of a mean and of a paired difference."""

from __future__ import annotations

import pytest

from zoo.trainer.evaluate import TaskScore, interval, paired_difference, summary


def scores(values: list[float], domain: str = "d") -> list[TaskScore]:
    return [TaskScore(f"t{i}", domain, v, 10, 2, 0) for i, v in enumerate(values)]


def test_an_interval_holds_the_mean_and_narrows_with_more_tasks() -> None:
    few = [1.0, 0.0] * 8
    many = few * 8
    lo, hi = interval(few)
    assert lo < 0.5 < hi and hi - lo > 0.3
    lo2, hi2 = interval(many)
    assert lo2 < 0.5 < hi2 and (hi2 - lo2) < (hi - lo) / 2
    assert interval(few) == (lo, hi)  # seeded: the same report twice
    assert interval([1.0] * 5) == (1.0, 1.0) and interval([0.25]) == (0.25, 0.25)
    with pytest.raises(ValueError):
        interval([])


def test_summary_splits_by_domain() -> None:
    s = summary([*scores([1.0, 1.0, 0.0], "a"), TaskScore("x", "b", 0.0, 30, 2, 3)])
    assert s["n"] == 4 and s["score"] == pytest.approx(0.5)
    assert s["by_domain"]["a"]["score"] == pytest.approx(2 / 3) and s["by_domain"]["b"]["n"] == 1
    assert s["prompt_tokens"] == pytest.approx(15.0)


def test_a_paired_difference_sees_what_unpaired_intervals_cannot() -> None:
    """B fixes 4 of 32 tasks and breaks none: each side's own interval overlaps the other's, but the
    paired difference is clear of zero."""
    a = [1.0] * 14 + [0.0] * 18
    b = [1.0] * 18 + [0.0] * 14
    assert interval(b)[0] < interval(a)[1]  # unpaired, the two intervals overlap
    d = paired_difference(scores(a), scores(b))
    assert d["difference"] == pytest.approx(0.125) and d["better"] == 4 and d["worse"] == 0
    assert d["ci95"][0] > 0
    same = paired_difference(scores(a), scores(a))
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference(scores(a), scores(b[:-1]))
