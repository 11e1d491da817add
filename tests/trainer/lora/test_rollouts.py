"""Sampling a LoRA policy's rollouts (trainer/lora/rollouts.py): where a completion ends, a random stream per
row, and a task's samples the same alone or beside other tasks in one `generate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.rollouts import RowStreams, completion_mask_of, generate
from zoo.trainer.lora.spec import LoraSpec
from zoo.trainer.tasks.schema import Task

SPEC = LoraSpec.parse({"target_modules": ["q_proj", "v_proj"], "lora_rank": 4})


@pytest.fixture(scope="module")
def model_path() -> Path:
    torch.set_num_threads(2)
    return prepare_bundled_chat_model(default_cache_dir()).path


def test_completion_mask_ends_at_the_first_eos() -> None:
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    assert completion_mask_of(ids, [2]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


@pytest.mark.numerics
def test_row_streams_sample_from_the_softmax_one_stream_per_row() -> None:
    """argmax(logits + the row's Gumbel noise) is a draw from softmax(logits); a row's draws follow its
    seed alone, whatever rows share the batch."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.log()  # the last token is impossible (-inf)
    rows = 4000
    picked = RowStreams(range(rows), "cpu")(None, logits.expand(rows, -1).clone()).argmax(-1)  # type: ignore[arg-type]
    freq = torch.bincount(picked, minlength=5).float() / rows
    assert torch.allclose(freq, probs, atol=0.03), freq  # 3 sd of a frequency of 0.5 over 4000 draws is 0.024
    assert freq[4] == 0
    alone = RowStreams([7], "cpu")
    in_batch = RowStreams([3, 7, 9], "cpu")
    for _ in range(3):  # step after step, row 7's noise is the same alone and beside other rows
        scores = torch.randn(3, 11)
        assert torch.equal(alone(None, scores[1:2].clone()), in_batch(None, scores.clone())[1:2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 rows to sample, 1 random streams"):
        RowStreams([1], "cpu")(None, torch.zeros(2, 5))  # type: ignore[arg-type]


@pytest.mark.numerics
def test_a_prompt_samples_the_same_completions_alone_or_in_a_batch(model_path: Path) -> None:
    """One `generate` for a whole batch: each task's group is what the task gets sampled on its own (the
    property that makes N processes sample what one does)."""
    policy = LoraPolicy.load(model_path, SPEC)
    short = Task(id="a", question="Hi.", answer="x")
    long = Task(id="b", question="Name three animals that live in the sea, and say why.", answer="x")
    options = {"group_size": 3, "max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95}
    both = generate(policy, [short, long], seeds=[11, 12], **options)
    alone = generate(policy, [long], seeds=[12], **options)
    assert both.completions[3:] == alone.completions
    assert len(set(both.completions[3:])) > 1, "one stream for the group's rows would repeat one completion"
    again = generate(policy, [short], seeds=[11], **options)
    assert both.completions[:3] == again.completions
    other = generate(policy, [short], seeds=[99], **options)
    assert other.completions != again.completions
    with pytest.raises(ValueError, match="2 tasks, 1 seeds"):
        generate(policy, [short, long], seeds=[1], **options)
