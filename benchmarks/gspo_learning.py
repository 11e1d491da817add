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

Per seed, one `run_gspo` (what `zoo-node train gspo` runs) on the train tasks for --epochs epochs,
validating (greedy, one completion a task) on the held-out tasks before the first step, every
--validate-every steps and after the last: GSPO never selects anything on that score, so it is a held-out
measurement. The seed changes the LoRA initialisation, the batch order and the sampling. Printed: per seed
the held-out score before and after and the reward per step; over seeds the mean gain and its standard
deviation, and the spread of the before and after scores. Written to --out: results.json and
curve-seed<N>.png per seed (the run's own curve).

Run: ./zoo bench gspo_learning [--family sums|habitats] [--seeds 3] [--epochs 2] [--lr 1e-4]
         [--group-size 4] [--batch-size 4] [--max-new-tokens 8] [--lora-rank 8] [--validate-every 3]
         [--threads 2] [--out DIR]
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

INSTRUCTIONS = {
    "habitats": "Animals are filed under one of two labels: WET (lives in or by water) or DRY (does not). "
    "Reply with the label only.",
    "sums": "Reply with the number only.",
}


def sums_files(out: Path) -> tuple[Path, Path]:
    """The sums family: every single-digit pair once, shuffled (fixed seed), 24 train and 16 test tasks."""
    import random

    from zoo.trainer.tasks.schema import Task, write_jsonl

    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(13).shuffle(pairs)
    tasks = [Task(id=f"sum-{a}-{b}", question=f"What is {a} + {b}?", answer=str(a + b), domain="math.sums")
             for a, b in pairs]  # fmt: skip
    train, test = out / "sums-train.jsonl", out / "sums-test.jsonl"
    write_jsonl(train, tasks[:24])
    write_jsonl(test, tasks[24:40])
    return train, test


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
    args = ap.parse_args()
    if args.seeds < 1 or args.epochs < 1:
        ap.error("--seeds and --epochs must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    from zoo.inference.models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.gspo.spec import GspoSpec
    from zoo.trainer.tasks import families

    model = prepare_bundled_chat_model(default_cache_dir()).path
    out = args.out or Path(tempfile.mkdtemp(prefix="zoo-bench-gspo-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.family == "sums":
        train_file, test_file = sums_files(out)
    else:
        train_file, test_file = families.path("habitats", "train"), families.path("habitats", "test")
    print(
        f"model {model}; {args.family}: 24 train, 16 held-out test tasks; seeds {args.seeds}, epochs "
        f"{args.epochs}, lr {args.lr}, G {args.group_size}, batch {args.batch_size}, "
        f"rank {args.lora_rank}, {args.max_new_tokens} new tokens; outputs in {out}",
        flush=True,
    )
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
    (out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                  "runs": runs, "summary": summary}, indent=2))  # fmt: skip
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
