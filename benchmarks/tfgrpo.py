"""Benchmark TF-GRPO with the bundled model: does a learned library help on held-out tasks, and what
does a step cost?

Three disjoint task sets from the shipped data (trainer/data/):
- train: the first --train tasks of the shipped train split (what the loop learns from);
- loop validation: the next --loop-validation tasks of the train split (what decides keep or revert);
- held-out test: the first --test tasks of the shipped validation split (never seen by the loop).

Runs, in one process with one loaded model (so ratios compare like with like):
1. zero-shot: the held-out score with an empty library;
2. TF-GRPO with G = --group-size (default 5) for --epochs (default 3), then the held-out score with the
   learned library;
3. the ablation G = 1 (no group comparison: each lone rollout is critiqued against its reference), same
   epochs, then its held-out score.
The held-out score is the mean reward of one greedy completion per task with the library in the prompt
(exactly as the loop's validation does it). Printed: scores and their ratio to zero-shot, wall time per
step, LLM calls per step, JSON retries/give-ups, lessons learned, and each run's report and curve paths.
Report honestly whatever it shows: a 135M model may not gain.

Run: ./zoo bench tfgrpo [--train 8] [--test 22] [--epochs 3] [--group-size 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.inference.models import prepare_bundled_chat_model
from zoo.inference.transformers_backend import TransformersBackend
from zoo.node.config import default_cache_dir
from zoo.registry.canonical import decode_library
from zoo.registry.experience import Library
from zoo.trainer.job import run_tf_grpo
from zoo.trainer.llm import LLM
from zoo.trainer.spec import TfGrpoSpec
from zoo.trainer.tasks import load_shipped, write_jsonl
from zoo.trainer.tfgrpo import Context, TfGrpoRun


async def held_out_score(spec: TfGrpoSpec, llm: LLM, embedder: Any, library: Library, test: list) -> float:
    ctx = Context(llm, embedder, library, "job:bench", datetime.now(UTC))

    async def nothing(*_: Any) -> None:
        return None

    run = TfGrpoRun(spec, test[:1], test, ctx, emit=nothing, checkpoint=nothing)
    score = await run.evaluate(list(library.experiences), "held-out")
    assert score is not None
    return score


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=8)
    ap.add_argument("--loop-validation", type=int, default=4)
    ap.add_argument("--test", type=int, default=22)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rollout-max-tokens", type=int, default=64)
    ap.add_argument("--critic-max-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    out = args.out or Path(tempfile.mkdtemp(prefix="zoo-bench-tfgrpo-"))
    out.mkdir(parents=True, exist_ok=True)
    shipped = load_shipped("train")
    train = shipped[: args.train]
    loop_validation = shipped[args.train : args.train + args.loop_validation]
    test = load_shipped("validation")[: args.test]
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "loop-validation.jsonl", loop_validation)

    path = prepare_bundled_chat_model(default_cache_dir()).path
    backend = TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", args.dtype)
    embedder = SentenceTransformerEmbedder()
    print(f"tasks: train {len(train)}, loop validation {len(loop_validation)}, held-out test {len(test)}")
    print(
        f"settings: epochs {args.epochs}, batch {args.batch_size}, rollout tokens {args.rollout_max_tokens}, "
        f"critic tokens {args.critic_max_tokens}, dtype {args.dtype}"
    )

    def spec_for(g: int) -> TfGrpoSpec:
        return TfGrpoSpec.parse(
            {
                "dataset": str(out / "train.jsonl"),
                "validation": str(out / "loop-validation.jsonl"),
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "group_size": g,
                "rollout_max_tokens": args.rollout_max_tokens,
                "critic_max_tokens": args.critic_max_tokens,
                "concurrency": 1,
                "seed": 0,
            }
        )

    empty = Library.create(version=1, base_model=backend.model_id)
    started = time.perf_counter()
    zero = await held_out_score(spec_for(args.group_size), LLM(backend, 1), embedder, empty, test)
    eval_s = time.perf_counter() - started
    print(f"zero-shot held-out score: {zero:.3f} ({eval_s:.0f} s for {len(test)} tasks)")

    rows = []
    for g in (args.group_size, 1):
        spec = spec_for(g)

        async def quiet(*_: Any) -> None:
            return None

        t0 = time.perf_counter()
        result = await run_tf_grpo(
            spec,
            LLM(backend, 1),
            embedder,
            None,
            "",
            author="job:bench",
            out_dir=out / f"g{g}",
            emit=quiet,
            save=quiet,
        )
        train_s = time.perf_counter() - t0
        learned = decode_library(Path(result["library"]).read_bytes())
        score = await held_out_score(spec, LLM(backend, 1), embedder, learned, test)
        report = json.loads(Path(result["report"]).read_text())
        decisions = [p["decision"] for p in report["curve"]]
        rows.append((g, score, result, report, train_s, decisions))

    print()
    print(
        f"{'run':<14}{'held-out':>9}{'vs zero-shot':>14}{'lessons':>9}{'steps':>7}{'s/step':>8}"
        f"{'LLM calls/step':>16}{'JSON retry/give-up':>20}"
    )
    print(f"{'zero-shot':<14}{zero:>9.3f}{1.0:>13.2f}x{0:>9}{'-':>7}{'-':>8}{'-':>16}{'-':>20}")
    for g, score, result, report, _train_s, _d in rows:
        ratio = f"{score / zero:.2f}x" if zero else "n/a"
        j = report["json"]
        retries = sum(v["retries"] for v in j.values())
        failures = sum(v["failures"] for v in j.values())
        print(
            f"{'TF-GRPO G=' + str(g):<14}{score:>9.3f}{ratio:>14}"
            f"{result['experiences']:>9}{result['steps']:>7}"
            f"{report['cost']['wall_s_per_step']:>8.1f}{report['cost']['llm_calls_per_step']:>16.1f}"
            f"{f'{retries}/{failures}':>20}"
        )
    print()
    for g, _score, result, report, train_s, decisions in rows:
        print(
            f"G={g}: trained in {train_s:.0f} s; step decisions {decisions}; loop validation "
            f"{report['baseline_validation_score']} -> {report['final_validation_score']}"
        )
        print(f"      report {result['report']}, curve {result['curve']}")
    print(f"held-out evaluation: {eval_s / max(len(test), 1):.1f} s per task")


if __name__ == "__main__":
    asyncio.run(main())
