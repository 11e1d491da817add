"""Efficacy of TF-GRPO against the simplest alternatives: does a learned library lift a frozen model on
held-out tasks, by how much beyond the seed-to-seed spread, what does learning cost, and does it beat
what a user could do instead with the same labelled tasks?

Per task family (the shipped convention families of trainer/tasks/families.py by default, or any JSONL a user
brings with --dataset/--validation/--test) and in one process with one loaded model:

1. zero-shot: the held-out test score with an empty library (greedy, one completion a task);
   lookup: every labelled training task as a worked example (trainer/baselines.py: no loop, no LLM call);
   sft (per seed): LoRA SFT on the same training tasks (trainer/sft, its defaults), scored with no
   experiences in the prompt;
2. for each ablation and each of --seeds seeds, a TF-GRPO run on the train split (the validation split
   decides keep or revert), then the test score of the learned library, and the test score after every
   step (from the step's checkpointed library):
   - both: lessons and worked examples, starting from the lookup library (the default of a job),
   - cold: the same from an empty library (`lookup_start` off: what the loop learns on its own),
   - lessons: critic rules only, examples: worked examples only (no critic calls), from an empty library,
   - g1: both kinds with G = 1 (no group computation: each lone rollout is critiqued on its own), from an
     empty library.

3. distill (per seed, with --methods distill): each "both" run's learned library (and each "cold" one's, as
   distill-cold) distilled into a LoRA adapter (`zoo-node train distill`: its worked examples and its
   successful rollouts on the training tasks no example answers), scored with no experiences in the
   prompt; gspo (per seed): a
   GSPO run on the train split, its adapter scored the same way.

Printed per family: every method's test score (mean and standard deviation over seeds), its difference
from zero-shot and from lookup, and the prompt tokens per task it needs; then the TF-GRPO detail:
experiences kept / reverted / dropped by kind, the critic's JSON replies that parsed ("JSON ok") and its
usable-operations rate (operations that made a valid change: a lesson the library accepts, an existing
id), LLM calls and seconds per step. Written: curves-<family>.png (test and validation
score per step, mean over seeds, per ablation) and results.json in --out.

Every score is measured as `zoo-node eval` measures it (trainer/evaluate.py: the node's prompt assembly,
k and budget, greedy), on tasks no method trains or validates on. Report honestly whatever it shows.

Run: ./zoo bench tfgrpo [--family lengths,habitats,functions,sums] [--ablations both,cold,lessons,examples,g1]
         [--seeds 3] [--methods lookup,sft,rft,tfgrpo,distill,gspo] [--label-free]
         [--epochs 1] [--group-size 5] [--backend transformers|openai --base-url URL --model NAME]
         [--dataset F --validation F --test F] [--parallel N] [--out DIR]

`--family functions` (verifier-only: no reference answers) has no lookup or sft; rft (rejection-sampling
fine-tuning: sample, keep what the unit tests pass, fine-tune) is its plain alternative. `--label-free`
hides the labels: TF-GRPO scores rollouts by majority vote, and lookup and sft learn the model's own
majority answers (5 samples a task), the best a user without labels could do the simple way. Its family is
`sums` (single-digit sums, families.sums): the convention families score 0 zero-shot, so the model's own
majority answers there are all wrong, while on sums they are partly right.

With --out, results.json is rewritten after every run and a later invocation with the same --out runs
only what is missing (the whole matrix takes hours on CPU). --parallel N runs N TF-GRPO runs at once on
the one model, filling its batches: more runs per hour, but each run's seconds per step then include the
others' work (marked * in the summary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from zoo.inference.adapters import AdapterDirectory
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.registry.canonical import decode_library
from zoo.registry.errors import ValidationError
from zoo.registry.library import Library
from zoo.trainer.baselines import lookup_library, majority_labelled
from zoo.trainer.evaluate import Scorer
from zoo.trainer.gspo.job import run_gspo
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.prompting import PromptPath
from zoo.trainer.rewards import get_reward
from zoo.trainer.sft.job import run_sft
from zoo.trainer.sft.spec import SftSpec
from zoo.trainer.tasks import families
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import Task, write_jsonl
from zoo.trainer.tfgrpo.job import run_tf_grpo
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.spec import TfGrpoSpec

METHODS = ("lookup", "sft", "rft", "tfgrpo", "distill", "gspo")
ABLATIONS = {
    "both": {"experience_kinds": "both"},
    "cold": {"experience_kinds": "both", "lookup_start": False},
    # What the loop learns on its own, kind by kind, from an empty library (as "cold"):
    "lessons": {"experience_kinds": "lessons", "lookup_start": False},
    "examples": {"experience_kinds": "examples", "lookup_start": False},
    "g1": {"experience_kinds": "both", "group_size": 1, "lookup_start": False},
}

# The TF-GRPO runs whose libraries --methods distill turns into adapters, and the method each is reported as.
DISTILLED = {"both": "distill", "cold": "distill-cold"}


async def held_out_score(
    spec: TfGrpoSpec, llm: LLM, embedder: Any, library: Library, test: list[Task]
) -> float:
    """The test score of `library` under `spec`'s serving settings (k, budget, lesson position)."""
    prompts = PromptPath(
        llm.backend, embedder, spec.serving(), llm.model_id, max_tokens=spec.rollout_max_tokens
    )
    scores = await Scorer(llm, prompts, max_tokens=spec.rollout_max_tokens).score_tasks(
        test, library.experiences
    )
    return statistics.fmean(s.score for s in scores)


class Measure:
    """Held-out scores as `zoo-node eval` measures them, on one family's test tasks."""

    def __init__(self, backend: Any, embedder: Any, args: argparse.Namespace, test: list[Task]) -> None:
        serving = TfGrpoSpec.parse({"k": args.k} if args.k is not None else {}).serving()
        prompts = PromptPath(backend, embedder, serving, backend.model_id, max_tokens=args.rollout_max_tokens)
        self.scorer = Scorer(LLM(backend, args.concurrency), prompts, max_tokens=args.rollout_max_tokens)
        self.test = test

    async def score(self, library: Library | None = None, adapter: Any = None) -> dict[str, float]:
        """{"score", "prompt_tokens"} of `library` (None: empty) and `adapter` (None: the base model)."""
        experiences = list(library.experiences) if library is not None else []
        scores = await self.scorer.score_tasks(self.test, experiences, adapter=adapter)
        return {
            "score": statistics.fmean(s.score for s in scores),
            "prompt_tokens": statistics.fmean(s.prompt_tokens for s in scores),
        }


def load_backend(args: argparse.Namespace) -> Any:
    if args.backend == "openai":
        from zoo.inference.openai_backend import OpenAIBackend

        if not args.base_url or not args.model:
            raise SystemExit("--backend openai needs --base-url and --model")
        return OpenAIBackend(args.base_url, args.model, max_concurrency=args.concurrency)
    if args.backend == "llamacpp":
        from zoo.inference.bundled_models import bundled_gguf
        from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend.load(bundled_gguf(), "HuggingFaceTB/SmolLM2-135M-Instruct", threads=2)
    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.inference.transformers_backend import TransformersBackend
    from zoo.node.config import default_cache_dir

    path = prepare_bundled_chat_model(default_cache_dir()).path
    return TransformersBackend.load(path, "HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", args.dtype)


def task_sets(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Path]]:
    """Each family's split files: the shipped families', sums written into `out`, or the user's own."""
    if args.dataset:
        if not (args.validation and args.test):
            raise SystemExit("--dataset needs --validation and --test (the held-out tasks) too")
        return {
            Path(args.dataset).stem: {"train": args.dataset, "validation": args.validation, "test": args.test}
        }
    names = args.family.split(",")
    known = [*families.FAMILIES, *families.VERIFIER_ONLY, "sums"]
    if unknown := sorted(set(names) - set(known)):
        raise SystemExit(f"unknown families {unknown}: choose from {', '.join(known)}")
    shipped = {f: {s: families.path(f, s) for s, _ in families.SPLITS} for f in names if f != "sums"}
    return {f: families.write_sums(out) if f == "sums" else shipped[f] for f in names}


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
                  backend: Any, embedder: Any, measure: Measure, out: Path) -> dict[str, Any]:  # fmt: skip
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
    curve_test = [(await measure.score(libraries[s]))["score"] for s in steps]
    held_out = await measure.score(learned)
    score = held_out["score"]
    report = json.loads(Path(result["report"]).read_text())
    compare = report.get("json", {}).get("compare", {"retries": 0, "failures": 0})
    print(f"  [{name}] {ablation} seed {seed}: held-out {score:.3f}, {result['experiences']} experiences, "
          f"{train_s:.0f} s", flush=True)  # fmt: skip
    return {
        "seed": seed, "score": score, "train_s": train_s, "parallel": args.parallel,
        "prompt_tokens": held_out["prompt_tokens"], "library": result["library"],
        "experiences": result["experiences"],
        "by_kind": dict(kinds_of(report)), "curve_test": curve_test,
        "curve_validation": [p["validation_score"] for p in report["curve"]],
        "llm_calls_per_step": report["cost"]["llm_calls_per_step"],
        "s_per_step": report["cost"]["wall_s_per_step"], "json_failures": compare["failures"],
        "json_retries": compare["retries"], "json_cut": compare.get("cut", 0), "report": result["report"],
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
    measure = Measure(backend, embedder, args, test)
    methods = set(args.methods.split(","))
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
        "label_free": args.label_free,
    }
    if results.get("zero_shot") is None:
        zero = await measure.score()
        results["zero_shot"], results["zero_shot_prompt_tokens"] = zero["score"], zero["prompt_tokens"]
        results["test_tasks"] = len(test)
        checkpoint()
    print(f"\n[{name}] {len(test)} held-out tasks; zero-shot score {results['zero_shot']:.3f}", flush=True)
    labelled = await baseline_tasks(name, paths, args, backend, out, results, checkpoint)
    if {"lookup", "sft"} & methods and labelled is None:
        print(f"  [{name}] no reference answers: lookup and sft have nothing to learn from", flush=True)
    if "lookup" in methods and labelled is not None and results.get("lookup") is None:
        library = lookup_library(load_jsonl(labelled), backend.model_id)
        results["lookup"] = {**await measure.score(library), "experiences": len(library.experiences)}
        checkpoint()
        print(f"  [{name}] lookup ({len(library.experiences)} worked examples): "
              f"{results['lookup']['score']:.3f}", flush=True)  # fmt: skip
    adapters = Adapters(out / "adapters", backend.model_id)
    lora_base = {"dataset": str(paths["train"]), "validation": str(paths["validation"])}
    if "sft" in methods and labelled is not None:
        for seed in range(args.seeds):
            train = adapters.supervised(SftSpec.parse({**lora_base, "dataset": str(labelled), "seed": seed}))
            await lora_run(results, "sft", seed, name, out, measure, adapters, checkpoint, train)
    if "rft" in methods:
        for seed in range(args.seeds):
            tokens = args.rollout_max_tokens
            spec = SftSpec.parse({**lora_base, "kind": "rft", "seed": seed, "max_new_tokens": tokens,
                                  "validation_max_tokens": tokens})  # fmt: skip
            await lora_run(results, "rft", seed, name, out, measure, adapters, checkpoint,
                           adapters.supervised(spec))  # fmt: skip
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
            run = await run_one(name, ablation, seed, base, args, backend, embedder, measure, out)
        runs.setdefault(ablation, []).append(run)
        runs[ablation].sort(key=lambda r: r["seed"])
        checkpoint()

    if "tfgrpo" in methods:
        await asyncio.gather(*(one(a, s) for a, s in todo))
    if "distill" in methods:
        for ablation, method in DISTILLED.items():
            for run in runs.get(ablation, []):
                spec = SftSpec.parse({**lora_base, "kind": "distill", "experiences": run["library"],
                                      "seed": run["seed"], "k": args.k})  # fmt: skip
                train = adapters.supervised(spec, embedder)
                await lora_run(results, method, run["seed"], name, out, measure, adapters, checkpoint, train)
    if "gspo" in methods:
        for seed in range(args.seeds):
            spec = GspoSpec.parse({**lora_base, "seed": seed, "learning_rate": args.gspo_lr,
                                   "max_new_tokens": args.rollout_max_tokens,
                                   "checkpoint_every": 1000})  # fmt: skip
            await lora_run(results, "gspo", seed, name, out, measure, adapters, checkpoint,
                           lambda d, spec=spec: run_gspo(spec, adapters.model, d))  # fmt: skip


async def baseline_tasks(name: str, paths: dict[str, Path], args: argparse.Namespace, backend: Any, out: Path,
                         results: dict[str, Any], checkpoint: Any) -> Path | None:  # fmt: skip
    """The labelled training tasks lookup and sft learn from: the train split; with --label-free, the same
    tasks labelled with the model's own majority answers (what a label-free user has); None without labels."""
    train = load_jsonl(paths["train"])
    if not args.label_free:
        return paths["train"] if any(t.answer is not None for t in train) else None
    path = out / name / "majority-train.jsonl"
    if not path.exists():
        voted = await majority_labelled(LLM(backend, args.concurrency), train, samples=args.group_size,
                                        max_tokens=args.rollout_max_tokens)  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, voted)
        truth = {t.id: t for t in train}
        exact = get_reward("exact_match")
        right = sum(exact.score(truth[t.id], f"Answer: {t.answer}").score == 1.0 for t in voted
                    if truth[t.id].answer is not None)  # fmt: skip
        results["majority_labels"] = {"tasks": len(train), "labelled": len(voted), "right": right}
        checkpoint()
    m = results.get("majority_labels", {})
    print(f"  [{name}] label-free: {m.get('labelled')} of {m.get('tasks')} training tasks have a majority "
          f"answer, {m.get('right')} of them right (lookup and sft learn those)", flush=True)  # fmt: skip
    return path if load_jsonl(path) else None


class Adapters:
    """Trained adapters installed under unique names, so the one loaded model serves them side by side."""

    def __init__(self, root: Path, model_id: str) -> None:
        from zoo.inference.bundled_models import prepare_bundled_chat_model
        from zoo.node.config import default_cache_dir

        self.directory = AdapterDirectory(root)
        self.model = prepare_bundled_chat_model(default_cache_dir()).path
        self.model_id = model_id

    def supervised(self, spec: SftSpec, embedder: Any = None) -> Any:
        """A function training `spec` into a directory (trainer/sft/job.py)."""

        def train(run_dir: Path) -> dict[str, Any]:
            return run_sft(spec, self.model, run_dir, model_id=self.model_id, embedder=embedder)

        return train

    def install(self, name: str, source: Path) -> Any:
        self.directory.install(name, source)
        return self.directory.resolve(name)


async def lora_run(results: dict[str, Any], method: str, seed: int, family: str, out: Path, measure: Measure,
                   adapters: Adapters, checkpoint: Any, train: Any) -> None:  # fmt: skip
    """One LoRA-trained method's run (unless results.json has it): train, install, score with no library."""
    done = results.setdefault(method, [])
    if any(r["seed"] == seed for r in done):
        return
    run_dir = out / family / f"{method}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        result = await asyncio.to_thread(train, run_dir)
    except ValidationError as e:
        if "nothing to train on" not in str(e):
            raise
        # No pair at all (rft: no sample passed its verifier): there is nothing to fine-tune, so what a
        # user gets is the base model, which scores zero-shot.
        base = {"score": results["zero_shot"], "prompt_tokens": results.get("zero_shot_prompt_tokens")}
        done.append({"seed": seed, **base, "train_s": time.perf_counter() - started, "steps": 0, "pairs": 0})
        checkpoint()
        print(f"  [{family}] {method} seed {seed}: nothing to train on ({e}); the base model", flush=True)
        return
    train_s = time.perf_counter() - started
    ref = adapters.install(f"{family}-{method}-{seed}", Path(result["adapter"]))
    held_out = await measure.score(adapter=ref)
    done.append({"seed": seed, **held_out, "train_s": train_s, "steps": result["steps"],
                 "pairs": result.get("pairs"), "report": result["report"]})  # fmt: skip
    done.sort(key=lambda r: r["seed"])
    checkpoint()
    print(f"  [{family}] {method} seed {seed}: held-out {held_out['score']:.3f} "
          f"({result['steps']} steps, {train_s:.0f} s)", flush=True)  # fmt: skip


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def method_rows(results: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(method, runs) of every method measured, in the order a reader compares them."""
    rows = [
        (
            "zero-shot",
            [{"score": results["zero_shot"], "prompt_tokens": results.get("zero_shot_prompt_tokens")}],
        )
    ]
    if results.get("lookup"):
        rows.append(("lookup", [results["lookup"]]))
    rows += [(m, results[m]) for m in ("sft", "rft") if results.get(m)]
    rows += [(f"tf-grpo {a}", runs) for a, runs in results.get("runs", {}).items()]
    rows += [(m, results[m]) for m in (*DISTILLED.values(), "gspo") if results.get(m)]
    return rows


def summary(name: str, results: dict[str, Any]) -> None:
    zero = results["zero_shot"]
    lookup = results.get("lookup", {}).get("score")
    print(f"\n{name}: held-out score of each method (mean ± std over seeds), beside zero-shot and lookup")
    print(f"  {'method':<18}{'seeds':>6}{'score':>15}{'vs zero':>9}{'vs lookup':>10}{'prompt tok':>11}"
          f"{'train s':>9}")  # fmt: skip
    for method, runs in method_rows(results):
        mean, std = mean_std([r["score"] for r in runs])
        versus = f"{mean - lookup:>+10.3f}" if lookup is not None else f"{'-':>10}"
        tokens = [r["prompt_tokens"] for r in runs if r.get("prompt_tokens") is not None]
        train = [r["train_s"] for r in runs if r.get("train_s") is not None]
        print(f"  {method:<18}{len(runs):>6}{mean:>9.3f} ±{std:.3f}{mean - zero:>+9.3f}{versus}"
              f"{statistics.fmean(tokens) if tokens else 0:>11.0f}"
              f"{statistics.fmean(train) if train else 0:>9.0f}")  # fmt: skip
    if not results.get("runs"):
        return
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
    ap.add_argument("--methods", default="lookup,sft,tfgrpo,distill",
                    help="what to measure beside zero-shot: lookup, sft, tfgrpo (the ablations), distill "
                    "(each 'both' run's library into an adapter), gspo")  # fmt: skip
    ap.add_argument("--gspo-lr", type=float, default=1e-4, help="gspo: learning rate")
    ap.add_argument("--label-free", action="store_true",
                    help="labels hidden: TF-GRPO scores by majority vote, lookup and sft learn the model's "
                    "own majority answers")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--group-size", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--k", type=int, default=None, help="experiences per prompt (default: serving's)")
    ap.add_argument("--rollout-max-tokens", type=int, default=48)
    ap.add_argument("--critic-max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--backend", choices=("transformers", "llamacpp", "openai"), default="transformers")
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
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
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

    for name, paths in task_sets(args, out).items():
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
