"""The learning-curve report: a real PNG drawn from the data, report.json round trips, cost totals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zoo.trainer.report import plot_curve, summarise_cost, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def point(step: int, reward: float, validation: float | None, decision: str = "kept", **extra: Any) -> dict:
    p = {
        "epoch": 1,
        "step": step,
        "reward_mean": reward,
        "reward_std": 0.1,
        "validation_score": validation,
        "decision": decision,
        "operations_applied": 2,
        "groups_skipped": 0,
        "llm_calls": 10,
        "wall_s": 2.0,
    }
    p.update(extra)
    return p


CURVE = [
    point(1, 0.3, 0.4),
    point(2, 0.45, 0.35, "reverted"),
    point(3, 0.5, 0.55),
    point(4, 0.6, None, "no_change"),
]


def read_png(path: Path) -> Any:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    image = imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    return image


def test_write_report_writes_png_and_json_that_round_trips(tmp_path: Path) -> None:
    report = {
        "job_id": "job-1",
        "baseline_validation_score": 0.3,
        "curve": CURVE,
        "cost": summarise_cost(CURVE),
    }
    out = tmp_path / "reports" / "job-1"  # created on demand
    paths = write_report(out, report)
    assert paths == {"report": str(out / "report.json"), "curve": str(out / "curve.png")}
    assert json.loads(Path(paths["report"]).read_text()) == report
    text = Path(paths["report"]).read_text()
    assert text == json.dumps(report, indent=2, sort_keys=True) + "\n"
    image = read_png(Path(paths["curve"]))
    assert image.shape[:2] == (450, 800)
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temp files behind


def test_empty_curve_gives_an_empty_plot(tmp_path: Path) -> None:
    paths = write_report(tmp_path, {"curve": []})
    read_png(Path(paths["curve"]))
    assert json.loads(Path(paths["report"]).read_text()) == {"curve": []}


def test_validation_scores_may_all_be_missing(tmp_path: Path) -> None:
    curve = [point(1, 0.2, None), point(2, 0.3, None, "reverted"), point(3, 0.4, None)]
    paths = write_report(tmp_path, {"curve": curve, "baseline_validation_score": None})
    read_png(Path(paths["curve"]))
    # A baseline alone is drawn too.
    plot_curve(curve, 0.25, tmp_path / "with-baseline.png")
    read_png(tmp_path / "with-baseline.png")


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({}, "curve"),
        ({"curve": None}, "curve"),
        ({"curve": {"step": 1}}, "curve"),
        ({"curve": [1, 2]}, r"curve\"\]\[0\]"),
        ({"curve": [], "baseline_validation_score": "high"}, "baseline_validation_score"),
        ({"curve": [point(1, float("nan"), None)]}, "JSON"),
        ({"curve": [], "extra": object()}, "JSON"),
        ([], "mapping"),
    ],
)
def test_bad_report_raises_value_error(tmp_path: Path, report: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_report(tmp_path, report)
    assert not (tmp_path / "report.json").exists()


def test_plot_depends_on_the_data(tmp_path: Path) -> None:
    plot_curve(CURVE, 0.3, tmp_path / "a.png")
    plot_curve(CURVE, 0.3, tmp_path / "a2.png")
    changed = [dict(p) for p in CURVE]
    changed[2]["reward_mean"] = 0.9
    plot_curve(changed, 0.3, tmp_path / "b.png")
    plot_curve(CURVE, 0.8, tmp_path / "c.png")
    a, a2, b, c = (read_png(tmp_path / f"{n}.png") for n in ("a", "a2", "b", "c"))
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "a2.png").read_bytes()  # deterministic
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "b.png").read_bytes()
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "c.png").read_bytes()
    # The pixels differ, not only the encoding.
    assert (a != b).any() and (a != c).any() and (a == a2).all()


def test_reverted_steps_are_marked_in_red(tmp_path: Path) -> None:
    plot_curve(CURVE, None, tmp_path / "reverted.png")
    kept_only = [p | {"decision": "kept"} for p in CURVE]
    plot_curve(kept_only, None, tmp_path / "kept.png")
    reverted, kept = read_png(tmp_path / "reverted.png"), read_png(tmp_path / "kept.png")

    def red_pixels(image: Any) -> int:
        r, g, b = image[..., 0], image[..., 1], image[..., 2]
        return int(((r > 0.9) & (g < 0.2) & (b < 0.2)).sum())

    assert red_pixels(kept) == 0
    assert red_pixels(reverted) > 20


def test_summarise_cost() -> None:
    curve = [
        point(1, 0.1, None, llm_calls=12, wall_s=3.5),
        point(2, 0.2, None, llm_calls=8, wall_s=1.5),
        point(3, 0.3, None, llm_calls=10, wall_s=4.0),
    ]
    cost = summarise_cost(curve)
    assert cost == {
        "llm_calls": 30,
        "wall_s": pytest.approx(9.0),
        "steps": 3,
        "mean_wall_s_per_step": pytest.approx(3.0),
        "mean_llm_calls_per_step": pytest.approx(10.0),
    }
    assert summarise_cost([]) == {
        "llm_calls": 0,
        "wall_s": 0.0,
        "steps": 0,
        "mean_wall_s_per_step": 0.0,
        "mean_llm_calls_per_step": 0.0,
    }
