"""A LoRA policy's rollouts (GSPO's groups; rft's and distill's samples, and the greedy validation answers
of every LoRA run): G sampled completions per prompt, every prompt of a batch in one `generate`, and the
masks the loss needs.

Every row samples from a random stream of its own, seeded by (its prompt's seed, its index in the group):
its next token is the argmax of its logits plus Gumbel noise drawn from its own generator, which is exactly
a draw from softmax(logits) (the Gumbel-max trick) and needs no shared random state. So what a row gets
does not depend on which other prompts share its batch or process (up to float rounding of the batched
forward): one process and N processes sharing a batch sample the same completions, and a process
generates its whole share of the batch in one call. Prompts are left-padded to one length so every
completion starts at the same column; a completion counts up to and including its first end-of-sequence
token, and what follows it is masked out. The chat template and the task's instruction are those TF-GRPO
and serving use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.prompting import bare_messages
from zoo.trainer.schedule import seed_of
from zoo.trainer.tasks.schema import Task


@dataclass
class Rollouts:
    """Completions of a batch of prompts, group after group (row i belongs to prompt i // group_size)."""

    sequences: torch.Tensor  # (N, P + T) prompt and completion ids
    attention_mask: torch.Tensor  # (N, P + T)
    prompt_length: int  # P
    completion_mask: torch.Tensor  # (N, T) 1 on the completion's own tokens
    completions: list[str]

    @property
    def tokens(self) -> int:
        return int(self.completion_mask.sum())

    def rows(self, index: slice) -> Rollouts:
        return Rollouts(
            self.sequences[index],
            self.attention_mask[index],
            self.prompt_length,
            self.completion_mask[index],
            self.completions[index],
        )


def completion_mask_of(completion_ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """1 up to and including each row's first end-of-sequence token, 0 after it."""
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    # Tokens strictly after the first eos: an eos occurred at an earlier position.
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~after).long()


def eos_ids_of(policy: LoraPolicy) -> list[int]:
    config = policy.model.get_base_model().generation_config
    eos = config.eos_token_id if config is not None else None
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if policy.tokenizer.eos_token_id is not None:
        ids.append(policy.tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


class RowStreams(LogitsProcessor):
    """Sampling with a random stream per row: adds Gumbel noise (-log E, E ~ Exp(1)) from row i's own
    generator to row i's logits, so that greedy decoding of the result samples from softmax(logits).

    transformers samples every row from one generator (`torch.multinomial` over the batch), which ties a
    row's draws to the rows beside it; hence this processor. It runs after temperature and top-p, as the
    last processor; every row draws once per decoding step, finished or not, so the draws of a row follow
    its own step count alone.
    """

    def __init__(self, seeds: Sequence[int], device: torch.device | str) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"{scores.shape[0]} rows to sample, {len(self.generators)} random streams")
        vocab = scores.shape[-1]
        noise = torch.stack([
            torch.empty(vocab, device=scores.device, dtype=torch.float32).exponential_(generator=g)
            for g in self.generators
        ])  # fmt: skip
        # E can round to 0 in float32; the clamp keeps such a token's noise finite (very large, as it should).
        return scores.float() - noise.clamp_min(torch.finfo(torch.float32).tiny).log()


@torch.no_grad()
def policy_generate(
    policy: LoraPolicy,
    inputs: Any,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seeds: Sequence[int] | None,
) -> torch.Tensor:
    """The policy's `generate` in eval mode (its train/eval mode restored after): greedy when `seeds` is
    None, else sampled from the whole distribution (no top-k) at `temperature` and `top_p`, row i drawing
    from a stream seeded by seeds[i]."""
    processors = LogitsProcessorList()
    if seeds is not None:
        if temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
        processors.append(RowStreams(seeds, policy.device))
    was_training = policy.model.training
    policy.model.eval()
    try:
        return policy.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            pad_token_id=policy.tokenizer.pad_token_id,
            do_sample=False,  # the argmax of the noised logits when sampling (RowStreams)
            logits_processor=processors,
        )
    finally:
        policy.model.train(was_training)


@torch.no_grad()
def generate(
    policy: LoraPolicy,
    tasks: Sequence[Task],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seeds: Sequence[int],
    instruction: str | None = None,
    greedy: bool = False,
    chats: Sequence[list[dict[str, str]]] | None = None,
) -> Rollouts:
    """`group_size` completions of every task (greedy: one each, group_size ignored) in one `generate`,
    the j-th completion of task i sampled from a stream seeded by (seeds[i], j). Each task is asked with
    its bare prompt, or with `chats[i]` (a prompt with experiences in it) when given."""
    if len(seeds) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks, {len(seeds)} seeds")
    tokenizer = policy.tokenizer
    if chats is None:
        chats = [bare_messages(t, instruction) for t in tasks]
    elif len(chats) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks, {len(chats)} prompts")
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
    prompt_length = int(encoded["input_ids"].shape[1])
    n = 1 if greedy else group_size
    # Each prompt's row n times (transformers' num_return_sequences is for its own sampling only).
    rows = {key: value.repeat_interleave(n, dim=0) for key, value in encoded.items()}
    sequences = policy_generate(
        policy, rows, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        seeds=None if greedy else [seed_of(s, j) for s in seeds for j in range(n)],
    )  # fmt: skip
    completion_ids = sequences[:, prompt_length:]
    if completion_ids.shape[1] == 0:  # nothing generated at all (max_new_tokens reached at once)
        raise RuntimeError("generation produced no tokens")
    mask = completion_mask_of(completion_ids, eos_ids_of(policy))
    attention_mask = torch.cat([rows["attention_mask"], mask], dim=1)
    completions = [
        tokenizer.decode(row[: int(m.sum())], skip_special_tokens=True)
        for row, m in zip(completion_ids, mask, strict=True)
    ]
    return Rollouts(sequences, attention_mask, prompt_length, mask, completions)


def stack(groups: Sequence[Rollouts], pad_id: int) -> Rollouts:
    """One batch of several prompts' rollouts: prompts left-padded to the longest, completions right-padded
    to the longest (padding masked out everywhere)."""
    if not groups:
        raise ValueError("no rollouts to stack")
    p_max = max(g.prompt_length for g in groups)
    t_max = max(g.completion_mask.shape[1] for g in groups)
    sequences, attention, completion = [], [], []
    for g in groups:
        left, right = p_max - g.prompt_length, t_max - g.completion_mask.shape[1]
        rows = g.sequences.shape[0]
        pad = g.sequences.new_full
        sequences.append(torch.cat([pad((rows, left), pad_id), g.sequences, pad((rows, right), pad_id)], 1))
        zeros = g.attention_mask.new_zeros
        attention.append(torch.cat([zeros((rows, left)), g.attention_mask, zeros((rows, right))], 1))
        completion.append(torch.cat([g.completion_mask, g.completion_mask.new_zeros((rows, right))], 1))
    completions = [c for g in groups for c in g.completions]
    return Rollouts(torch.cat(sequences), torch.cat(attention), p_max, torch.cat(completion), completions)
