"""The relevance gate's calibration (trainer/gate.py) and its use in the prompt path: a library's own
validation tasks keep their experiences, a family the library is not for gets none, as if it were empty."""

from __future__ import annotations

import pytest

from zoo.inference.defaults import ServingDefaults
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.trainer.baselines import lookup_library
from zoo.trainer.gate import calibrate
from zoo.trainer.prompting import PromptPath
from zoo.trainer.tasks import families
from zoo.trainer.tasks.loading import load_jsonl


class Counting:
    context_length = 8192

    def count_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) for m in messages)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def test_the_gate_keeps_the_library_for_its_tasks_and_from_others(embedder) -> None:
    library = lookup_library(load_jsonl(families.path("lengths", "train")), "m")
    validation = load_jsonl(families.path("lengths", "validation"))
    outside = load_jsonl(families.path("habitats", "test"))
    found = calibrate(library, embedder, validation, outside, margin=0.1)
    assert found.threshold == pytest.approx(min(found.inside) - 0.1, abs=1e-3)
    assert found.inside_kept == 1.0 and found.outside_gated == 1.0, found.to_json()
    assert max(found.outside) < found.threshold <= min(found.inside)
    loose = calibrate(library, embedder, validation, outside, margin=1.0)
    assert loose.outside_gated == 0.0  # a threshold far below every match gates nothing
    with pytest.raises(ValueError, match="validation"):
        calibrate(library, embedder, [], outside)


def test_the_prompt_path_leaves_unrelated_experiences_out(embedder) -> None:
    library = lookup_library(load_jsonl(families.path("lengths", "train")), "m").experiences
    lengths, habitat = (
        load_jsonl(families.path("lengths", "test"))[0],
        load_jsonl(families.path("habitats", "test"))[0],
    )
    gated = PromptPath(Counting(), embedder, ServingDefaults(), "m")
    open_ = PromptPath(Counting(), embedder, ServingDefaults(min_similarity=-1.0), "m")
    index = gated.index(library)
    assert len(gated.offered(lengths, library, index)) == 5
    assert gated.offered(habitat, library, index) == []
    messages, used = gated.messages(habitat, [])
    assert used == [] and len(messages) == 2  # the bare prompt, as with no library
    assert (
        len(open_.offered(habitat, library, open_.index(library))) == 5
    )  # the gate off: the top k regardless
