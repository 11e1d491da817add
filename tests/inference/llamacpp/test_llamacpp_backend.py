"""The llama.cpp backend on the bundled GGUF: the prompt tokens transformers would give, continuous batching
where a row answers as it would alone, per-request sampling, stops, limits and cancellation, reuse of a
cached prompt prefix, grammar-constrained JSON, expert factors and LoRA adapters converted from PEFT."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by ./zoo setup; its build failed here")
from tests.inference.near_ties import disagreement
from tests.lora import random_adapter
from zoo.inference.adapters import AdapterDirectory, AdapterLoadError
from zoo.inference.backend_protocol import GenerationRequest, ResponseFormat, generate
from zoo.inference.bundled_models import bundled_gguf, prepare_bundled_chat_model
from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend
from zoo.inference.llamacpp.scheduler import sample
from zoo.node.config import default_cache_dir
from zoo.registry.errors import ValidationError

pytestmark = pytest.mark.numerics

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Name a prime number.",
    "Write a haiku about rust.",
    "What is 7 times 8?",
    "List three colors and say why each one is pretty.",
    "Give me a word that rhymes with cat.",
]
CONVERTER = default_cache_dir() / "llama.cpp"


def msgs(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return prepare_bundled_chat_model(default_cache_dir()).path


@pytest.fixture(scope="module")
def backend(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaCppBackend:
    from importlib.metadata import version

    b = LlamaCppBackend.load(
        bundled_gguf(),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        max_batch_size=8,
        context_length=1024,
        threads=2,
        adapters_cache=tmp_path_factory.mktemp("gguf-adapters"),
        converter_dir=CONVERTER / version("llama_cpp_python"),
        base_weights=hf_dir,
        max_adapters=2,
    )
    yield b
    asyncio.run(b.close())


def run(backend: LlamaCppBackend, request: GenerationRequest):
    return asyncio.run(generate(backend, request))


def together(backend: LlamaCppBackend, requests: list[GenerationRequest]) -> list:
    async def go() -> list:
        return list(await asyncio.gather(*(generate(backend, r) for r in requests)))

    return asyncio.run(go())


def wait_idle(backend: LlamaCppBackend) -> None:
    deadline = time.monotonic() + 5
    while backend.scheduler.stats.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.scheduler.stats.running == 0


def test_prompt_tokens_and_text_match_the_transformers_tokenizer(
    backend: LlamaCppBackend, hf_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    conversations = [
        msgs("hi"),
        [{"role": "system", "content": "Be terse."}, *msgs("naïve café — ✓ 東京 🙂?")],
        [*msgs("2+2?"), {"role": "assistant", "content": "4"}, *msgs("and <b>3+3</b>?\n\n  spaced")],
    ]
    for messages in conversations:
        expected = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
        assert backend.gguf.encode_chat(messages) == list(expected)
        assert backend.count_prompt_tokens(messages) == len(expected)
    text = "naïve café — ✓ 東京 🙂 done"
    ids = tok.encode(text)
    assert backend.gguf.tokenize(text) == ids
    assert backend.gguf.decode(ids) == tok.decode(ids, skip_special_tokens=True) == text


def test_greedy_rows_in_a_batch_answer_as_alone_but_for_near_ties(backend: LlamaCppBackend) -> None:
    """llama.cpp's kernels are not batch-invariant (several sequences' rows take other paths than one's),
    so a row inside a batch computes log-probabilities a little off its lone ones and may part from its
    lone answer at a near-tie (tests/inference/near_ties.py: the measured bound). Rows given one another's
    logits or caches would be off by far more at their first token."""
    alone = [run(backend, GenerationRequest(msgs(p), max_tokens=24, logprobs=2)) for p in PROMPTS]
    stats = backend.scheduler.stats
    steps, tokens = stats.steps, stats.tokens
    batched = together(backend, [GenerationRequest(msgs(p), max_tokens=24, logprobs=2) for p in PROMPTS])
    for a, b in zip(alone, batched, strict=True):
        assert disagreement(a, b) is None, (disagreement(a, b), a.text, b.text)
    assert len({a.text for a in alone}) == len(alone)
    assert (stats.tokens - tokens) / (stats.steps - steps) >= 2  # they did decode together
    wait_idle(backend)


def test_more_requests_than_slots_wait_and_all_finish(backend: LlamaCppBackend) -> None:
    results = together(
        backend, [GenerationRequest(msgs(f"Say the number {i}."), max_tokens=5) for i in range(20)]
    )
    assert all(r.completion_tokens > 0 and r.finish_reason in ("stop", "length") for r in results)
    assert backend.scheduler.stats.last_batch <= 8
    wait_idle(backend)


def test_seeded_sampling_repeats_and_seeds_differ(backend: LlamaCppBackend) -> None:
    def req(seed: int) -> GenerationRequest:
        return GenerationRequest(
            msgs("Tell me a story."), max_tokens=20, temperature=0.9, top_p=0.95, seed=seed
        )

    first = run(backend, req(7)).text
    assert run(backend, req(7)).text == first  # the same draws from the same seed and logits
    others = together(backend, [req(8), req(9), GenerationRequest(msgs(PROMPTS[0]), max_tokens=20)])
    assert len({first, others[0].text, others[1].text}) > 1


def test_sampling_follows_temperature_and_nucleus() -> None:
    import numpy as np

    scores = np.array([5.0, 4.0, 0.0, -3.0], dtype=np.float32)
    assert sample(scores, 0.0, 1.0, None) == 0
    rng = np.random.Generator(np.random.PCG64(0))
    # top_p = 0.5: only the best token is in the nucleus (its probability alone is 0.72).
    assert {sample(scores, 1.0, 0.5, rng) for _ in range(200)} == {0}
    draws = [sample(scores, 1.0, 1.0, rng) for _ in range(4000)]
    p = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    observed = np.bincount(draws, minlength=4) / len(draws)
    assert np.allclose(observed, p, atol=0.03)


def test_stop_strings_token_limits_and_cancellation(backend: LlamaCppBackend) -> None:
    full = run(backend, GenerationRequest(msgs("Count from 1 to 20, comma separated."), max_tokens=60)).text
    assert "5" in full
    cut = run(
        backend, GenerationRequest(msgs("Count from 1 to 20, comma separated."), max_tokens=60, stop=["5"])
    )
    assert cut.finish_reason == "stop" and cut.text == full[: full.index("5")]
    short = run(backend, GenerationRequest(msgs(PROMPTS[4]), max_tokens=3))
    assert short.finish_reason == "length" and short.completion_tokens == 3

    async def cancelled() -> tuple[str, int]:
        request = GenerationRequest(msgs("Write a long story about a dragon."), max_tokens=400)
        pieces = 0
        async for chunk in backend.stream(request):
            if chunk.result is not None:
                return chunk.result.finish_reason, chunk.result.completion_tokens
            pieces += 1
            if pieces == 3:
                request.cancel.set()
        raise AssertionError("no result")

    reason, tokens = asyncio.run(cancelled())
    assert reason == "cancelled" and tokens < 20
    wait_idle(backend)


def test_a_cached_prompt_prefix_is_reused_and_the_answer_is_unchanged(backend: LlamaCppBackend) -> None:
    question = msgs("Describe the water cycle in one sentence. " * 8)
    first = run(backend, GenerationRequest(question, max_tokens=16))
    before = backend.scheduler.reused_tokens
    again = run(backend, GenerationRequest(question, max_tokens=16))
    assert again.text == first.text
    assert backend.scheduler.reused_tokens - before >= first.prompt_tokens - 1
    # A prompt sharing only the start reuses only the start.
    before = backend.scheduler.reused_tokens
    other = question[:-1] + msgs("Describe the water cycle in one sentence. " * 4 + "Now in French.")
    run(backend, GenerationRequest(other, max_tokens=4))
    gained = backend.scheduler.reused_tokens - before
    assert 0 < gained < first.prompt_tokens


def test_a_group_sharing_one_prompt_prefills_it_once(backend: LlamaCppBackend) -> None:
    question = msgs("Explain how a rainbow forms, step by step, for a curious child. " * 4)
    alone = run(backend, GenerationRequest(question, max_tokens=12, logprobs=2))
    wait_idle(backend)
    # Fill every slot's cache with something else, so nothing of the question is left to reuse.
    together(backend, [GenerationRequest(msgs(f"Say {i}."), max_tokens=2) for i in range(8)])
    before = backend.scheduler.reused_tokens
    group = together(backend, [GenerationRequest(question, max_tokens=12, logprobs=2) for _ in range(5)])
    prompt = group[0].prompt_tokens
    # Every copy of the one cache answers as that cache alone did, as far as the batch's arithmetic allows
    # (five rows decoded together compute apart: tests/inference/near_ties.py), and as each other do.
    for copy in group:
        assert disagreement(alone, copy) is None, (disagreement(alone, copy), alone.text, copy.text)
        assert disagreement(group[0], copy) is None, (disagreement(group[0], copy), group[0].text, copy.text)
    # One prefill; the four others copy its cache (all but the prompt's last token, which each feeds).
    assert backend.scheduler.reused_tokens - before >= 4 * (prompt - 1)


def test_json_schema_answers_always_parse_and_validate(backend: LlamaCppBackend) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = ResponseFormat("json_schema", json.dumps(schema))
    results = together(
        backend,
        [GenerationRequest(msgs(p), max_tokens=60, response_format=fmt) for p in PROMPTS[:4]]
        + [GenerationRequest(msgs(PROMPTS[0]), max_tokens=24)],  # an unconstrained row beside them
    )
    for r in results[:4]:
        data = json.loads(r.text)
        assert set(data) == {"name", "age"} and 0 <= data["age"] <= 120 and len(data["name"]) <= 20
    assert not results[4].text.lstrip().startswith("{")
    with pytest.raises(ValidationError, match=r"response_format\.json_schema"):
        backend.constraint(
            ResponseFormat("json_schema", json.dumps({"type": "object", "minProperties": "x"}))
        )


def test_expert_factors_bias_the_row_that_carries_them(backend: LlamaCppBackend) -> None:
    import torch

    from zoo.inference.factors import ExpertFactorLogitsProcessor

    target = backend.gguf.tokenize(" Banana")[0]
    bias = torch.zeros(backend.gguf.n_vocab)
    bias[target] = 100.0
    plain = GenerationRequest(msgs(PROMPTS[1]), max_tokens=3)
    biased = GenerationRequest(
        msgs(PROMPTS[1]), max_tokens=3, logits_processor=ExpertFactorLogitsProcessor(bias)
    )
    a, b = together(backend, [plain, biased])
    assert b.text.strip() == backend.gguf.decode([target] * 3).strip()
    assert a.text == run(backend, GenerationRequest(msgs(PROMPTS[1]), max_tokens=3)).text


def test_factors_distilled_on_the_gguf_vocabulary_apply_under_the_transformers_tokenizer(
    backend: LlamaCppBackend, hf_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from zoo.inference.factors import tokenizer_tag, tokenizers_match
    from zoo.trainer.tfgrpo.distill import distill_factors

    assert tokenizers_match(tokenizer_tag(backend.gguf), tokenizer_tag(AutoTokenizer.from_pretrained(hf_dir)))
    assert set(backend.gguf.all_special_ids) >= {0, 1, 2}
    factors = distill_factors(["The answer is 100 cm.", "100 cm"], [1.0, -1.0], backend.gguf)
    assert factors is not None and tokenizers_match(factors.tokenizer, tokenizer_tag(backend.gguf))


def test_adapters_convert_once_change_answers_and_mix_with_the_base(
    backend: LlamaCppBackend, hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = AdapterDirectory(tmp_path_factory.mktemp("adapters"))
    for name, seed in (("tuned", 1), ("other", 2), ("third", 3)):
        directory.install(name, random_adapter(hf_dir, tmp_path_factory.mktemp(name), seed=seed))
    q = msgs("Name three colours of the rainbow.")

    def req(name: str | None) -> GenerationRequest:
        return GenerationRequest(q, max_tokens=12, adapter=directory.resolve(name) if name else None)

    alone = {n: run(backend, req(n)).text for n in (None, "tuned", "other")}
    assert len(set(alone.values())) == 3
    converted = sorted(backend.scheduler.adapters.cache_dir.glob("*.gguf"))
    assert len(converted) == 2
    stamps = [p.stat().st_mtime_ns for p in converted]
    mixed = together(backend, [req(None), req("tuned"), req("other"), req(None), req("tuned")])
    assert [r.text for r in mixed] == [
        alone[None],
        alone["tuned"],
        alone["other"],
        alone[None],
        alone["tuned"],
    ]
    # A third adapter with a limit of two: an idle one is freed, and using it again reloads its GGUF
    # without converting it again.
    run(backend, req("third"))
    assert len(backend.scheduler.adapters._loaded) <= 2
    assert run(backend, req("tuned")).text == alone["tuned"]
    assert [p.stat().st_mtime_ns for p in converted] == stamps
    # A file that is not an adapter of this model fails its own request only.
    broken = tmp_path_factory.mktemp("broken")
    (broken / "adapter_config.json").write_text("{}")
    (broken / "adapter_model.safetensors").write_bytes(b"not weights")
    AdapterDirectory(directory.root).install("broken", broken)
    with pytest.raises(AdapterLoadError, match="broken"):
        run(backend, req("broken"))
    assert run(backend, req(None)).text == alone[None]
    wait_idle(backend)


def test_a_priority_request_decodes_alone_while_the_others_wait(backend: LlamaCppBackend) -> None:
    others = [GenerationRequest(msgs(p), max_tokens=40) for p in PROMPTS[:3]]
    expected = [run(backend, GenerationRequest(msgs(p), max_tokens=40)).text for p in PROMPTS[:3]]
    urgent = GenerationRequest(msgs(PROMPTS[3]), max_tokens=16, priority=True)
    sizes: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            sizes.append(backend.scheduler.stats.last_batch)
            time.sleep(0.002)

    async def go() -> list:
        tasks = [asyncio.create_task(generate(backend, r)) for r in others]
        await asyncio.sleep(0.15)
        result = await generate(backend, urgent)
        return [result, *await asyncio.gather(*tasks)]

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = asyncio.run(go())
    finally:
        stop.set()
        watcher.join()
    assert 1 in sizes and 3 in sizes  # the urgent row decoded alone, the others together
    assert [r.text for r in results[1:]] == expected  # and they resumed exactly


def test_a_prompt_beyond_the_request_context_is_refused(backend: LlamaCppBackend) -> None:
    with pytest.raises(ValueError, match="context"):
        run(backend, GenerationRequest(msgs("word " * 1200), max_tokens=4))
    assert run(backend, GenerationRequest(msgs("hi"), max_tokens=2)).completion_tokens > 0


def test_a_q8_0_kv_cache_answers_and_takes_about_half_the_memory() -> None:
    import subprocess
    import sys

    code = """
import asyncio, sys
from zoo.inference.backend_protocol import GenerationRequest, generate
from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend
from zoo.inference.bundled_models import bundled_gguf

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
before = rss()
b = LlamaCppBackend.load(bundled_gguf(), "m", max_batch_size=16, context_length=2048, threads=1,
                         kv_cache_type=sys.argv[1])
grown = rss() - before
ask = GenerationRequest([{"role": "user", "content": "Name a prime number."}], max_tokens=8)
r = asyncio.run(generate(b, ask))
print(grown, r.completion_tokens)
"""

    def grown(kind: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", code, kind], capture_output=True, text=True, check=True)
        size, tokens = out.stdout.split()
        return int(size), int(tokens)

    f16, f16_tokens = grown("f16")
    q8, q8_tokens = grown("q8_0")
    kv_f16 = 16 * 2048 * 30 * 2 * 3 * 64 * 2  # slots x tokens x layers x (K, V) x kv heads x head dim x bytes
    assert f16 > kv_f16 and f16_tokens > 0 and q8_tokens > 0
    assert f16 - q8 > 0.4 * kv_f16  # q8_0 stores 34 bytes per 32 values instead of 64


def test_a_cancelled_load_stops_and_an_uncancelled_one_loads() -> None:
    from zoo.inference.llamacpp.gguf import GgufLoadCancelled, GgufModel

    called_off = threading.Event()
    called_off.set()
    with pytest.raises(GgufLoadCancelled, match="called off"):
        GgufModel(bundled_gguf(), called_off)
    model = GgufModel(bundled_gguf(), threading.Event())
    try:
        assert model.n_vocab > 1000
    finally:
        model.close()


def test_the_choices_of_one_request_prefill_its_prompt_once(backend: LlamaCppBackend) -> None:
    from zoo.inference.backend_protocol import ChoiceGroup

    wait_idle(backend)
    # A short plain-text prompt (below SHARED_PREFIX, which unrelated requests must share to wait and copy).
    prompt, text = msgs("x"), "Quick, name one vegetable:"
    group = ChoiceGroup(4)
    asks = [
        GenerationRequest(prompt, max_tokens=12, temperature=1.0, seed=i, group=group, prompt=text)
        for i in range(4)
    ]
    before = backend.scheduler.reused_tokens
    results = together(backend, asks)
    prompt_tokens = results[0].prompt_tokens
    assert prompt_tokens < 32
    assert backend.scheduler.reused_tokens - before == 3 * (prompt_tokens - 1)  # three copies of one prefill
    assert len({r.text for r in results}) > 1  # their own seeds: their own answers
    # Each choice is what its seed gives when asked again.
    again = together(
        backend,
        [
            GenerationRequest(
                prompt, max_tokens=12, temperature=1.0, seed=i, group=ChoiceGroup(4), prompt=text
            )
            for i in range(4)
        ],
    )
    assert [r.text for r in again] == [r.text for r in results]
