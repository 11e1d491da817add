"""Supervised LoRA training on prompt/completion pairs: the loop every supervised kind (`sft`, `rft`,
`distill`) shares.

Per epoch the pairs are shuffled (seeded) and cut into batches of `batch_size`; a step is one AdamW
update on the batch's mean token loss: the negative log-likelihood of the completion's tokens (and the
end-of-turn token that closes it) after the prompt, the prompt itself not learned. Micro-batches of
`micro_batch_size` pairs accumulate into the step. Over N processes (processes.py, or DeepSpeed ZeRO in
zero.py, as GSPO uses them) every process takes every N-th pair of the batch and its share of the mean
is normalised by the whole batch's token count, so N processes make the update one process would.

The prompt is the node's bare prompt (the chat template with a generation prompt), tokenised as serving
tokenises it, so an adapter learns exactly the continuation the node will ask it for.

Runs are short (seconds to minutes on the bundled model), so they keep no mid-run checkpoint: an
interrupted run starts over, and its adapter is written only once it is complete.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zoo.registry.errors import ValidationError
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.lora.rollouts import generate
from zoo.trainer.lora.run import LoraRun, OnStep
from zoo.trainer.rewards import score_group
from zoo.trainer.schedule import batches, seed_of, total_steps
from zoo.trainer.sft.pairs import Pair
from zoo.trainer.sft.spec import SftSpec
from zoo.trainer.tasks.schema import Task

IGNORE = -100  # the label of a token that is not learned (the prompt, padding)


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    prompt_length: int  # ids[prompt_length:] are learned

    @property
    def learned(self) -> int:
        return len(self.ids) - self.prompt_length


def encode(tokenizer: Any, pair: Pair, max_length: int) -> Encoded:
    """The pair's tokens: the prompt as the chat template renders it for generation, then the completion
    and the end-of-turn token. A pair longer than `max_length` is an error, not silently cut."""
    prompt = tokenizer.apply_chat_template(pair.messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(pair.completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = [*prompt_ids, *completion_ids]
    if len(ids) > max_length:
        raise ValidationError(
            "spec.max_length", f"pair {pair.id!r} takes {len(ids)} tokens, more than max_length {max_length}"
        )
    return Encoded(ids, len(prompt_ids))


class SftRun(LoraRun):
    """One supervised run of `policy`'s adapters on `pairs`; `validation` tasks are scored (greedy, the
    bare prompt, the task's verifier) before and after."""

    def __init__(
        self,
        spec: SftSpec,
        policy: LoraPolicy,
        pairs: Sequence[Pair],
        validation: Sequence[Task],
        *,
        on_step: OnStep | None = None,
        processes: Processes | None = None,
    ) -> None:
        if not pairs:
            raise ValidationError("spec.dataset", "gives nothing to train on (no pairs)")
        self.pairs = list(pairs)
        # Encoded first: a pair over max_length is refused before any process prepares anything.
        self.encoded = {i: encode(policy.tokenizer, p, spec.max_length) for i, p in enumerate(self.pairs)}
        steps = total_steps(len(pairs), spec.batch_size, spec.epochs)
        super().__init__(spec, policy, validation, steps_total=steps, on_step=on_step, processes=processes)
        self.spec: SftSpec = spec

    # -- validation ------------------------------------------------------------------------------------

    def validation_scores(self, tasks: Sequence[Task], tag: str) -> list[float]:
        rows = generate(
            self.policy,
            tasks,
            group_size=1,
            max_new_tokens=self.spec.validation_max_tokens,
            temperature=1.0,
            top_p=1.0,
            seeds=[seed_of(tag, self.spec.seed, t.id) for t in tasks],
            instruction=self.spec.instruction,
            greedy=True,
        )
        return [r.score for task, completion in zip(tasks, rows.completions, strict=True)
                for r in score_group(self.reward_for(task), task, [completion])]  # fmt: skip

    # -- the optimisation ------------------------------------------------------------------------------

    def _micro_batch(self, items: Sequence[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, attention mask, labels), right-padded: labels are IGNORE on prompts and padding."""
        width = max(len(e.ids) for e in items)
        pad = self.policy.tokenizer.pad_token_id
        ids = torch.full((len(items), width), pad, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
        for row, e in enumerate(items):
            n = len(e.ids)
            ids[row, :n] = torch.tensor(e.ids)
            mask[row, :n] = 1
            labels[row, e.prompt_length : n] = ids[row, e.prompt_length : n]
        device = self.policy.device
        return ids.to(device), mask.to(device), labels.to(device)

    def _loss_sum(self, items: Sequence[Encoded]) -> torch.Tensor:
        """The summed negative log-likelihood of the learned tokens of `items`."""
        ids, mask, labels = self._micro_batch(items)
        autocast = torch.autocast(self.policy.device.type, dtype=torch.bfloat16)
        with autocast if self.spec.bf16 else contextlib.nullcontext():
            logits = self.policy.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        # The logits at position t predict token t + 1.
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]),
            labels[:, 1:].reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )

    def _padding_backward(self) -> None:
        """A backward of weight 0 through every trainable parameter (processes that must match backward for
        backward, under ZeRO-2, run these when they have fewer micro-batches than another)."""
        pad = self.policy.tokenizer.pad_token_id
        ids = torch.full((1, 2), pad, device=self.policy.device)
        self.processes.backward(self.policy.model(input_ids=ids, use_cache=False).logits.sum() * 0.0)

    def optimise(self, batch: Sequence[int]) -> dict[str, float]:
        """One update on the batch (pair indices): every process its share, normalised by the batch's
        learned tokens; returns the batch's mean token loss and the gradient norm before clipping."""
        spec = self.spec
        total_tokens = sum(self.encoded[i].learned for i in batch)
        mine = [self.encoded[i] for i in self.processes.shard(list(batch))]
        size = spec.micro_batch_size
        parts = [mine[i : i + size] for i in range(0, len(mine), size)]
        backwards = len(parts)
        if self.processes.pads_micro_batches:
            backwards = max(self.processes.gather([len(parts)]))
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for part in parts:
            loss = self._loss_sum(part)
            loss_sum += float(loss.detach())
            self.processes.backward(loss / total_tokens)
        for _ in range(backwards - len(parts)):
            self._padding_backward()
        norm = self.processes.update(self.optimizer, self.policy.trainable_parameters(), spec.max_grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        summed = self.processes.sum_values({"loss_sum": loss_sum})
        return {"loss": summed["loss_sum"] / total_tokens, "grad_norm": norm}

    def run(self) -> None:
        started = time.perf_counter()
        self.baseline_validation_score = self.evaluate("before")
        indices = list(range(len(self.pairs)))
        for epoch in range(1, self.spec.epochs + 1):
            for batch in batches(indices, self.spec.batch_size, self.spec.seed, epoch):
                step_started = time.perf_counter()
                metrics = self.optimise(batch)
                self.step += 1
                point = {
                    "epoch": epoch,
                    "step": self.step,
                    "steps_total": self.steps_total,
                    "pairs": len(batch),
                    "loss": round(metrics["loss"], 6),
                    "grad_norm": round(metrics["grad_norm"], 6),
                    "wall_s": round(time.perf_counter() - step_started, 3),
                }
                self.curve.append(point)
                self.notify(point)
        self.validation_score = self.evaluate("after")
        self.wall_s = time.perf_counter() - started

    def report(self) -> dict[str, Any]:
        by_source: dict[str, int] = {}
        for p in self.pairs:
            by_source[p.source] = by_source.get(p.source, 0) + 1
        return {
            "kind": self.spec.kind,
            "spec": self.spec.to_json(),
            "pairs": by_source,
            "steps": self.step,
            "curve": self.curve,
            "baseline_validation_score": self.baseline_validation_score,
            "validation_score": self.validation_score,
            "wall_s": round(self.wall_s, 3),
            "processes": self.processes.world,
        }
