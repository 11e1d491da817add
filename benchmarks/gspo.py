"""GSPO step time on CPU: zoo-node against TRL's GRPOTrainer set up for GSPO (figure 1), and zoo-node with 2
processes against 1 (figure 4), both on the bundled SmolLM2-135M in fp32.

The unit is a generation round: B prompts × G completions sampled from the current policy, scored, their
old log-probs taken (num_iterations > 1), then num_iterations optimiser passes over the whole batch. The
time of a round is the median over --steps rounds after one warm-up round.

Figure 1, zoo-node vs TRL 1.16 `GRPOTrainer`, in one process, rounds interleaved (TRL's round r, then
zoo-node's; the order flips every round, so drifting machine load hits both alike):
- zoo-node: `GspoRun.train_step` (trainer/gspo/run.py), the step `zoo-node train gspo` runs, on a
  `LoraPolicy`, with the micro-batch set to the whole batch (one forward per pass, as TRL does);
- TRL: `GRPOConfig(importance_sampling_level="sequence", loss_type="grpo", beta=0, epsilon=3e-4,
  epsilon_high=4e-4, num_iterations=N, per_device_train_batch_size=B·G, gradient_accumulation_steps=1,
  steps_per_generation=1, num_generations=G, ...)`, so it generates once per N optimiser steps; TRL's round
  is timed by a callback from the first step's start to the last step's end (every default that differs
  from zoo-node's setup is set explicitly: fp32, no gradient checkpointing, constant learning rate,
  AdamW without weight decay, top_k=0, no shuffling, no logging, saving or reporting).
Both sides share: the model files, the prompts of every round (the same tasks in the same order, asked with
the same system instruction and chat template), LoRA (peft `LoraConfig`: rank r, alpha 2r, dropout 0, the
7 attention and MLP projections), learning rate, gradient clipping 1.0, clip range 3e-4 / 4e-4, no KL, and
the reward function object. Both are forced to generate exactly --max-new-tokens tokens (min_new_tokens:
the end-of-sequence token is masked until then; TRL gets it in generation_kwargs, zoo-node loads the same
model files through a directory of symlinks whose generation_config.json adds it; --free-length turns
that off), so completion lengths do not bias the time; the completion tokens of every round are counted
on both sides and printed, with the time per token. The two models are checked to match (trainable and
total parameters, fp32, no activation checkpointing) before timing, and every round's prompts too.

The reward is zoo's exact_match on the shipped `lengths` family, scaled into [0, 1 - 1e-3] plus a
tie-break of 1e-3·i/G for the i-th completion of a group (--reward tiebreak, the default). Why: zoo-node
skips the optimiser passes of a round in which every group's rewards are equal (no learning signal), TRL
never does, and SmolLM2-135M rarely gets a `lengths` task right, so with plain exact_match zoo-node would
often time generation alone against TRL's full step. The tie-break keeps both sides doing the same work;
how many groups plain exact_match left without any signal is printed (--reward exact_match measures the
shipped behaviour instead).

Figure 4, zoo-node with 2 processes vs 1, the same global batch: 1 process in this process (`run_gspo`,
what `zoo-node train gspo --processes 1` runs) with --threads torch threads, then 2 workers started by
`launch_command` + `launch_env(2)` (accelerate, gloo), each with max(1, threads // 2) threads; the
per-step `wall_s` the main worker prints is the step time (model loading, process-group start-up and the
final checkpoint are outside it). Both runs load the length-forcing model directory and sample the same
completions (each prompt's group is seeded by the task), so their tokens per step are equal. On a 2-core
CPU, 2 processes × 1 thread against 1 process × 2 threads may well be no speed-up at all: the output says
which.

Run: ./zoo bench gspo [--steps 3] [--prompts 2] [--group-size 4] [--max-new-tokens 32] [--lora-rank 8]
         [--threads 2] [--num-iterations 2] [--lr 1e-5] [--reward tiebreak|exact_match] [--free-length]
         [--only 1,4] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from zoo.devnet.process import dies_with_this_process
from zoo.trainer.rewards import REWARDS, ExactMatch, RewardResult, register
from zoo.trainer.tasks.schema import Task

ROOT = Path(__file__).resolve().parents[1]
TIE = 1e-3
REWARD_NAMES = {"tiebreak": "bench_exact_match_tiebreak", "exact_match": "bench_exact_match"}


class BenchExactMatch(ExactMatch):
    """zoo's exact_match, recording every group's plain scores (to count groups without a signal)."""

    tie: ClassVar[float] = 0.0
    seen: ClassVar[list[list[float]]] = []

    def group_scores(self, task: Task, completions: Sequence[str]) -> list[RewardResult]:
        plain = [self.score(task, c) for c in completions]
        BenchExactMatch.seen.append([r.score for r in plain])
        n = len(plain)
        return [
            RewardResult((1 - self.tie) * r.score + self.tie * i / n, r.reason, r.details)
            for i, r in enumerate(plain)
        ]


class TieBrokenExactMatch(BenchExactMatch):
    """exact_match scaled into [0, 1 - TIE], plus TIE·i/G for the i-th completion: no group is ever flat."""

    tie = TIE


# Registered on import: the 2-process workers import this module (launch_command's `imports`).
for _name, _cls in (
    (REWARD_NAMES["exact_match"], BenchExactMatch),
    (REWARD_NAMES["tiebreak"], TieBrokenExactMatch),
):
    if _name not in REWARDS:
        register(_name)(_cls)


def take_groups() -> list[list[float]]:
    """The plain exact_match scores of the groups scored since the last call."""
    groups = list(BenchExactMatch.seen)
    BenchExactMatch.seen.clear()
    return groups


class Stopwatch:
    """Accumulated seconds spent in the functions it wraps."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - started

        return timed


def round_tasks(train: Sequence[Task], prompts: int, rounds: int) -> list[Task]:
    """The prompts of every round in order (round r: rows r·B to (r+1)·B), cycling through the family; a
    task met again gets a suffixed id (ids must be unique; a group's sampling seed derives from it)."""
    rows = []
    for k in range(prompts * rounds):
        task = train[k % len(train)]
        lap = k // len(train)
        rows.append(task if lap == 0 else task.model_copy(update={"id": f"{task.id}.{lap}"}))
    return rows


def zoo_spec(args: argparse.Namespace, dataset: Path, validation: Path) -> Any:
    from zoo.trainer.gspo.spec import GspoSpec

    return GspoSpec.parse({
        "dataset": str(dataset), "validation": str(validation), "validation_limit": 0, "epochs": 1,
        "batch_size": args.prompts, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0, "top_p": 1.0, "lora_rank": args.lora_rank, "lora_alpha": 2.0 * args.lora_rank,
        "lora_dropout": 0.0, "eps_low": 3e-4, "eps_high": 4e-4, "beta": 0.0,
        "num_iterations": args.num_iterations, "micro_batch_size": args.prompts * args.group_size,
        "learning_rate": args.lr, "weight_decay": 0.0, "max_grad_norm": 1.0, "bf16": False, "loss": "torch",
        "reward": REWARD_NAMES[args.reward], "checkpoint_every": 100_000, "seed": args.seed,
    })  # fmt: skip


def forced_length_model(model_path: Path, new_tokens: int, out: Path) -> Path:
    """A copy of the model directory (files symlinked) whose generation_config.json sets min_new_tokens, so
    that every process loading it samples exactly `new_tokens` tokens (end-of-sequence masked until then)."""
    out.mkdir(parents=True)
    for entry in model_path.iterdir():
        if entry.name != "generation_config.json":
            (out / entry.name).symlink_to(entry.resolve())
    config_file = model_path / "generation_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    (out / "generation_config.json").write_text(
        json.dumps({**config, "min_new_tokens": new_tokens}, indent=2)
    )
    return out


def model_setup(model: Any) -> dict[str, Any]:
    """What must match between the two sides' models: trainable (LoRA) parameters, dtypes, and no
    activation checkpointing."""
    params = list(model.parameters())
    return {
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "parameters": sum(p.numel() for p in params),
        "dtypes": sorted({str(p.dtype) for p in params}),
        "activation_checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in model.modules()),
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def flat_groups(groups: Sequence[Sequence[float]]) -> int:
    return sum(len(set(g)) == 1 for g in groups)


# -- figure 1 ---------------------------------------------------------------------------------------------


def figure_one(
    args: argparse.Namespace, model_path: Path, zoo_model: Path, rows: list[Task], spec: Any, work: Path
) -> dict:
    """TRL loads `model_path` (its generation_kwargs force the length), zoo-node `zoo_model` (the same files,
    its generation_config forcing the length unless --free-length)."""
    import datasets
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from zoo.trainer.gspo.run import GspoRun
    from zoo.trainer.lora.policy import LoraPolicy
    from zoo.trainer.lora.spec import DEFAULT_TARGET_MODULES
    from zoo.trainer.prompting import bare_messages
    from zoo.trainer.rewards import get_reward, score_group

    b, g, n, iters = args.prompts, args.group_size, args.max_new_tokens, args.num_iterations
    rounds = args.steps + 1
    by_id = {t.id: t for t in rows}
    sides: dict[str, list[dict[str, Any]]] = {"TRL": [], "zoo-node": []}

    # zoo-node: the step of a GSPO run, on its own policy.
    torch.manual_seed(spec.seed)
    policy = LoraPolicy.load(zoo_model, spec)
    run = GspoRun(spec, policy, rows, [], work / "zoo")
    zoo_gen = Stopwatch()
    run.sample = zoo_gen.wrap(run.sample)  # type: ignore[method-assign]

    def zoo_round(r: int) -> None:
        batch = rows[r * b : (r + 1) * b]
        take_groups()
        zoo_gen.total = 0.0
        started = time.perf_counter()
        point = run.train_step(r + 1, batch)
        seconds = time.perf_counter() - started
        sides["zoo-node"].append({
            "round": r, "s": seconds, "generate_s": zoo_gen.total, "tokens": point["tokens"],
            "task_ids": [t.id for t in batch], "plain_groups": take_groups(), "updated": point["updated"],
            "threads": torch.get_num_threads(),
        })  # fmt: skip

    # TRL: the same prompts in the same order, the same reward object.
    reward = get_reward(spec.reward)
    trl_gen = Stopwatch()
    current: dict[str, Any] = {}

    def exact_match(prompts: list, completions: list, completion_ids: list, task_id: list, **_: Any) -> list:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        current["tokens"] += sum(len(ids) for ids in completion_ids)
        scores: list[float] = []
        for k in range(0, len(texts), g):
            ids = set(task_id[k : k + g])
            assert len(ids) == 1, f"a TRL group mixes prompts: {ids}"
            current["task_ids"].append(task_id[k])
            scores += [r.score for r in score_group(reward, by_id[task_id[k]], texts[k : k + g])]
        return scores

    dataset = datasets.Dataset.from_list(
        [{"prompt": bare_messages(t, spec.instruction), "task_id": t.id} for t in rows]
    )
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        seed=args.seed,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        gradient_checkpointing=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        per_device_train_batch_size=b * g,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=g,
        num_iterations=iters,
        max_steps=iters * rounds,
        max_completion_length=n,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        generation_kwargs=None if args.free_length else {"min_new_tokens": n},
        importance_sampling_level="sequence",
        loss_type="grpo",
        beta=0.0,
        epsilon=3e-4,
        epsilon_high=4e-4,
        scale_rewards="group",
        mask_truncated_completions=False,
        shuffle_dataset=False,
        use_vllm=False,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    peft_config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        lora_dropout=0.0,
        target_modules=list(DEFAULT_TARGET_MODULES),
        task_type="CAUSAL_LM",
    )

    class Rounds(TrainerCallback):
        """Times TRL's rounds (num_iterations optimiser steps from one generation) and runs zoo-node's
        round r after TRL's for even r, before it for odd r."""

        started = 0.0

        def on_step_begin(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % iters == 0:
                r = state.global_step // iters
                if r % 2 == 1:
                    zoo_round(r)
                take_groups()
                current.update(tokens=0, task_ids=[])
                trl_gen.total = 0.0
                self.started = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % iters == 0:
                seconds = time.perf_counter() - self.started
                r = state.global_step // iters - 1
                sides["TRL"].append({
                    "round": r, "s": seconds, "generate_s": trl_gen.total, "tokens": current["tokens"],
                    "task_ids": list(current["task_ids"]), "plain_groups": take_groups(),
                    "threads": torch.get_num_threads(),
                })  # fmt: skip
                if r % 2 == 0:
                    zoo_round(r)

    torch.manual_seed(args.seed)
    trainer = GRPOTrainer(
        model=str(model_path),
        reward_funcs=exact_match,
        args=config,
        train_dataset=dataset,
        peft_config=peft_config,
        callbacks=[Rounds()],
    )
    trainer.remove_callback(PrinterCallback)  # its end-of-training summary: our table says it
    trainer._generate = trl_gen.wrap(trainer._generate)  # type: ignore[method-assign]
    setup = {name: model_setup(model) for name, model in (("TRL", trainer.model), ("zoo-node", policy.model))}
    if setup["TRL"] != setup["zoo-node"]:
        raise RuntimeError(f"the two models are not set up alike: {setup}")
    trainer.train()
    del trainer
    gc.collect()

    for name, side in sides.items():
        if len(side) != rounds:
            raise RuntimeError(f"{name}: {len(side)} rounds timed, expected {rounds}")
    for zoo, trl in zip(sides["zoo-node"], sides["TRL"], strict=True):
        if zoo["task_ids"] != trl["task_ids"]:
            raise RuntimeError(f"round {zoo['round']}: zoo-node {zoo['task_ids']} vs TRL {trl['task_ids']}")
    return {**summarise_one(args, sides), "model_setup": setup["TRL"]}


def summarise_one(args: argparse.Namespace, sides: dict[str, list[dict[str, Any]]]) -> dict:
    summary: dict[str, Any] = {}
    for name, side in sides.items():
        timed = side[1:]  # round 0 is the warm-up
        s = median([x["s"] for x in timed])
        gen = median([x["generate_s"] for x in timed])
        tokens = median([x["tokens"] for x in timed])
        groups = [grp for x in timed for grp in x["plain_groups"]]
        summary[name] = {
            "round_s": s,
            "generate_s": gen,
            "rest_s": s - gen,
            "tokens_per_round": tokens,
            "ms_per_token": 1e3 * s / tokens if tokens else float("nan"),
            "exact_match_mean": statistics.fmean(v for grp in groups for v in grp) if groups else None,
            "groups": len(groups),
            "groups_without_signal": flat_groups(groups),
            "threads": sorted({x["threads"] for x in side}),
            "rounds": side,
        }
    zoo, trl = summary["zoo-node"], summary["TRL"]
    summary["ratio_round"] = zoo["round_s"] / trl["round_s"]
    summary["ratio_per_token"] = zoo["ms_per_token"] / trl["ms_per_token"]
    summary["ratio_generate"] = zoo["generate_s"] / trl["generate_s"]
    summary["ratio_rest"] = zoo["rest_s"] / trl["rest_s"]
    return summary


def print_one(args: argparse.Namespace, res: dict) -> None:
    b, g = args.prompts, args.group_size
    length = "free (stops at end of sequence)" if args.free_length else "forced (min_new_tokens)"
    print(
        f"\nFigure 1: one GSPO generation round, SmolLM2-135M on CPU, fp32: zoo-node vs TRL GRPOTrainer\n"
        f"  {b} prompts x G {g} = {b * g} completions of up to {args.max_new_tokens} new tokens, length "
        f"{length}; {args.num_iterations} optimiser passes per round; LoRA r {args.lora_rank} alpha "
        f"{2 * args.lora_rank} on 7 projections; lr {args.lr:g}; no KL; clip 3e-4/4e-4; reward "
        f"{REWARD_NAMES[args.reward]}\n"
        f"  median of {args.steps} round(s) after a warm-up, interleaved; torch threads: TRL "
        f"{res['TRL']['threads']}, zoo-node {res['zoo-node']['threads']}\n"
        f"  both models (checked equal): {res['model_setup']['trainable_parameters']:,} trainable of "
        f"{res['model_setup']['parameters']:,} parameters, {', '.join(res['model_setup']['dtypes'])}, "
        f"activation checkpointing {'on' if res['model_setup']['activation_checkpointing'] else 'off'}"
    )
    print(f"  {'':<10}{'round s':>10}{'generate s':>12}{'rest s':>9}{'tokens/round':>14}{'ms/token':>10}")
    for name in ("TRL", "zoo-node"):
        x = res[name]
        print(
            f"  {name:<10}{x['round_s']:>10.3f}{x['generate_s']:>12.3f}{x['rest_s']:>9.3f}"
            f"{x['tokens_per_round']:>14.0f}{x['ms_per_token']:>10.2f}"
        )
    ratio = res["ratio_round"]
    verdict = f"zoo-node {1 / ratio:.2f}x faster" if ratio < 1 else f"zoo-node {ratio:.2f}x slower"
    print(
        f"  zoo-node / TRL time per round: x{ratio:.3f} ({verdict}); per completion token: "
        f"x{res['ratio_per_token']:.3f}; generation: x{res['ratio_generate']:.3f}; "
        f"rest: x{res['ratio_rest']:.3f}"
    )
    print("  rest = scoring, old log-probs and the optimiser passes; per round (s):")
    for zoo, trl in zip(res["zoo-node"]["rounds"], res["TRL"]["rounds"], strict=True):
        tag = " (warm-up)" if zoo["round"] == 0 else ""
        print(
            f"    round {zoo['round']}{tag}: TRL {trl['s']:.3f} ({trl['tokens']} tokens), "
            f"zoo-node {zoo['s']:.3f} ({zoo['tokens']} tokens)"
        )
    for name in ("TRL", "zoo-node"):
        x = res[name]
        mean = "-" if x["exact_match_mean"] is None else f"{x['exact_match_mean']:.3f}"
        print(
            f"  {name}: exact_match mean {mean}; groups whose exact_match scores were all equal: "
            f"{x['groups_without_signal']}/{x['groups']}"
        )
    if args.reward == "tiebreak":
        print(
            "  (shipped zoo-node skips a round's optimiser passes when every group is like that; the "
            "tie-break reward made both sides update in every round)"
        )
    else:
        skipped = sum(not x["updated"] for x in res["zoo-node"]["rounds"][1:])
        print(
            f"  zoo-node skipped its optimiser passes in {skipped} of {args.steps} timed rounds; "
            "TRL never does"
        )


# -- figure 4 ---------------------------------------------------------------------------------------------


def figure_four(args: argparse.Namespace, model_path: Path, spec: Any, work: Path) -> dict:
    from zoo.trainer.gspo import worker
    from zoo.trainer.gspo.job import run_gspo
    from zoo.trainer.lora.launch import STEP, launch_command, launch_env, worker_messages

    # 1 process, in this process.
    one: list[dict[str, Any]] = []
    run_gspo(spec, model_path, work / "one", on_step=one.append)

    # 2 processes under accelerate launch, the threads shared out.
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    command = launch_command(
        spec_file, model_path, work / "two", 2, "cpu", ("benchmarks.gspo",), worker=worker.__name__
    )
    env = launch_env(2)
    per_worker = max(1, args.threads // 2)
    env["OMP_NUM_THREADS"] = str(per_worker)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    two: list[dict[str, Any]] = []
    started = time.perf_counter()
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=dies_with_this_process(),
        ) as proc,
    ):
        assert proc.stdout is not None
        for kind, data in worker_messages(proc.stdout):
            if kind == STEP:
                two.append(data)
                print(f"  [2 processes] step {data['step']}: {data['wall_s']:.3f} s", flush=True)
        code = proc.wait()
        if code != 0:
            err.seek(0)
            raise RuntimeError(f"the 2-process run failed (exit {code}):\n{err.read()[-4000:]}")
    total_s = time.perf_counter() - started

    res: dict[str, Any] = {"subprocess_total_s": total_s, "threads_per_worker": per_worker}
    for name, points, threads in (("1 process", one, [args.threads]), ("2 processes", two, [per_worker] * 2)):
        if len(points) != args.steps + 1:
            raise RuntimeError(f"{name}: {len(points)} steps, expected {args.steps + 1}")
        timed = points[1:]
        res[name] = {
            "step_s": median([p["wall_s"] for p in timed]),
            "tokens_per_step": median([p["tokens"] for p in timed]),
            "threads": threads,
            "updated": [p["updated"] for p in points],
            "steps": [
                {k: p[k] for k in ("step", "wall_s", "tokens", "processes", "updated")} for p in points
            ],
        }
    res["ratio"] = res["2 processes"]["step_s"] / res["1 process"]["step_s"]
    return res


def print_four(args: argparse.Namespace, res: dict) -> None:
    one, two = res["1 process"], res["2 processes"]
    print(
        f"\nFigure 4: zoo-node GSPO step, 2 processes (accelerate, gloo) vs 1, the same global batch "
        f"({args.prompts} prompts x G {args.group_size}), {os.cpu_count()} CPU cores\n"
        f"  median of {args.steps} step(s) after a warm-up step; runs one after the other (not interleaved)"
    )
    print(f"  {'':<34}{'step s':>9}{'tokens/step':>13}")
    for label, x in (
        (f"1 process x {args.threads} thread(s)", one),
        (f"2 processes x {res['threads_per_worker']} thread(s) each", two),
    ):
        print(f"  {label:<34}{x['step_s']:>9.3f}{x['tokens_per_step']:>13.0f}")
    ratio = res["ratio"]
    speedup = 1 / ratio
    if speedup >= 1:
        verdict = f"a {speedup:.2f}x speed-up"
    else:
        verdict = f"{speedup:.2f}x, i.e. no speed-up: 2 processes are {ratio:.2f}x SLOWER than 1 here"
    print(f"  2-process / 1-process time per step: x{ratio:.3f} ({verdict})")
    if 2 * res["threads_per_worker"] != args.threads:
        print(
            f"  note: the two sides do not use the same number of threads in all "
            f"(1 x {args.threads} vs 2 x {res['threads_per_worker']})"
        )
    if one["tokens_per_step"] != two["tokens_per_step"]:
        print("  note: the two runs generated different numbers of tokens (they should sample the same)")
    for name in ("1 process", "2 processes"):
        steps = ", ".join(f"{p['wall_s']:.3f}" for p in res[name]["steps"])
        print(f"  {name} per step (s, first is the warm-up): {steps}; updated: {res[name]['updated']}")
    print(
        f"  the 2-process run took {res['subprocess_total_s']:.1f} s in all (start-up, loading, checkpoint)"
    )


# -- main -------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed rounds, after one warm-up round")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per round (B)")
    ap.add_argument("--group-size", type=int, default=4, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lora-rank", type=int, default=8, help="LoRA rank r (alpha 2r)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (figure 4: shared by 2 workers)")
    ap.add_argument("--num-iterations", type=int, default=2, help="optimiser passes per generation round")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward", choices=sorted(REWARD_NAMES), default="tiebreak")
    ap.add_argument("--free-length", action="store_true", help="do not force max-new-tokens on both sides")
    ap.add_argument("--only", default="1,4", help="figures to run: 1, 4 or 1,4")
    ap.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if not only or only - {"1", "4"}:
        ap.error("--only takes 1, 4 or 1,4")
    if (
        args.steps < 1
        or args.prompts < 1
        or args.group_size < 2
        or args.max_new_tokens < 1
        or args.threads < 1
    ):
        ap.error("--steps, --prompts, --max-new-tokens, --threads must be >= 1 and --group-size >= 2")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local: nothing may reach the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir
    from zoo.trainer.tasks import families
    from zoo.trainer.tasks.loading import load_jsonl
    from zoo.trainer.tasks.schema import write_jsonl

    model_path = prepare_bundled_chat_model(default_cache_dir()).path
    rows = round_tasks(load_jsonl(families.path("lengths", "train")), args.prompts, args.steps + 1)
    load_start = os.getloadavg()
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for module in ("transformers", "trl", "peft", "accelerate"):
        versions[module] = __import__(module).__version__
    print(
        f"model {model_path}\n{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}); "
        f"load average at start {load_start[0]:.2f}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        flush=True,
    )
    results: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "versions": versions,
        "cpu_count": os.cpu_count(),
        "load_start": load_start,
    }
    with tempfile.TemporaryDirectory(prefix="zoo-bench-gspo-") as tmp:
        work = Path(tmp)
        dataset = work / "rounds.jsonl"
        write_jsonl(dataset, rows)
        spec = zoo_spec(args, dataset, families.path("lengths", "validation"))
        zoo_model = model_path
        if not args.free_length:
            zoo_model = forced_length_model(model_path, args.max_new_tokens, work / "model")
        if "1" in only:
            print("\nfigure 1: running TRL and zoo-node rounds, interleaved ...", flush=True)
            results["figure_1"] = figure_one(args, model_path, zoo_model, rows, spec, work / "f1")
            print_one(args, results["figure_1"])
        if "4" in only:
            print("\nfigure 4: running 1 process, then 2 processes ...", flush=True)
            results["figure_4"] = figure_four(args, zoo_model, spec, work / "f4")
            print_four(args, results["figure_4"])
    results["load_end"] = os.getloadavg()
    print(
        f"\nload average at the end {results['load_end'][0]:.2f} (other work on the machine slows both sides)"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"results: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
