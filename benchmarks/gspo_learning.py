"""Does GSPO learn? Held-out reward of the bundled SmolLM2-135M before and after N GSPO steps, over several
seeds, on a verifiable task family (issue 13, figure 2).

Two families (--family):
- `sums` (the default): "What is 7 + 5?" under the instruction "Reply with the number only.", scored by
  exact_match; every single-digit pair once, shuffled with a fixed seed, 24 for training and 16 held out.
  What is left to learn is mostly the format: sampled at temperature 1 the model answers with the bare
  number about one time in seven (otherwise it starts to explain and runs out of tokens), so a group of
  G = 4 holds a reward signal about half the time.
- `habitats`, the shipped convention family (trainer/tasks/data/families/): "Under which label is the otter
  filed?", answer WET or DRY, under an instruction that states the convention. Sampled at temperature 1
  the bundled model practically never replies with a bare label (0 of 192 samples in a run of this
  benchmark), so every group's rewards are equal and GSPO has nothing to learn from: it shows what a
  verifier without partial credit does to GSPO on a small model.

Beside GSPO, in the same run and on the same held-out tasks, the two things a user with these labelled
tasks could do instead (issue 37):
- lookup: every training task as a worked example in the prompt (trainer/baselines.py), scored through the
  node's prompt path (retrieval, relevance gate, the same instruction), greedy; no training at all;
- sft: per seed, LoRA SFT on the same training tasks (`zoo-node train sft`, its defaults), scored by the
  very greedy validation GSPO uses (trainer/lora/rollouts.py: same prompt, same verifier), before and after.
--no-baselines leaves them out.

Per seed, one `run_gspo` (what `zoo-node train gspo` runs) on the train tasks for --epochs epochs,
validating (greedy, one completion a task) on the held-out tasks before the first step, every
--validate-every steps and after the last: GSPO never selects anything on that score, so it is a held-out
measurement. The seed changes the LoRA initialisation, the batch order and the sampling. Printed: per seed
the held-out score before and after and the reward per step; over seeds the mean gain and its standard
deviation, and the spread of the before and after scores. Written to --out: results.json and
curve-seed<N>.png per seed (the run's own curve).

Run: ./zoo bench gspo_learning [--family sums|habitats] [--seeds 3] [--epochs 2] [--lr 1e-4]
         [--group-size 4] [--batch-size 4] [--max-new-tokens 8] [--lora-rank 8] [--validate-every 3]
         [--threads 2] [--no-baselines] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTRUCTIONS = {
    "habitats": "Animals are filed under one of two labels: WET (lives in or by water) or DRY (does not). "
    "Reply with the label only.",
    "sums": "Reply with the number only.",
}


def lookup_score(
    model: Path, train_file: Path, test_file: Path, args: argparse.Namespace
) -> dict[str, float]:
    """The held-out score with every training task as a worked example, through the node's prompt path, and
    zero-shot through the same path (greedy, the family's instruction)."""
    import asyncio

    from zoo.inference.defaults import ServingDefaults
    from zoo.inference.embedder import SentenceTransformerEmbedder
    from zoo.inference.transformers_backend import TransformersBackend
    from zoo.trainer.baselines import lookup_experiences
    from zoo.trainer.evaluate import Scorer, TaskScore
    from zoo.trainer.prompting import PromptPath
    from zoo.trainer.tasks.loading import load_jsonl
    from zoo.trainer.tfgrpo.llm import LLM

    backend = TransformersBackend.load(model, MODEL_ID, "cpu", "float32")
    prompts = PromptPath(backend, SentenceTransformerEmbedder(), ServingDefaults(), MODEL_ID,
                         max_tokens=args.max_new_tokens, instruction=INSTRUCTIONS[args.family])  # fmt: skip
    scorer = Scorer(LLM(backend), prompts, max_tokens=args.max_new_tokens)
    examples = lookup_experiences(load_jsonl(train_file), MODEL_ID)
    test = load_jsonl(test_file)

    async def both() -> tuple[list[TaskScore], list[TaskScore]]:
        try:
            return await scorer.score_tasks(test, examples), await scorer.score_tasks(test)
        finally:
            await backend.close()

    with_examples, without = asyncio.run(both())
    return {
        "score": statistics.fmean(s.score for s in with_examples),
        "zero_shot": statistics.fmean(s.score for s in without),
        "prompt_tokens": statistics.fmean(s.prompt_tokens for s in with_examples),
        "examples": len(examples),
    }


def sft_run(
    model: Path, train_file: Path, test_file: Path, args: argparse.Namespace, seed: int, out: Path
) -> dict[str, float]:
    """LoRA SFT on the training tasks (its defaults), validated on the held-out tasks as GSPO validates."""
    from zoo.trainer.sft.job import run_sft
    from zoo.trainer.sft.spec import SftSpec

    spec = SftSpec.parse({"dataset": str(train_file), "validation": str(test_file), "seed": seed,
                          "instruction": INSTRUCTIONS[args.family],
                          "validation_max_tokens": args.max_new_tokens})  # fmt: skip
    run_dir = out / f"sft-seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    result = run_sft(spec, model, run_dir, model_id=MODEL_ID)
    row = {"seed": seed, "before": result["baseline_validation_score"], "after": result["validation_score"],
           "steps": result["steps"], "wall_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    print(f"  sft seed {seed}: held-out {row['before']:.3f} -> {row['after']:.3f} ({row['steps']} steps, "
          f"{row['wall_s']:.0f} s)", flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(INSTRUCTIONS), default="sums")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--num-iterations", type=int, default=2)
    ap.add_argument("--validate-every", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--no-baselines", dest="baselines", action="store_false", help="GSPO only: no lookup, sft"
    )
    args = ap.parse_args()
    if args.seeds < 1 or args.epochs < 1:
        ap.error("--seeds and --epochs must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.gspo.spec import GspoSpec
    from zoo.trainer.tasks import families

    model = prepare_bundled_chat_model(default_cache_dir()).path
    out = args.out or Path(tempfile.mkdtemp(prefix="zoo-bench-gspo-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.family == "sums":
        sums = families.write_sums(out)
        train_file, test_file = sums["train"], sums["test"]
    else:
        train_file, test_file = families.path("habitats", "train"), families.path("habitats", "test")
    print(
        f"model {model}; {args.family}: 24 train, 16 held-out test tasks; seeds {args.seeds}, epochs "
        f"{args.epochs}, lr {args.lr}, G {args.group_size}, batch {args.batch_size}, "
        f"rank {args.lora_rank}, {args.max_new_tokens} new tokens; outputs in {out}",
        flush=True,
    )
    lookup: dict[str, float] | None = None
    sft: list[dict[str, float]] = []
    if args.baselines:
        lookup = lookup_score(model, train_file, test_file, args)
        print(f"  lookup (all {lookup['examples']:.0f} training tasks as worked examples): held-out "
              f"{lookup['score']:.3f} (zero-shot through the same prompt path {lookup['zero_shot']:.3f}), "
              f"{lookup['prompt_tokens']:.0f} prompt tokens a task", flush=True)  # fmt: skip
        sft = [sft_run(model, train_file, test_file, args, seed, out) for seed in range(args.seeds)]
    runs = []
    for seed in range(args.seeds):
        spec = GspoSpec.parse({
            "dataset": str(train_file),
            "validation": str(test_file),
            "instruction": INSTRUCTIONS[args.family], "epochs": args.epochs, "batch_size": args.batch_size,
            "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
            "learning_rate": args.lr, "lora_rank": args.lora_rank, "lora_alpha": 2.0 * args.lora_rank,
            "num_iterations": args.num_iterations, "validate_every": args.validate_every,
            "checkpoint_every": 1000, "seed": seed,
        })  # fmt: skip
        run_dir = out / f"seed-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.perf_counter()
        result = run_gspo(spec, model, run_dir)
        report = json.loads(Path(result["report"]).read_text())
        shutil.copy(result["curve"], out / f"curve-seed{seed}.png")
        before, after = report["baseline_validation_score"], report["final_validation_score"]
        rewards = [round(p["reward_mean"], 3) for p in report["curve"]]
        runs.append({"seed": seed, "before": before, "after": after, "steps": report["steps"],
                     "reward_per_step": rewards, "validation_per_step": [p.get("validation_score")
                     for p in report["curve"]], "wall_s": round(time.perf_counter() - started, 1),
                     "s_per_step": report["cost"]["wall_s_per_step"]})  # fmt: skip
        print(f"  seed {seed}: held-out {before:.3f} -> {after:.3f} ({report['steps']} steps, "
              f"{runs[-1]['wall_s']:.0f} s); train reward per step {rewards}", flush=True)  # fmt: skip
    gains = [r["after"] - r["before"] for r in runs]
    summary = {
        "before_mean": statistics.fmean(r["before"] for r in runs),
        "after_mean": statistics.fmean(r["after"] for r in runs),
        "gain_mean": statistics.fmean(gains),
        "gain_std": statistics.stdev(gains) if len(gains) > 1 else 0.0,
        "before_std": statistics.stdev([r["before"] for r in runs]) if len(runs) > 1 else 0.0,
        "after_std": statistics.stdev([r["after"] for r in runs]) if len(runs) > 1 else 0.0,
    }
    print(
        f"\nheld-out exact_match over {len(runs)} seeds: before {summary['before_mean']:.3f} "
        f"(sd {summary['before_std']:.3f}) -> after {summary['after_mean']:.3f} "
        f"(sd {summary['after_std']:.3f}); gain {summary['gain_mean']:+.3f} (sd {summary['gain_std']:.3f})"
    )
    if lookup is not None:
        after = [r["after"] for r in sft]
        spread = statistics.stdev(after) if len(after) > 1 else 0.0
        print(f"beside it, on the same held-out tasks: lookup {lookup['score']:.3f}; sft "
              f"{statistics.fmean(after):.3f} (sd {spread:.3f}); gspo {summary['after_mean']:.3f} "
              f"(sd {summary['after_std']:.3f})")  # fmt: skip
    (out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                  "runs": runs, "summary": summary,
                                                  "lookup": lookup, "sft": sft}, indent=2))  # fmt: skip
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
