"""Multi-turn GSPO rollouts in the Nano environment: the training sequence is the conversation exactly as
the chat template renders it, the loss mask covers the model's own tokens and nothing else, and a GSPO
run on Nano episodes trains on the bundled model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir
from zoo.registry.errors import ValidationError
from zoo.trainer.envs import nano_repos
from zoo.trainer.envs.nano import NanoEnv
from zoo.trainer.envs.nano_episode import NanoLimits
from zoo.trainer.gspo.episodes import run_episode
from zoo.trainer.gspo.job import nano_tasks, run_gspo
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.rollouts import stack

LOOK = '<tool_call>{"name": "shell", "arguments": {"cmd": "grep -n split textstats/counting.py"}}</tool_call>'
FIX = (
    '<tool_call>{"name": "apply_patch", "arguments": {"path": "textstats/counting.py", '
    '"old_content": "text.split(\\" \\")", "new_content": "text.split()"}}</tool_call>'
)
DONE = "I replaced the split on a single space with split(), which splits on any run of whitespace."


@pytest.fixture(scope="module")
def model_path() -> Path:
    torch.set_num_threads(2)
    return prepare_bundled_chat_model(default_cache_dir()).path


@pytest.fixture(scope="module")
def tokenizer(model_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nano-repos")
    nano_repos.generate_task_repos(out)
    return out


def scripted(tokenizer, turns: list[str], *, close: bool = True, end: int | None = None):
    """A turn sampler that 'samples' the given texts (tokenized, then `end`, by default the end-of-turn
    token, unless `close` is False): a stand-in for the policy's randomness only; everything else is
    real."""
    eos = tokenizer.eos_token_id if end is None else end
    queue = list(turns)

    def sample(ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        out = tokenizer(queue.pop(0), add_special_tokens=False)["input_ids"]
        return [*out, eos] if close else out

    return sample


def test_sequence_is_the_rendered_conversation_and_the_mask_is_the_model_turns(
    tokenizer, repos: Path, tmp_path: Path
) -> None:
    task = next(t for t in nano_repos.shipped_tasks() if t.repo == "textstats")
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    eos = tokenizer.eos_token_id
    ep = run_episode(env, task, tokenizer, scripted(tokenizer, [LOOK, FIX, DONE]),
                     end_of_turn=eos, max_new_tokens=200, seed=0)  # fmt: skip
    assert ep.turns == 3 and ep.end_reason == "finished"
    assert ep.reward == pytest.approx(1.0)  # the clone's diff is the ground-truth patch
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                                "assistant"]  # fmt: skip
    # The ids are the conversation exactly as the template renders it (the last turn closed).
    rendered = tokenizer.apply_chat_template(ep.messages, tokenize=False)
    assert tokenizer.decode(ep.ids) == rendered.removesuffix("\n")
    # Masked-in ids are exactly the three turns the model produced, each with its end-of-turn token.
    model_ids = [i for i, m in zip(ep.ids, ep.model_mask, strict=True) if m]
    assert tokenizer.decode(model_ids) == f"{LOOK}<|im_end|>{FIX}<|im_end|>{DONE}<|im_end|>"
    # Tool output is in the sequence but not in the mask.
    other = tokenizer.decode([i for i, m in zip(ep.ids, ep.model_mask, strict=True) if not m])
    assert 'return len(text.split(" "))' in other  # the grep's output
    assert "<tool_response>" in other and "<tool_response>" not in tokenizer.decode(model_ids)
    assert ep.prompt_length == len(
        tokenizer.apply_chat_template(ep.messages[:2], add_generation_prompt=True)["input_ids"]
    )
    assert sum(ep.model_mask[: ep.prompt_length]) == 0
    # As a Rollouts row: the completion mask is the model mask after the prompt.
    rows = ep.as_rollouts()
    assert rows.completion_mask[0].tolist() == ep.model_mask[ep.prompt_length :]
    assert rows.attention_mask.all()


def test_a_turn_cut_at_its_token_limit_is_closed_outside_the_mask(
    tokenizer, repos: Path, tmp_path: Path
) -> None:
    task = nano_repos.shipped_tasks()[0]
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    eos = tokenizer.eos_token_id
    ep = run_episode(env, task, tokenizer, scripted(tokenizer, ["I am still thinking about"], close=False),
                     end_of_turn=eos, max_new_tokens=5, seed=0)  # fmt: skip
    assert ep.end_reason == "finished" and ep.reward == 0.0  # no tool call, no diff
    assert ep.ids[-1] == eos and ep.model_mask[-1] == 0  # closed for the model, not by it
    assert ep.model_tokens == len(
        tokenizer("I am still thinking about", add_special_tokens=False)["input_ids"]
    )


def test_a_turn_ended_by_another_eos_token_is_closed_after_it(tokenizer, repos: Path, tmp_path: Path) -> None:
    """Vocabularies with several end-of-sequence tokens: a turn that stops at one that is not the
    template's end-of-turn keeps it as a model token and gets the end-of-turn outside the mask; the
    conversation goes on."""
    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert other != tokenizer.eos_token_id
    task = nano_repos.shipped_tasks()[0]
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    eos = tokenizer.eos_token_id
    ep = run_episode(env, task, tokenizer, scripted(tokenizer, [LOOK, DONE], end=other), end_of_turn=eos,
                     max_new_tokens=200, seed=0)  # fmt: skip
    assert ep.turns == 2 and ep.end_reason == "finished"
    first_end = ep.ids.index(other)
    assert ep.model_mask[first_end] == 1  # the model's own token
    assert ep.ids[first_end + 1] == eos and ep.model_mask[first_end + 1] == 0  # closed for it


def test_max_turns_ends_an_episode(tokenizer, repos: Path, tmp_path: Path) -> None:
    task = nano_repos.shipped_tasks()[0]
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    eos = tokenizer.eos_token_id
    ep = run_episode(env, task, tokenizer, scripted(tokenizer, [LOOK, LOOK, LOOK]),
                     end_of_turn=eos, max_new_tokens=200, seed=0, max_turns=2)  # fmt: skip
    assert ep.turns == 2 and ep.end_reason == "max_turns"
    assert not env.episode.workdir.exists()  # the clone is removed when the episode ends


def test_episode_rows_stack_with_text_rollout_shapes(tokenizer, repos: Path, tmp_path: Path) -> None:
    task = nano_repos.shipped_tasks()[0]
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    eos = tokenizer.eos_token_id
    eps = [
        run_episode(env, task, tokenizer, scripted(tokenizer, turns), end_of_turn=eos,
                    max_new_tokens=200, seed=i)
        for i, turns in enumerate([[DONE], [LOOK, DONE]])
    ]  # fmt: skip
    batch = stack([e.as_rollouts() for e in eps], tokenizer.pad_token_id)
    assert batch.sequences.shape[0] == 2
    assert [int(m.sum()) for m in batch.completion_mask] == [e.model_tokens for e in eps]
    # The shorter episode is right-padded outside both masks.
    short = int(batch.attention_mask[0].sum())
    assert short == len(eps[0].ids) and batch.attention_mask[1].sum() == len(eps[1].ids)


def test_gspo_run_on_nano_episodes_end_to_end(model_path: Path, tmp_path: Path) -> None:
    spec = GspoSpec.parse({
        "environment": "nano", "train_limit": 1, "validation_limit": 1, "batch_size": 1, "group_size": 2,
        "max_new_tokens": 16, "max_turns": 2, "episode_token_budget": 2048, "shell_timeout_s": 5,
        "learning_rate": 1e-3, "lora_rank": 2, "target_modules": ["q_proj"], "num_iterations": 2,
        "temperature": 1.5,
    })  # fmt: skip
    out = tmp_path / "run"
    result = run_gspo(spec, model_path, out)
    report = json.loads(Path(result["report"]).read_text())
    assert result["steps"] == 1 and report["steps"] == 1
    point = report["curve"][0]
    assert point["groups"] == 1 and point["tokens"] > 0
    # Rewards are patch_similarity of each episode's diff: in [0, 1].
    assert 0.0 <= point["reward_mean"] <= 1.0
    assert report["baseline_validation_score"] is not None
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "nano-repos" / "textstats").is_dir()  # the shipped repositories, generated for the run


def test_nano_task_sources_are_checked(tmp_path: Path) -> None:
    own = tmp_path / "tasks.jsonl"
    own.write_text(json.dumps({"id": "x", "issue": "broken", "repo": "r", "buggy_ref": "main",
                               "patch": "not a diff", "test_command": "true"}) + "\n")  # fmt: skip
    with pytest.raises(ValidationError, match=r"spec\.nano_repos"):
        nano_tasks(GspoSpec.parse({"environment": "nano", "dataset": str(own)}), tmp_path)
    with pytest.raises(ValidationError, match="no such directory"):
        nano_tasks(GspoSpec.parse({"environment": "nano", "nano_repos": str(tmp_path / "nope")}), tmp_path)
    (tmp_path / "repos").mkdir()
    spec = GspoSpec.parse({"environment": "nano", "dataset": str(own), "nano_repos": str(tmp_path / "repos")})
    with pytest.raises(ValidationError, match=r"line 1 patch"):
        nano_tasks(spec, tmp_path)
    train, validation, repos = nano_tasks(GspoSpec.parse({"environment": "nano"}), tmp_path)
    assert len(train) + len(validation) == len(nano_repos.shipped_tasks()) and validation
    assert not {t.id for t in train} & {t.id for t in validation}
    assert repos == tmp_path / "nano-repos"


def test_policy_sampler_really_samples_a_turn(model_path: Path) -> None:
    from zoo.trainer.gspo.episodes import policy_sampler

    spec = GspoSpec.parse({"lora_rank": 2, "target_modules": ["q_proj"]})
    policy = LoraPolicy.load(model_path, spec)
    chat = [{"role": "user", "content": "Say hi."}]
    ids = policy.tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    sample = policy_sampler(policy, temperature=1.0, top_p=1.0)
    a, b = sample(list(ids), 8, 1), sample(list(ids), 8, 1)
    assert a == b and 0 < len(a) <= 8  # seeded
    greedy = policy_sampler(policy, temperature=1.0, top_p=1.0, greedy=True)(list(ids), 30, 0)
    assert greedy[-1] == policy.tokenizer.eos_token_id or len(greedy) == 30


def test_a_step_on_episodes_favours_the_episode_that_fixed_the_bug(
    model_path: Path, repos: Path, tmp_path: Path
) -> None:
    """Two scripted episodes of one task, one that fixes the bug (reward 1) and one that gives up (0):
    a GSPO step through GspoRun raises the fixing episode's mean log-prob over its own tokens and lowers
    the other's."""
    from zoo.trainer.gspo.episodes import EpisodeGroups
    from zoo.trainer.gspo.run import GspoRun

    spec = GspoSpec.parse({"environment": "nano", "group_size": 2, "num_iterations": 1, "learning_rate": 5e-3,
                           "lora_rank": 4, "target_modules": ["q_proj", "v_proj"]})  # fmt: skip
    torch.manual_seed(0)
    policy = LoraPolicy.load(model_path, spec)
    env = NanoEnv(repos, limits=NanoLimits(shell_timeout_s=10), work_root=tmp_path)
    groups = EpisodeGroups(policy, env, group_size=2, max_new_tokens=200, temperature=1.0, top_p=1.0, seed=0,
                           max_turns=4)  # fmt: skip
    groups._sampled = scripted(policy.tokenizer, [LOOK, FIX, DONE, DONE])  # episode 0 fixes, 1 gives up
    task = next(t for t in nano_repos.shipped_tasks() if t.repo == "textstats")
    run = GspoRun(spec, policy, [task], [], tmp_path / "out", episodes=groups)

    rows, rewards = groups.group(task, "probe")
    assert rewards == [pytest.approx(1.0), 0.0]

    def mean_logps() -> torch.Tensor:
        with torch.no_grad():
            logp = policy.token_logprobs(rows.sequences, rows.attention_mask, rows.prompt_length)
        return (logp * rows.completion_mask).sum(-1) / rows.completion_mask.sum(-1)

    before = mean_logps()
    groups._sampled = scripted(policy.tokenizer, [LOOK, FIX, DONE, DONE])  # the same two episodes again
    point = run.train_step(1, [task])
    assert point["updated"] and point["reward_mean"] == pytest.approx(0.5) and point["grad_norm"] > 0
    assert point["tokens"] == int(rows.completion_mask.sum())  # the model's tokens, not the tool output
    change = mean_logps() - before
    assert change[0] > 0 > change[1], change
