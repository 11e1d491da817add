"""Does GSPO learn? Held-out reward of the bundled SmolLM2-135M before and after N GSPO steps, over several
seeds, on a shipped verifiable task family (issue 13, figure 2).

The family is the shipped `habitats` convention family (trainer/data/families/): "Under which label is the
otter filed?", answer WET or DRY, scored by exact_match. The run's instruction (the system turn) states the
convention — "Animals are filed under one of two labels: WET (lives in or by water) or DRY (does not).
Reply with the label only." — so the task is answerable and what is left to learn is to follow it: reply
with one of the two labels, the right one. Zero-shot the model mostly writes sentences or other words.

Per seed, one `run_gspo` (what `zoo-node train gspo` runs) on the 24 train tasks for --epochs epochs,
validating (greedy, one completion a task) on the 16 held-out test tasks before the first step, every
--validate-every steps and after the last: GSPO never selects anything on that score, so it is a held-out
measurement. The seed changes the LoRA initialisation, the batch order and the sampling. Printed: per seed
the held-out score before and after and the reward per step; over seeds the mean gain and its standard
deviation, and the spread of the before and after scores. Written to --out: results.json and
curve-seed<N>.png per seed (the run's own curve).

Run: ./zoo bench gspo_learning [--seeds 3] [--epochs 2] [--lr 1e-4] [--group-size 4] [--batch-size 4]
         [--max-new-tokens 8] [--lora-rank 8] [--validate-every 3] [--threads 2] [--out DIR]
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

INSTRUCTION = (
    "Animals are filed under one of two labels: WET (lives in or by water) or DRY (does not). "
    "Reply with the label only."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    from zoo.trainer import families
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.gspo.spec import GspoSpec

    model = prepare_bundled_chat_model(default_cache_dir()).path
    out = args.out or Path(tempfile.mkdtemp(prefix="zoo-bench-gspo-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"model {model}; habitats: 24 train, 16 held-out test tasks; seeds {args.seeds}, epochs "
        f"{args.epochs}, lr {args.lr}, G {args.group_size}, batch {args.batch_size}, "
        f"rank {args.lora_rank}, {args.max_new_tokens} new tokens; outputs in {out}",
        flush=True,
    )
    runs = []
    for seed in range(args.seeds):
        spec = GspoSpec.parse({
            "dataset": str(families.path("habitats", "train")),
            "validation": str(families.path("habitats", "test")),
            "instruction": INSTRUCTION, "epochs": args.epochs, "batch_size": args.batch_size,
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
