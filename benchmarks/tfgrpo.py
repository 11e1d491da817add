"""Efficacy of TF-GRPO: does a learned library lift a frozen model on held-out tasks, by how much beyond
the seed-to-seed spread, and what does learning cost?

Per task family (the shipped convention families of trainer/tasks/families.py by default, or any JSONL a user
brings with --dataset/--validation/--test) and in one process with one loaded model:

1. zero-shot: the held-out test score with an empty library (greedy, one completion a task);
2. for each ablation and each of --seeds seeds, a TF-GRPO run on the train split (the validation split
   decides keep or revert), then the test score of the learned library, and the test score after every
   step (from the step's checkpointed library):
   - both: lessons and worked examples (the default of a job),
   - lessons: critic rules only, examples: worked examples only (no critic calls),
   - g1: both kinds with G = 1 (no group computation: each lone rollout is critiqued on its own).

Printed per family: the test score (mean and standard deviation over seeds) and its gain over zero-shot,
experiences kept / reverted / dropped by kind, the critic's JSON replies that parsed ("JSON ok") and its
usable-operations rate (operations that made a valid change: a lesson the library accepts, an existing
id), LLM calls and seconds per step. Written: curves-<family>.png (test and validation
score per step, mean over seeds, per ablation) and results.json in --out.

The held-out score is measured exactly as the loop's validation (same prompt assembly, k and budget), on
tasks the loop never sees. Report honestly whatever it shows.

Run: ./zoo bench tfgrpo [--family lengths,habitats] [--ablations both,lessons,examples,g1] [--seeds 3]
         [--epochs 1] [--group-size 5] [--backend transformers|openai --base-url URL --model NAME]
         [--dataset F --validation F --test F] [--parallel N] [--out DIR]

With --out, results.json is rewritten after every run and a later invocation with the same --out runs
only what is missing (the whole matrix takes hours on CPU). --parallel N runs N TF-GRPO runs at once on
the one model, filling its batches: more runs per hour, but each run's seconds per step then include the
others' work (marked * in the summary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.registry.canonical import decode_library
from zoo.registry.experience import Library
from zoo.trainer.tasks import families
from zoo.trainer.tasks.schema import Task, load_jsonl
from zoo.trainer.tfgrpo.job import run_tf_grpo
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.loop import Context, TfGrpoRun
from zoo.trainer.tfgrpo.spec import TfGrpoSpec

ABLATIONS = {
    "both": {"experience_kinds": "both"},
    "lessons": {"experience_kinds": "lessons"},
    "examples": {"experience_kinds": "examples"},
    "g1": {"experience_kinds": "both", "group_size": 1},
}


async def held_out_score(
    spec: TfGrpoSpec, llm: LLM, embedder: Any, library: Library, test: list[Task]
) -> float:
    """The test score of `library`, measured as the loop's validation measures it."""

    async def nothing(*_: Any) -> None:
        return None

    ctx = Context(llm, embedder, library, "job:bench", datetime.now(UTC))
    run = TfGrpoRun(spec, test[:1], test, ctx, emit=nothing, checkpoint=nothing)
    score = await run.evaluate(list(library.experiences), "held-out")
    assert score is not None
    return score


def load_backend(args: argparse.Namespace) -> Any:
    if args.backend == "openai":
        from zoo.inference.openai_backend import OpenAIBackend

        if not args.base_url or not args.model:
            raise SystemExit("--backend openai needs --base-url and --model")
        return OpenAIBackend(args.base_url, args.model, max_concurrency=args.concurrency)
    from zoo.inference.models import prepare_bundled_chat_model
    from zoo.inference.transformers_backend import TransformersBackend
    from zoo.node.config import default_cache_dir

    path = prepare_bundled_chat_model(default_cache_dir()).path
    return TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", args.dtype)


def task_sets(args: argparse.Namespace) -> dict[str, dict[str, Path]]:
    if args.dataset:
        if not (args.validation and args.test):
            raise SystemExit("--dataset needs --validation and --test (the held-out tasks) too")
        return {
            Path(args.dataset).stem: {"train": args.dataset, "validation": args.validation, "test": args.test}
        }
    return {f: {s: families.path(f, s) for s, _ in families.SPLITS} for f in args.family.split(",")}


def kinds_of(report: dict[str, Any]) -> Counter[str]:
    """Experiences kept / reverted / dropped by kind, from a run's report (its operation logs)."""
    out: Counter[str] = Counter()
    for op in report["operations"]:
        kind = op.get("kind", "lesson")
        if op["op"] == "drop":
            out[f"dropped {kind}"] += 1
        elif op["op"] in ("add", "merge"):
            out[f"kept {kind}"] += 1
    for op in report.get("reverted_operations", []):
        if op["op"] in ("add", "merge"):
            out[f"reverted {op.get('kind', 'lesson')}"] += 1
    return out


async def run_one(name: str, ablation: str, seed: int, base: dict[str, Any], args: argparse.Namespace,
                  backend: Any, embedder: Any, test: list[Task], out: Path) -> dict[str, Any]:  # fmt: skip
    """One TF-GRPO run on the train split, then its held-out score and held-out curve."""
    spec = TfGrpoSpec.parse({**base, **ABLATIONS[ablation], "seed": seed})
    llm = LLM(backend, args.concurrency)
    libraries: dict[int, Library] = {}

    async def quiet(*_: Any) -> None:
        return None

    async def save(step: int, state: dict[str, Any], event: Any) -> None:
        libraries[step] = decode_library(str(state["train"]["library"]).encode())
        kind, point = event
        if kind == "step_completed":  # hours-long runs: show that they move
            line = (
                f"  [{name}] {ablation} seed {seed}: step {step}/{point.get('steps_total', '?')} "
                f"{point.get('decision', '')}, validation {point.get('validation_score', 0):.3f}, "
                f"{point.get('library_size', 0)} experiences, {point.get('wall_s', 0):.0f} s"
            )
            print(line, flush=True)

    t0 = time.perf_counter()
    result = await run_tf_grpo(spec, llm, embedder, None, "", author="job:bench",
                               out_dir=out / name / f"{ablation}-{seed}", emit=quiet, save=save)  # fmt: skip
    train_s = time.perf_counter() - t0
    learned = decode_library(Path(result["library"]).read_bytes())
    steps = sorted(s for s in libraries if s > 0)
    curve_test = [await held_out_score(spec, llm, embedder, libraries[s], test) for s in steps]
    score = await held_out_score(spec, llm, embedder, learned, test)
    report = json.loads(Path(result["report"]).read_text())
    compare = report.get("json", {}).get("compare", {"retries": 0, "failures": 0})
    print(f"  [{name}] {ablation} seed {seed}: held-out {score:.3f}, {result['experiences']} experiences, "
          f"{train_s:.0f} s", flush=True)  # fmt: skip
    return {
        "seed": seed, "score": score, "train_s": train_s, "parallel": args.parallel,
        "experiences": result["experiences"],
        "by_kind": dict(kinds_of(report)), "curve_test": curve_test,
        "curve_validation": [p["validation_score"] for p in report["curve"]],
        "llm_calls_per_step": report["cost"]["llm_calls_per_step"],
        "s_per_step": report["cost"]["wall_s_per_step"], "json_failures": compare["failures"],
        "json_retries": compare["retries"], "report": result["report"],
        "compares": sum(p["groups"] - p["groups_skipped"] for p in report["curve"]),
        "critic_ops": sum(p.get("critic_operations", 0) for p in report["curve"]),
        "critic_ops_usable": sum(p.get("critic_operations_usable", 0) for p in report["curve"]),
    }  # fmt: skip


async def run_family(name: str, paths: dict[str, Path], args: argparse.Namespace, backend: Any,
                     embedder: Any, out: Path, results: dict[str, Any], checkpoint: Any) -> None:  # fmt: skip
    """Fill `results` (this family's entry of results.json) with the runs it lacks, saving after each.

    Runs already in `results` (same ablation and seed, from an earlier invocation with the same --out) are
    kept, not repeated, so a matrix too long for one sitting is measured across several.
    """
    test = load_jsonl(paths["test"])[: args.test_limit]
    base = {
        "dataset": str(paths["train"]),
        "validation": str(paths["validation"]),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "rollout_max_tokens": args.rollout_max_tokens,
        "critic_max_tokens": args.critic_max_tokens,
        "concurrency": args.concurrency,
        "k": args.k,
    }
    if results.get("zero_shot") is None:
        empty = Library.create(version=1, base_model=backend.model_id)
        results["zero_shot"] = await held_out_score(
            TfGrpoSpec.parse(base), LLM(backend, args.concurrency), embedder, empty, test
        )
        results["test_tasks"] = len(test)
        checkpoint()
    print(f"\n[{name}] {len(test)} held-out tasks; zero-shot score {results['zero_shot']:.3f}", flush=True)
    runs = results.setdefault("runs", {})
    todo = [
        (ablation, seed)
        for ablation in args.ablations.split(",")
        for seed in range(args.seeds)
        if seed not in {r["seed"] for r in runs.get(ablation, [])}
    ]
    if len(todo) < len(args.ablations.split(",")) * args.seeds:
        print(f"  resuming: {len(todo)} runs to go, the others are in results.json", flush=True)
    slots = asyncio.Semaphore(args.parallel)

    async def one(ablation: str, seed: int) -> None:
        async with slots:
            run = await run_one(name, ablation, seed, base, args, backend, embedder, test, out)
        runs.setdefault(ablation, []).append(run)
        runs[ablation].sort(key=lambda r: r["seed"])
        checkpoint()

    await asyncio.gather(*(one(a, s) for a, s in todo))


def summary(name: str, results: dict[str, Any]) -> None:
    zero = results["zero_shot"]
    print(f"\n{name}: held-out score (mean ± std over seeds) and gain over zero-shot {zero:.3f}")
    print(
        f"  {'run':<10}{'seeds':>6}{'score':>14}{'gain':>8}{'s/step':>8}{'calls/step':>11}{'JSON ok':>9}"
        f"{'usable ops':>11}  experiences"
    )
    for ablation, runs in results["runs"].items():
        scores = [r["score"] for r in runs]
        mean = statistics.fmean(scores)
        std = statistics.stdev(scores) if len(scores) > 1 else 0.0
        kinds: Counter[str] = Counter()
        for r in runs:
            kinds.update(r["by_kind"])
        failures = sum(r["json_failures"] for r in runs)
        calls = statistics.fmean(r["llm_calls_per_step"] for r in runs)
        compares = sum(r["compares"] for r in runs)
        parsed = f"{compares - failures}/{compares}" if compares else "-"
        proposed = sum(r.get("critic_ops", 0) for r in runs)
        usable = f"{sum(r.get('critic_ops_usable', 0) for r in runs)}/{proposed}" if proposed else "-"
        s_step = statistics.fmean(r["s_per_step"] for r in runs)
        shared = "*" if any(r.get("parallel", 1) > 1 for r in runs) else " "
        print(f"  {ablation:<10}{len(runs):>6}{mean:>8.3f} ±{std:.3f}{mean - zero:>+8.3f}"
              f"{s_step:>7.0f}{shared}{calls:>11.1f}{parsed:>9}{usable:>11}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))  # fmt: skip


def plot(name: str, results: dict[str, Any], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for ablation, runs in results["runs"].items():
        for key, style in (("curve_test", "-"), ("curve_validation", ":")):
            curves = [r[key] for r in runs if r[key]]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            mean = [statistics.fmean(c[i] for c in curves if c[i] is not None) for i in range(n)]
            ax.plot(
                range(1, n + 1),
                mean,
                style,
                marker="o",
                label=f"{ablation} ({'test' if key == 'curve_test' else 'validation'})",
            )
    ax.axhline(results["zero_shot"], color="grey", linestyle="--", label="zero-shot (test)")
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"TF-GRPO on {name}: held-out test (solid) and loop validation (dotted)")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default=",".join(families.FAMILIES))
    ap.add_argument("--dataset", help="your own train JSONL (with --validation and --test)")
    ap.add_argument("--validation")
    ap.add_argument("--test")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--ablations", default="both,lessons,examples,g1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--group-size", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--k", type=int, default=None, help="experiences per prompt (default: serving's)")
    ap.add_argument("--rollout-max-tokens", type=int, default=48)
    ap.add_argument("--critic-max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--backend", choices=("transformers", "openai"), default="transformers")
    ap.add_argument("--base-url")
    ap.add_argument("--model")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at once, sharing the model's batches (faster overall; s/step then counts the contention)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder; an existing results.json there is resumed, not repeated",
    )
    args = ap.parse_args()
    unknown = set(args.ablations.split(",")) - set(ABLATIONS)
    if unknown:
        raise SystemExit(f"unknown ablations {sorted(unknown)}; choose from {sorted(ABLATIONS)}")
    if args.parallel < 1 or args.seeds < 1:
        raise SystemExit("--parallel and --seeds must be at least 1")

    out = args.out or Path(tempfile.mkdtemp(prefix="zoo-bench-tfgrpo-"))
    out.mkdir(parents=True, exist_ok=True)
    backend = load_backend(args)
    embedder = SentenceTransformerEmbedder()
    print(f"model {backend.model_id} ({args.backend}); seeds {args.seeds}, epochs {args.epochs}, "
          f"G {args.group_size}, batch {args.batch_size}, k {args.k}; outputs in {out}")  # fmt: skip
    path = out / "results.json"
    everything: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def checkpoint() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(everything, indent=2, default=str))
        tmp.replace(path)

    for name, paths in task_sets(args).items():
        results = everything.setdefault(name, {})
        await run_family(name, paths, args, backend, embedder, out, results, checkpoint)
        plot(name, results, out / f"curves-{name}.png")
    for name, results in everything.items():
        summary(name, results)
        print(f"  curves: {out / f'curves-{name}.png'}")
    checkpoint()
    print(f"\nresults: {out / 'results.json'}")


if __name__ == "__main__":
    asyncio.run(main())
