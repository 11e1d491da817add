"""Multi-turn GSPO rollouts: a policy works through environment episodes (the Nano coding environment),
and each episode becomes one training sequence whose loss mask covers the model's own tokens only.

An episode alternates model turns and environment messages. The sequence is built token by token as it
happens: the opening prompt (chat template, generation prompt), then each model turn as the exact ids
that were sampled, then the environment's answer as the template renders it up to the next generation
prompt. Only sampled ids carry mask 1: prompts, tool output, warnings and the template's own tokens
between turns carry 0, so the sequence-level ratio and the loss see what the model chose and nothing
else. A turn that ran out of tokens before its end-of-turn token is closed with one (mask 0), so the
conversation stays well formed.

The reward is the environment's (for Nano: patch_similarity of the clone's `git diff` against the
ground-truth patch), taken when the episode ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from zoo.registry.errors import ZooError
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.rollouts import Rollouts, eos_ids_of, policy_generate, stack
from zoo.trainer.schedule import seed_of

# (conversation ids so far, max new tokens, seed) -> the sampled ids of one model turn
TurnSampler = Callable[[list[int], int, int], list[int]]


class Environment(Protocol):
    """What an episode needs from an environment (NanoEnv is one)."""

    def reset(self, task: Any) -> Sequence[Any]: ...  # opening messages, each with .chat()

    def step(self, assistant_message: str) -> Any: ...  # .messages, .done, .end_reason

    def reward(self) -> Any: ...  # .score

    def close(self) -> None: ...


class EpisodeFormatError(ZooError, RuntimeError):
    """The chat template re-renders the conversation differently from the tokens already in it."""


@dataclass
class EpisodeRollout:
    ids: list[int]  # the whole conversation
    model_mask: list[int]  # 1 on the ids the model sampled
    prompt_length: int  # ids before the first model turn
    messages: list[dict[str, str]]
    turns: int
    end_reason: str | None
    reward: float

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    def as_rollouts(self, device: torch.device | str = "cpu") -> Rollouts:
        """One row of Rollouts: the completion is everything after the opening prompt, masked to the
        model's tokens; the attention covers every token (the model saw the tool output)."""
        sequence = torch.tensor([self.ids], dtype=torch.long, device=device)
        completion = torch.tensor([self.model_mask[self.prompt_length :]], dtype=torch.long, device=device)
        text = "\n".join(m["content"] for m in self.messages if m["role"] == "assistant")
        return Rollouts(sequence, torch.ones_like(sequence), self.prompt_length, completion, [text])


def policy_sampler(
    policy: LoraPolicy, *, temperature: float, top_p: float, greedy: bool = False
) -> TurnSampler:
    """Sample one turn with the policy's `generate` (top_k off: the whole distribution), stopping at its
    end-of-sequence tokens."""
    eos = set(eos_ids_of(policy))

    def sample(ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        prompt = torch.tensor([ids], dtype=torch.long, device=policy.device)
        inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
        out = policy_generate(
            policy, inputs, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            seeds=None if greedy else [seed],
        )  # fmt: skip
        new = out[0, len(ids) :].tolist()
        for i, token in enumerate(new):
            if token in eos:
                return new[: i + 1]
        return new

    return sample


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def run_episode(
    env: Environment,
    task: Any,
    tokenizer: Any,
    sample_turn: TurnSampler,
    *,
    end_of_turn: int,
    max_new_tokens: int,
    seed: int,
    max_turns: int = 64,
) -> EpisodeRollout:
    """Play one episode of `task` to its end; the environment is closed afterwards."""
    try:
        messages = [m.chat() for m in env.reset(task)]
        ids = _encode(tokenizer, _render(tokenizer, messages))
        mask = [0] * len(ids)
        prompt_length = len(ids)
        turns, end_reason = 0, None
        while True:
            new = sample_turn(ids, max_new_tokens, seed_of(seed, "turn", turns))
            turns += 1
            # Only the template's end-of-turn token closes a turn; another end-of-sequence token the
            # model stopped at (<|endoftext|> in some vocabularies) is its own, and the turn is closed
            # after it.
            closed = bool(new) and new[-1] == end_of_turn
            # Special tokens the model wrote inside its turn stay in its message, so that the template
            # re-renders exactly the ids it sampled.
            turn = new[:-1] if closed else new
            text = tokenizer.decode(turn, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            ids += new
            mask += [1] * len(new)
            if not closed:  # out of tokens, or stopped at another eos: end the turn for it (mask 0)
                ids.append(end_of_turn)
                mask.append(0)
            messages.append({"role": "assistant", "content": text})
            result = env.step(text)
            if result.done or turns >= max_turns:
                end_reason = result.end_reason if result.done else "max_turns"
                break
            messages += [m.chat() for m in result.messages]
            rendered = _render(tokenizer, messages)
            seen = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if not rendered.startswith(seen):
                raise EpisodeFormatError(
                    "the chat template does not extend the conversation's tokens (after turn "
                    f"{turns}: expected the rendering to start with {seen[-80:]!r})"
                )
            answer = _encode(tokenizer, rendered[len(seen) :])
            ids += answer
            mask += [0] * len(answer)
        reward = float(env.reward().score)
    finally:
        env.close()
    return EpisodeRollout(ids, mask, prompt_length, messages, turns, end_reason, reward)


def end_of_turn_id(policy: LoraPolicy) -> int:
    """The token that ends an assistant turn in the chat template (the tokenizer's eos: <|im_end|> for
    ChatML models such as SmolLM2)."""
    token = policy.tokenizer.eos_token_id
    if token is None:
        raise ValueError("the tokenizer has no end-of-sequence token to end a turn with")
    return int(token)


class EpisodeGroups:
    """A task's group: G episodes (one greedy episode for validation), each seeded by (tag, run seed,
    task, index), played one after another in one environment."""

    def __init__(
        self,
        policy: LoraPolicy,
        env: Environment,
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        max_turns: int,
    ) -> None:
        self.policy = policy
        self.env = env
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.max_turns = max_turns
        self.end_of_turn = end_of_turn_id(policy)
        self._sampled = policy_sampler(policy, temperature=temperature, top_p=top_p)
        self._greedy = policy_sampler(policy, temperature=1.0, top_p=1.0, greedy=True)
        self.last: list[EpisodeRollout] = []  # the episodes of the latest group, for inspection

    def group(self, task: Any, tag: str, *, greedy: bool = False) -> tuple[Rollouts, list[float]]:
        episodes = [
            run_episode(
                self.env,
                task,
                self.policy.tokenizer,
                self._greedy if greedy else self._sampled,
                end_of_turn=self.end_of_turn,
                max_new_tokens=self.max_new_tokens,
                seed=seed_of(tag, self.seed, task.id, i),
                max_turns=self.max_turns,
            )
            for i in range(1 if greedy else self.group_size)
        ]
        self.last = episodes
        rows = stack(
            [e.as_rollouts(self.policy.device) for e in episodes], self.policy.tokenizer.pad_token_id
        )
        return rows, [e.reward for e in episodes]
