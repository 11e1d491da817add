"""Named LoRA adapters: found by name, installed whole, and served by the batcher beside the base model
(mixed in one batch), each row answering as that adapter alone would."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.lora import random_adapter
from zoo.inference.adapters import PLACEHOLDER, AdapterDirectory, AdapterLoadError, check_adapter_name
from zoo.inference.backend_protocol import GenerationRequest, generate
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.transformers_backend import TransformersBackend
from zoo.node.config import default_cache_dir
from zoo.registry.errors import NotFound, ValidationError

MSGS = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return prepare_bundled_chat_model(default_cache_dir()).path


@pytest.fixture(scope="module")
def adapters(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> AdapterDirectory:
    root = tmp_path_factory.mktemp("adapters")
    directory = AdapterDirectory(root)
    for name, seed in (("tuned", 1), ("other", 2)):
        directory.install(name, random_adapter(model_path, tmp_path_factory.mktemp(name), seed=seed))
    return directory


@pytest.fixture(scope="module")
def backend(model_path: Path) -> TransformersBackend:
    import torch

    torch.set_num_threads(2)
    return TransformersBackend.load(model_path, "HuggingFaceTB/SmolLM2-135M-Instruct", max_adapters=2)


def answer(backend: TransformersBackend, adapter=None, max_tokens: int = 12) -> str:
    return asyncio.run(
        generate(backend, GenerationRequest(MSGS, max_tokens=max_tokens, adapter=adapter))
    ).text


def together(backend: TransformersBackend, adapters: list, max_tokens: int = 12) -> list[str]:
    async def run() -> list[str]:
        requests = [GenerationRequest(MSGS, max_tokens=max_tokens, adapter=a) for a in adapters]
        return [r.text for r in await asyncio.gather(*(generate(backend, r) for r in requests))]

    return asyncio.run(run())


def test_directory_finds_validates_and_installs_whole(tmp_path: Path, adapters: AdapterDirectory) -> None:
    assert adapters.names() == ["other", "tuned"]
    ref = adapters.resolve("tuned")
    assert ref.path == adapters.root / "tuned" and ref.name == "tuned"
    with pytest.raises(NotFound, match=r"no adapter 'missing' .*known: other, tuned"):
        adapters.resolve("missing")
    for bad in ("", "../tuned", "a/b", ".hidden", "x" * 65):
        with pytest.raises(ValidationError, match="adapter"):
            adapters.resolve(bad)
        with pytest.raises(ValidationError):
            check_adapter_name(bad)
    # A directory that is not an adapter is refused and the target is left as it was.
    (tmp_path / "junk").mkdir()
    own = AdapterDirectory(tmp_path / "own")
    with pytest.raises(ValidationError, match="not a PEFT adapter"):
        own.install("x", tmp_path / "junk")
    assert own.names() == [] and not (tmp_path / "own" / "x").exists()
    # Reinstalling replaces the weights whole; no staging directory is left behind.
    own.install("x", adapters.root / "tuned")
    own.install("x", adapters.root / "other")
    assert (own.root / "x" / "adapter_model.safetensors").read_bytes() == (
        adapters.root / "other" / "adapter_model.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in own.root.iterdir()) == ["x"]


def test_adapter_changes_answers_and_matches_peft_alone(
    backend: TransformersBackend, adapters: AdapterDirectory, model_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = answer(backend)
    tuned = answer(backend, adapters.resolve("tuned"))
    assert tuned != base
    # The same answer as PEFT's own greedy decoding of base + adapter, in the backend's dtype.
    reference_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=backend.model.dtype)
    reference = PeftModel.from_pretrained(reference_model, str(adapters.root / "tuned")).eval()
    ids = backend.tokenizer.apply_chat_template(
        MSGS, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = reference.generate(**ids, max_new_tokens=12, do_sample=False)
    expected = backend.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert tuned == expected
    # The base model is untouched once adapters are loaded.
    assert answer(backend) == base


def test_mixed_batch_rows_answer_as_each_would_alone(
    backend: TransformersBackend, adapters: AdapterDirectory
) -> None:
    tuned, other = adapters.resolve("tuned"), adapters.resolve("other")
    alone = {None: answer(backend), "tuned": answer(backend, tuned), "other": answer(backend, other)}
    assert len(set(alone.values())) == 3
    mixed = together(backend, [None, tuned, other, None, tuned])
    assert mixed == [alone[None], alone["tuned"], alone["other"], alone[None], alone["tuned"]]


def test_replaced_weights_reload_and_the_limit_unloads_idle_adapters(
    backend: TransformersBackend, adapters: AdapterDirectory, tmp_path: Path
) -> None:
    own = AdapterDirectory(tmp_path / "own")
    own.install("swap", adapters.root / "tuned")
    before = answer(backend, own.resolve("swap"))
    own.install("swap", adapters.root / "other")
    after = answer(backend, own.resolve("swap"))
    assert before == answer(backend, adapters.resolve("tuned"))
    assert after == answer(backend, adapters.resolve("other"))
    # max_adapters=2: never more than two loaded, however many were used.
    assert len(backend.scheduler.adapters) <= 2
    # two, at most one retired still in use, and the placeholder PEFT wraps the model with
    assert len(backend.scheduler.adapters.peft.peft_config) <= 4


def test_an_adapter_that_does_not_fit_fails_alone(
    backend: TransformersBackend, adapters: AdapterDirectory, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(adapters.root / "tuned", broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    config["r"] = 7  # the weights say 4
    (broken / "adapter_config.json").write_text(json.dumps(config))
    base = answer(backend)
    with pytest.raises(AdapterLoadError, match="'broken' does not load"):
        answer(backend, AdapterDirectory(tmp_path).resolve("broken"))
    assert together(backend, [None, adapters.resolve("tuned")]) == [
        base,
        answer(backend, adapters.resolve("tuned")),
    ]


def test_a_broken_first_adapter_leaves_the_model_as_it_was(
    model_path: Path, adapters: AdapterDirectory, tmp_path: Path
) -> None:
    """The first adapter a backend loads wraps the model for PEFT; when it does not fit, nothing of it
    stays in the served model."""
    fresh = TransformersBackend.load(model_path, "HuggingFaceTB/SmolLM2-135M-Instruct")
    base = answer(fresh)
    broken = tmp_path / "broken"
    shutil.copytree(adapters.root / "tuned", broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    config["r"] = 7
    (broken / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterLoadError):
        answer(fresh, AdapterDirectory(tmp_path).resolve("broken"))
    assert answer(fresh) == base
    assert set(fresh.scheduler.adapters.peft.peft_config) == {PLACEHOLDER}  # nothing of it stayed
    assert answer(fresh, adapters.resolve("tuned")) != base  # and a good adapter still loads after it
    asyncio.run(fresh.close())
