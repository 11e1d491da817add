"""The state of a TF-GRPO run between its steps, and what the run reports from it.

`TrainState` is everything a run needs to continue after its last completed step: the library, the
validation scores, each experience's credit and record, the learning curve, the operations applied, rejected
and reverted, the critic's JSON statistics and the cost ledger. Its JSON is the checkpoint a resumed run
starts from. Each completed step adds its `curve_point` to the learning curve; `report` turns the state into
the job report.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.trainer.tfgrpo import critic
from zoo.trainer.tfgrpo.llm import Ledger
from zoo.trainer.tfgrpo.spec import TfGrpoSpec
from zoo.trainer.tfgrpo.step_work import StepWork

STATE_VERSION = 2  # 2: confidence moves from a recorded prior by mean advantage (not by counts)


@dataclass
class TrainState:
    """Everything a run needs to continue after its last completed step (JSON in the checkpoint)."""

    step: int = 0
    library: list[Experience] = field(default_factory=list)
    validation_score: float | None = None
    baseline_validation_score: float | None = None
    counts: dict[str, list[int]] = field(default_factory=dict)  # id -> [helpful, harmful]
    credit: dict[str, list[float]] = field(default_factory=dict)  # id -> [sum of advantages, uses]
    priors: dict[str, float] = field(default_factory=dict)  # id -> confidence when the run first saw it
    curve: list[dict[str, Any]] = field(default_factory=list)
    operations: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    reverted: list[dict[str, Any]] = field(default_factory=list)  # operations of candidates not kept
    json_stats: dict[str, critic.JsonStats] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self, base_model: str) -> dict[str, Any]:
        lib = Library.create(version=1, base_model=base_model, experiences=self.library)
        return {
            "state_version": STATE_VERSION,
            "step": self.step,
            "library": encode_library(lib).decode(),
            "validation_score": self.validation_score,
            "baseline_validation_score": self.baseline_validation_score,
            "counts": self.counts,
            "credit": self.credit,
            "priors": self.priors,
            "curve": self.curve,
            "operations": self.operations,
            "rejected": self.rejected,
            "reverted": self.reverted,
            "json": {k: v.to_json() for k, v in sorted(self.json_stats.items())},
            "ledger": self.ledger.to_json(),
            "wall_s": self.wall_s,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainState:
        if data.get("state_version") != STATE_VERSION:
            raise ValueError(
                f"checkpoint state_version {data.get('state_version')} is not {STATE_VERSION}: it was "
                "written by another zoo-node version; start the run again (a new --out or job)"
            )
        lib = decode_library(str(data["library"]).encode())
        return cls(
            step=int(data["step"]),
            library=list(lib.experiences),
            validation_score=data.get("validation_score"),
            baseline_validation_score=data.get("baseline_validation_score"),
            counts={k: [int(v[0]), int(v[1])] for k, v in (data.get("counts") or {}).items()},
            credit={k: [float(v[0]), float(v[1])] for k, v in (data.get("credit") or {}).items()},
            priors={k: float(v) for k, v in (data.get("priors") or {}).items()},
            curve=list(data.get("curve") or []),
            operations=list(data.get("operations") or []),
            rejected=list(data.get("rejected") or []),
            reverted=list(data.get("reverted") or []),
            json_stats={
                k: critic.JsonStats(int(v["retries"]), int(v["failures"]), int(v.get("cut", 0)))
                for k, v in (data.get("json") or {}).items()
            },
            ledger=Ledger.from_json(data.get("ledger")),
            wall_s=float(data.get("wall_s") or 0.0),
            notes=list(data.get("notes") or []),
        )


def json_totals(state: TrainState) -> tuple[int, int]:
    """The critic's JSON retries and failures so far, its compare and consolidate calls together."""
    compare_stats = state.json_stats.setdefault("compare", critic.JsonStats())
    merge_stats = state.json_stats.setdefault("consolidate", critic.JsonStats())
    return compare_stats.retries + merge_stats.retries, compare_stats.failures + merge_stats.failures


def curve_point(
    s: StepWork, state: TrainState, *, steps_total: int, llm_calls: int, wall: float
) -> dict[str, Any]:
    """The learning-curve point of a completed step (`llm_calls` it made, `wall` seconds it took), from
    what it accumulated and the state it leaves."""
    scores = [r.score for g in s.groups for r in g.results]
    json_retries, json_failures = json_totals(state)
    lesson_ops = s.lesson_ops
    return {
        "epoch": s.epoch + 1,
        "step": s.number,
        "steps_total": steps_total,
        "rollouts": len(scores),
        "reward_mean": statistics.fmean(scores) if scores else 0.0,
        "reward_std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        "groups": len(s.groups),
        "groups_skipped": s.skipped,
        "operations_proposed": len(s.proposed),
        "operations_applied": len(s.candidates[s.chosen].applied) if s.decision == "kept" else 0,
        "operations_rejected": len(s.rejected),
        # What the critic proposed (examples are not its), and what made a valid change.
        "critic_operations": len(lesson_ops) + len(s.screened),
        "critic_operations_usable": len(lesson_ops) - len(s.lessons.rejected),
        "validation_score": state.validation_score,
        "candidate_validation_score": max((v for v in s.scores_of.values() if v is not None), default=None),
        "candidates": s.scores_of,
        "decision": s.decision,
        "chosen": s.chosen,
        "library_size": len(state.library),
        "json_retries": json_retries - s.json_before[0],
        "json_failures": json_failures - s.json_before[1],
        "llm_calls": llm_calls,
        "wall_s": round(wall, 3),
    }


def report(spec: TfGrpoSpec, state: TrainState, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job report: learning curve, operations, lesson statistics and cost."""
    return {
        "kind": "tf-grpo",
        "spec": spec.to_json(),
        "steps": state.step,
        "baseline_validation_score": state.baseline_validation_score,
        "final_validation_score": state.validation_score,
        "curve": state.curve,
        "operations": state.operations,
        "rejected_operations": state.rejected,
        "reverted_operations": state.reverted,
        "experiences": [
            {
                "id": e.id,
                "text": e.text,
                "confidence": e.confidence,
                "helpful": state.counts.get(e.id, [0, 0])[0],
                "harmful": state.counts.get(e.id, [0, 0])[1],
                "factors": e.factors is not None,
            }
            for e in state.library
        ],
        "json": {k: v.to_json() for k, v in sorted(state.json_stats.items())},
        "cost": {
            **state.ledger.to_json(),
            "wall_s": round(state.wall_s, 3),
            "llm_calls_per_step": round(state.ledger.calls / state.step, 2) if state.step else 0.0,
            "wall_s_per_step": round(state.wall_s / state.step, 3) if state.step else 0.0,
        },
        "notes": state.notes,
        **(extra or {}),
    }
