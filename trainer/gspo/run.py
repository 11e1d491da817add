"""A GSPO run: sample, reward, and take clipped sequence-level policy-gradient steps on LoRA adapters.

One step, for a batch of prompts (trainer/schedule.py orders them):
1. G completions per prompt from the current policy (rollouts.py), scored by each task's verifier;
2. group advantages Aᵢ = (rᵢ - mean)/(std + ε) (zero-variance groups give 0 and are counted);
3. with num_iterations > 1, the completions' log-probs under the sampling policy (π_old), kept fixed;
4. num_iterations optimisation passes, each accumulating the GSPO loss (loss.py) over micro-batches into
   one optimiser step, with gradient clipping; on the first pass π_θ = π_old, so the ratio is 1 and
   clipping starts to act from the second;
5. metrics (reward mean/std, advantage std, clip fraction, KL, loss, grad norm, tokens, step time).

A checkpoint (every `checkpoint_every` steps and at the end) is a directory written whole and renamed
into place: the adapters (safetensors), the optimiser state, the RNG states and the curve so far. A run
killed at any moment resumes from its last checkpoint and, in fp32, ends with the same adapters as a run
never interrupted. The validation score (greedy, one completion per task) is taken before the first step,
every `validate_every` steps and after the last.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.registry.fsutil import write_atomic
from zoo.trainer.gspo.episodes import EpisodeGroups
from zoo.trainer.gspo.fused import chosen_logprobs, triton_available
from zoo.trainer.gspo.loss import GspoLossConfig, group_advantages, gspo_loss
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.lora.rollouts import Rollouts, generate, stack
from zoo.trainer.lora.run import LoraRun, OnStep
from zoo.trainer.rewards import score_group
from zoo.trainer.schedule import batches, seed_of, total_steps
from zoo.trainer.tasks.schema import Task

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
STATE_VERSION = 1

METRIC_KEYS = ("loss", "ratio_mean", "clip_fraction", "clip_fraction_high", "clip_fraction_low", "kl")


def advantages_of_batch(scores: Sequence[float], group_size: int) -> torch.Tensor:
    return group_advantages(torch.tensor(list(scores), dtype=torch.float32), group_size)[0]


class GspoRun(LoraRun):
    def __init__(
        self,
        spec: GspoSpec,
        policy: LoraPolicy,
        train: Sequence[Task],
        validation: Sequence[Task],
        out_dir: Path,
        *,
        on_step: OnStep | None = None,
        processes: Processes | None = None,
        episodes: EpisodeGroups | None = None,
    ) -> None:
        torch.manual_seed(spec.seed)
        steps = total_steps(len(train), spec.batch_size, spec.epochs)
        super().__init__(spec, policy, validation, steps_total=steps, on_step=on_step, processes=processes)
        self.spec: GspoSpec = spec
        self.episodes = episodes  # multi-turn environment episodes instead of single completions
        self.train = list(train)
        self.out_dir = out_dir
        self.per_epoch = math.ceil(len(self.train) / spec.batch_size)
        self.loss_config = GspoLossConfig(spec.eps_low, spec.eps_high, spec.beta)
        # auto: the fused loss where its Triton kernels run (a CUDA GPU), plain torch elsewhere; "fused"
        # forces it (off a GPU its chunked-torch path: slower, but it never holds tokens x vocab logits).
        self.fused = spec.loss == "fused" or (spec.loss == "auto" and triton_available(policy.device))
        self.kernel = chosen_logprobs if self.fused else None  # None: plain torch log-probs

    # -- rollouts and rewards --------------------------------------------------------------------------

    def group_scores(self, task: Task, completions: Sequence[str]) -> list[float]:
        return [r.score for r in score_group(self.reward_for(task), task, completions)]

    def sample(self, tasks: Sequence[Task], tag: str, *, greedy: bool = False) -> list[Rollouts]:
        """Each task's group (one greedy completion when `greedy`), whole groups in one `generate` up to
        `generation_rows` (all of them by default), each task's rows seeded by the task, not the batch."""
        spec = self.spec
        n = 1 if greedy else spec.group_size
        per_call = max(1, spec.generation_rows // n) if spec.generation_rows else max(1, len(tasks))
        groups: list[Rollouts] = []
        for start in range(0, len(tasks), per_call):
            part = tasks[start : start + per_call]
            rows = generate(
                self.policy,
                part,
                group_size=spec.group_size,
                max_new_tokens=spec.max_new_tokens,
                temperature=spec.temperature,
                top_p=spec.top_p,
                seeds=[seed_of(tag, spec.seed, task.id) for task in part],
                instruction=spec.instruction,
                greedy=greedy,
            )
            groups += [rows.rows(slice(i * n, (i + 1) * n)) for i in range(len(part))]
        return groups

    def rollout(
        self, tasks: Sequence[Any], tag: str, *, greedy: bool = False
    ) -> list[tuple[Rollouts, list[float]]]:
        """Each task's group and its rewards: sampled completions scored by the task's verifier, or
        environment episodes scored by the environment."""
        if self.episodes is not None:
            return [self.episodes.group(task, tag, greedy=greedy) for task in tasks]
        groups = self.sample(tasks, tag, greedy=greedy)
        return [(g, self.group_scores(t, g.completions)) for t, g in zip(tasks, groups, strict=True)]

    def validation_scores(self, tasks: Sequence[Task], tag: str) -> list[float]:
        return [s for _, scores in self.rollout(tasks, f"validation-{tag}", greedy=True) for s in scores]

    # -- the optimisation ------------------------------------------------------------------------------

    def _logprobs(self, part: Rollouts) -> torch.Tensor:
        return self.policy.token_logprobs(
            part.sequences,
            part.attention_mask,
            part.prompt_length,
            fused=self.kernel,
            autocast_bf16=self.spec.bf16,
        )

    def _micro_batches(self, n: int) -> list[slice]:
        size = self.spec.micro_batch_size
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _padding_backward(self) -> None:
        """A backward of weight 0 through every trainable parameter: a process with fewer micro-batches
        than another runs these so that all run as many backwards per update (a ZeRO-2 engine reduces
        gradients on each)."""
        ids = torch.full((1, 2), self.policy.tokenizer.pad_token_id, device=self.policy.device)
        logp = self.policy.token_logprobs(
            ids, torch.ones_like(ids), 1, fused=self.kernel, autocast_bf16=self.spec.bf16
        )
        self.processes.backward(logp.sum() * 0.0)

    def optimise(
        self, rollouts: Rollouts | None, advantages: torch.Tensor, total: int, backwards: int = 0
    ) -> dict[str, float]:
        """num_iterations passes over this process's rollouts (None: it has none this step), each one
        optimiser step on the batch mean over all `total` sequences of all processes; each pass runs at
        least `backwards` backwards (where processes must match backward for backward: the most
        micro-batches any process has), padded with zero-weight ones."""
        spec = self.spec
        params = self.policy.trainable_parameters()
        n = len(rollouts.completions) if rollouts is not None else 0
        parts = self._micro_batches(n)
        padding = max(0, backwards - len(parts))
        old: list[torch.Tensor | None] = [None] * len(parts)
        ref: list[torch.Tensor | None] = [None] * len(parts)
        assert rollouts is not None or not parts
        with torch.no_grad():
            for j, s in enumerate(parts):
                if spec.num_iterations > 1:
                    old[j] = self._logprobs(rollouts.rows(s))  # type: ignore[union-attr]
                if spec.beta > 0:
                    with self.policy.reference():
                        ref[j] = self._logprobs(rollouts.rows(s))  # type: ignore[union-attr]
        self.policy.model.train()
        metrics: dict[str, float] = {}
        norms: list[float] = []
        for _ in range(spec.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            totals = dict.fromkeys(METRIC_KEYS, 0.0)
            for j, s in enumerate(parts):
                part = rollouts.rows(s)  # type: ignore[union-attr]
                logp = self._logprobs(part)
                sampled = old[j] if old[j] is not None else logp.detach()
                loss, m = gspo_loss(
                    logp, sampled, advantages[s], part.completion_mask, self.loss_config, ref_logp=ref[j]
                )
                share = (s.stop - s.start) / total  # micro-batch means -> the mean over the whole batch
                self.processes.backward(loss * share)
                for key in totals:
                    totals[key] += float(m.get(key, 0.0)) * share
            for _ in range(padding):
                self._padding_backward()
            norms.append(self.processes.update(self.optimizer, params, spec.max_grad_norm))
            # The last pass's loss, ratio and clipping (where the ratio has moved off 1); the gradient
            # norm averaged over passes (a pass whose every sequence is clipped has none).
            metrics = {**self.processes.sum_values(totals), "grad_norm": statistics.fmean(norms)}
        self.optimizer.zero_grad(set_to_none=True)
        if spec.beta == 0:
            metrics.pop("kl", None)
        return metrics

    def train_step(self, number: int, batch: Sequence[Task]) -> dict[str, Any]:
        spec = self.spec
        started = time.perf_counter()
        mine = self.processes.shard(batch)
        sampled = self.rollout(mine, f"rollout-{number}")
        groups = [g for g, _ in sampled]
        local_scores = [scores for _, scores in sampled]
        advantages = torch.zeros(0)
        if mine:
            rewards = torch.tensor([s for group in local_scores for s in group], dtype=torch.float32)
            advantages, _ = group_advantages(rewards, spec.group_size)
        every = self.processes.gather([(s, len(g.completions), g.tokens) for s, g in
                                       zip(local_scores, groups, strict=True)])  # fmt: skip
        scores = [x for group, _, _ in every for x in group]
        flat_groups = sum(len(set(group)) == 1 for group, _, _ in every)
        rollouts = stack(groups, self.policy.tokenizer.pad_token_id) if groups else None
        total = sum(n for _, n, _ in every)
        backwards = 0
        if self.processes.pads_micro_batches:
            mine_rows = len(rollouts.completions) if rollouts is not None else 0
            backwards = max(self.processes.gather([len(self._micro_batches(mine_rows))]))
        # Every process takes the same number of optimiser steps (the sums are collective), so whether
        # to learn at all is decided on the whole batch: not when every group's rewards were equal.
        learn = flat_groups < len(batch)
        advantages = advantages.to(self.policy.device)
        metrics = self.optimise(rollouts, advantages, total, backwards) if learn else {}
        all_advantages = advantages_of_batch(scores, spec.group_size)
        return {
            "step": number,
            "steps_total": self.steps_total,
            "epoch": (number - 1) // self.per_epoch + 1,
            "reward_mean": statistics.fmean(scores),
            "reward_std": statistics.pstdev(scores),
            "advantage_std": float(all_advantages.std(correction=0)),
            "groups": len(batch),
            "groups_zero_variance": flat_groups,
            "clip_fraction": metrics.get("clip_fraction", 0.0),
            "ratio_mean": metrics.get("ratio_mean", 1.0),
            "kl": metrics.get("kl"),
            "loss": metrics.get("loss"),
            "grad_norm": metrics.get("grad_norm"),
            "updated": bool(metrics),  # False: every group had equal rewards, nothing to learn from
            "tokens": sum(t for _, _, t in every),
            "processes": self.processes.world,
            "wall_s": round(time.perf_counter() - started, 3),
        }

    # -- the loop, checkpoints -------------------------------------------------------------------------

    def run(self) -> None:
        """Train from the last checkpoint in out_dir (or from the start) to the last step."""
        self.resume()
        if self.step == 0:
            self.baseline_validation_score = self.validation_score = self.evaluate("baseline")
        for number in range(self.step + 1, self.steps_total + 1):
            epoch, b = divmod(number - 1, self.per_epoch)
            batch = batches(self.train, self.spec.batch_size, self.spec.seed, epoch)[b]
            point = self.train_step(number, batch)
            last = number == self.steps_total
            if last or (self.spec.validate_every and number % self.spec.validate_every == 0):
                self.validation_score = self.evaluate(f"step-{number}")
                point["validation_score"] = self.validation_score
            self.curve.append(point)
            self.step = number
            self.wall_s += point["wall_s"]
            if last or number % self.spec.checkpoint_every == 0:
                self.checkpoint()
            self.notify(point)

    def checkpoint(self) -> Path | None:
        """Write the state after `self.step` as checkpoints/step-NNNNNN (whole, then renamed into place):
        every process saves what it holds of the optimiser (under ZeRO, its partition), the main process
        the rest; every process waits for it."""
        root = self.out_dir / CHECKPOINTS
        final = root / f"step-{self.step:06d}"
        tmp = root / f".step-{self.step:06d}.tmp"
        main = self.processes.is_main
        self.processes.barrier()
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.processes.barrier()
        optimizer_state = self.processes.save_optimizer(tmp, self.optimizer)
        self.processes.barrier()
        if main:
            self.policy.save_adapter(tmp)
            state = {
                "version": STATE_VERSION,
                "spec": self.spec.to_json(),
                "step": self.step,
                "curve": self.curve,
                "baseline_validation_score": self.baseline_validation_score,
                "validation_score": self.validation_score,
                "wall_s": self.wall_s,
                "optimizer": optimizer_state,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            }
            torch.save(state, tmp / STATE_FILE)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            write_atomic(root / "latest", final.name.encode())
        self.processes.barrier()
        return final if main else None

    def latest_checkpoint(self) -> Path | None:
        root = self.out_dir / CHECKPOINTS
        done = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
        return done[-1] if done else None

    def resume(self) -> bool:
        """Load the last checkpoint, if any; True when one was loaded."""
        found = self.latest_checkpoint()
        if found is None:
            return False
        state = torch.load(found / STATE_FILE, map_location=self.policy.device, weights_only=False)
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"{found}: checkpoint version {state.get('version')}, expected {STATE_VERSION}")
        if GspoSpec.parse(state["spec"]) != self.spec:
            raise ValueError(f"{found}: the checkpoint was written by a run with another spec")
        self.policy.load_adapter_weights(found)
        self.processes.load_optimizer(found, self.optimizer, state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.step = int(state["step"])
        self.curve = list(state["curve"])
        self.baseline_validation_score = state["baseline_validation_score"]
        self.validation_score = state["validation_score"]
        self.wall_s = float(state["wall_s"])
        return True

    def report(self) -> dict[str, Any]:
        tokens = sum(p["tokens"] for p in self.curve)
        return {
            "kind": "gspo",
            "spec": self.spec.to_json(),
            "steps": self.step,
            "baseline_validation_score": self.baseline_validation_score,
            "final_validation_score": self.validation_score,
            "curve": self.curve,
            "loss": "fused" if self.fused else "torch",
            "cost": {
                "wall_s": round(self.wall_s, 3),
                "wall_s_per_step": round(self.wall_s / self.step, 3) if self.step else 0.0,
                "completion_tokens": tokens,
            },
        }
