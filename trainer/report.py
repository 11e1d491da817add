"""A training job's learning-curve report: report.json, a curve.png plot and cost totals.

A curve is a list of per-step points (plain JSON-serialisable dicts), in the order the steps ran:

    {"epoch": 1, "step": 3, "reward_mean": 0.4, "reward_std": 0.2, "validation_score": 0.5 or None,
     "decision": "kept" | "reverted" | "no_change", "operations_applied": 2, "groups_skipped": 1,
     "candidates": {"both": 0.5, "examples": 0.58}, "chosen": "examples" or None, "llm_calls": 12,
     "wall_s": 3.2}

plus, in the report, an optional "baseline_validation_score" (the library's score before step 1).
The plot uses matplotlib's Agg canvas directly (no pyplot, no global backend state); matplotlib is
imported only when a plot is drawn, so importing this module stays cheap. Files are written atomically.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zoo.registry.fsutil import write_atomic

REPORT_FILE = "report.json"
CURVE_FILE = "curve.png"
FIGURE_SIZE_IN = (8.0, 4.5)
FIGURE_DPI = 100  # 800 x 450 pixels


def _number(value: Any) -> float:
    """A point's numeric field as a float; None, a missing value or a non-number becomes NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def plot_curve(
    points: Sequence[Mapping[str, Any]],
    baseline: float | None,
    path: Path,
    title: str = "TF-GRPO learning curve",
) -> None:
    """Draw the learning curve as a PNG at `path` (written atomically).

    x is the step; the train reward mean is a line with markers inside a shaded ±std band (clipped to
    [0, 1]); the validation score is a line with markers through the steps that have one, starting at
    step 0 with `baseline` when given; reverted steps get a red x at their validation score (at their
    reward mean when they have none). y spans [0, 1]. No points gives an empty plot saying so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = [_number(p.get("step")) for p in points]
    means = [_number(p.get("reward_mean")) for p in points]
    stds = [_number(p.get("reward_std")) for p in points]

    if points:
        lower = [
            min(1.0, max(0.0, m - (0.0 if math.isnan(s) else s))) for m, s in zip(means, stds, strict=True)
        ]
        upper = [
            min(1.0, max(0.0, m + (0.0 if math.isnan(s) else s))) for m, s in zip(means, stds, strict=True)
        ]
        ax.fill_between(
            steps, lower, upper, color="tab:blue", alpha=0.2, linewidth=0, label="train reward ± std"
        )
        ax.plot(steps, means, marker="o", color="tab:blue", label="train reward mean")

    val_x: list[float] = []
    val_y: list[float] = []
    if baseline is not None and math.isfinite(baseline):
        val_x.append(0.0)
        val_y.append(float(baseline))
    for x, p in zip(steps, points, strict=True):
        v = _number(p.get("validation_score"))
        if not math.isnan(v):
            val_x.append(x)
            val_y.append(v)
    if val_x:
        ax.plot(val_x, val_y, marker="s", color="tab:orange", label="validation score")

    rev_x: list[float] = []
    rev_y: list[float] = []
    for x, m, p in zip(steps, means, points, strict=True):
        if p.get("decision") == "reverted":
            v = _number(p.get("validation_score"))
            y = m if math.isnan(v) else v
            if not math.isnan(y):
                rev_x.append(x)
                rev_y.append(y)
    if rev_x:
        ax.scatter(rev_x, rev_y, marker="x", s=80, color="red", zorder=5, label="reverted step")

    if not points:
        ax.text(
            0.5, 0.5, "no completed steps", transform=ax.transAxes, ha="center", va="center", color="gray"
        )
        ax.set_xlim(0, 1)
    ax.set_ylim(0.0, 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()

    buffer = io.BytesIO()
    # No "Software" metadata: the bytes then depend on the data drawn, not on the matplotlib build.
    fig.savefig(buffer, format="png", metadata={"Software": None})
    write_atomic(path, buffer.getvalue())


def write_report(
    out_dir: Path, report: Mapping[str, Any], title: str = "TF-GRPO learning curve"
) -> dict[str, str]:
    """Write `out_dir`/report.json (indent 2, sorted keys, strict JSON) and `out_dir`/curve.png.

    `report` needs a list "curve" of point mappings; "baseline_validation_score" (number or None) is
    optional. Returns {"report": <json path>, "curve": <png path>}. Raises ValueError on a bad report,
    including one holding values JSON cannot represent (NaN, infinities, non-JSON types).
    """
    if not isinstance(report, Mapping):
        raise ValueError(f"report must be a mapping, not {type(report).__name__}")
    curve = report.get("curve")
    if not isinstance(curve, list):
        got = "nothing" if curve is None else type(curve).__name__
        raise ValueError(f'report["curve"] must be a list of per-step points (got {got})')
    for i, point in enumerate(curve):
        if not isinstance(point, Mapping):
            raise ValueError(f'report["curve"][{i}] must be a mapping, not {type(point).__name__}')
    baseline = report.get("baseline_validation_score")
    if baseline is not None and (isinstance(baseline, bool) or not isinstance(baseline, int | float)):
        raise ValueError(f'report["baseline_validation_score"] must be a number or None (got {baseline!r})')
    try:
        text = json.dumps(report, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"report is not JSON-serialisable: {err}") from err

    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / REPORT_FILE
    png_path = out_dir / CURVE_FILE
    write_atomic(report_path, (text + "\n").encode("utf-8"))
    plot_curve(curve, None if baseline is None else float(baseline), png_path, title)
    return {"report": str(report_path), "curve": str(png_path)}


def summarise_cost(points: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """Totals over a curve: llm_calls, wall_s, steps, and the per-step means (0 when there are no steps).

    A missing or non-numeric llm_calls / wall_s counts as 0.
    """
    steps = len(points)
    llm_calls = 0
    wall_s = 0.0
    for p in points:
        calls = p.get("llm_calls")
        if isinstance(calls, int) and not isinstance(calls, bool):
            llm_calls += calls
        seconds = _number(p.get("wall_s"))
        if math.isfinite(seconds):
            wall_s += seconds
    return {
        "llm_calls": llm_calls,
        "wall_s": wall_s,
        "steps": steps,
        "mean_wall_s_per_step": wall_s / steps if steps else 0.0,
        "mean_llm_calls_per_step": llm_calls / steps if steps else 0.0,
    }
