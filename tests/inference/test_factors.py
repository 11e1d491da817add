"""Expert factors: 1-bit compression (Algorithm 1), registry round trips, η weights, and the decode-time
Product-of-Experts processor checked against the formula on the real bundled model."""

from __future__ import annotations

import inspect
import logging
import math
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.inference import factors as fx
from zoo.inference.factors import (
    ExpertFactorLogitsProcessor,
    build_processor,
    combine,
    compress,
    compression_ratio,
    decompress,
    expert_weight,
    parse_tokenizer_tag,
    tokenizer_tag,
    tokenizers_match,
    vllm_extra_args,
    vllm_logits_processor_class,
    vllm_request_processor,
)
from zoo.registry.canonical import decode_experience, encode_experience
from zoo.registry.experience import Experience
from zoo.registry.expert_factors import ExpertFactors

REPO = Path(__file__).resolve().parents[2]
TAG = "smollm2:49152:0123456789abcdef"
AUTHOR = "0x" + "ab" * 20
LOGGER = "zoo.inference.factors"


# Confidences whose log-odds weights are 1 and 3 (to within the millionths confidence is kept in).
ONE = round(math.e / (1 + math.e), 6)
THREE = round(math.e**3 / (1 + math.e**3), 6)


def experience(
    factors: ExpertFactors | None, confidence: float = ONE, text: str = "When testing, boost tokens."
) -> Experience:
    return Experience.create(
        text=text,
        domain="test.factors",
        confidence=confidence,
        author=AUTHOR,
        base_model="smollm2-135m-instruct",
        created_at="2025-10-17T12:00:00Z",
        factors=factors,
    )


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[Any, Any]]:
    """The bundled chat model and its tokenizer, loaded once.

    Its bf16 weights are upcast to float32 (exactly): bf16 matmuls run ~3x slower on CPUs without bf16
    units, and the processor sees float32 logits either way (generate() casts them before processors).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    path = prepare_bundled_chat_model(default_cache_dir()).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield model, tokenizer


def prompt_ids(tokenizer: Any, text: str) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return torch.tensor([ids])


# -- compression ------------------------------------------------------------------------------------


def test_compress_matches_algorithm_1_by_hand() -> None:
    # Unsorted input; sorted it is ids 10..50 with deltas [2, -1, -3, 0.5, 0].
    f = compress([40, 10, 30, 20, 50], [0.5, 2.0, -3.0, -1.0, 0.0], "tok", block_size=2)
    assert f.token_ids == (10, 20, 30, 40, 50)
    assert f.sign_values() == [1, -1, -1, 1, 1]  # the 0 takes the tie rule: +1
    assert f.signs == bytes([0b11001])  # LSB first
    assert f.scales == (1.5, 1.75, 0.0)  # mean |Δ| of [2, -1], [-3, 0.5], [0]
    ids, deltas = decompress(f)
    assert ids.dtype == np.int64 and deltas.dtype == np.float32
    assert ids.tolist() == [10, 20, 30, 40, 50]
    assert deltas.tolist() == [1.5, -1.5, -1.75, 1.75, 0.0]

    # One block: alpha = (2 + 1 + 3 + 0.5 + 0) / 5 = 1.3, and the zero decompresses to +alpha.
    f = compress([40, 10, 30, 20, 50], [0.5, 2.0, -3.0, -1.0, 0.0], "tok", block_size=5)
    a = float(np.float32(1.3))
    assert f.scales == (a,)
    assert decompress(f)[1].tolist() == [a, -a, -a, a, a]

    # Negative zero is a zero too.
    assert compress([3], [-0.0], "tok").sign_values() == [1]


@pytest.mark.parametrize(
    ("ids", "deltas", "block_size"),
    [
        ([], [], 64),  # empty
        ([1, 2], [1.0], 64),  # lengths differ
        ([1, 1], [1.0, 2.0], 64),  # duplicate id
        ([1, 2], [1.0, math.nan], 64),
        ([1, 2], [1.0, math.inf], 64),
        ([-1], [1.0], 64),
        ([2**32], [1.0], 64),
        ([1], [1.0], 0),
        ([1.5], [1.0], 64),
    ],
)
def test_compress_refuses_bad_input(ids: list[Any], deltas: list[float], block_size: int) -> None:
    with pytest.raises(ValueError):
        compress(ids, deltas, "tok", block_size=block_size)


@st.composite
def sparse_deltas(draw: st.DrawFn) -> tuple[list[int], list[float], int]:
    ids = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200, unique=True))
    # The registry schema bounds a block's scale (mean |delta|) to [0, 100].
    value = st.one_of(st.just(0.0), st.floats(-100.0, 100.0, allow_subnormal=False))
    deltas = draw(st.lists(value, min_size=len(ids), max_size=len(ids)))
    return ids, deltas, draw(st.integers(1, 70))


@settings(max_examples=200, deadline=None)
@given(sparse_deltas())
def test_round_trip_keeps_signs_and_block_means(case: tuple[list[int], list[float], int]) -> None:
    ids, deltas, block_size = case
    f = compress(ids, deltas, "tok", block_size=block_size)
    order = np.argsort(ids)
    sorted_ids = np.asarray(ids, dtype=np.int64)[order]
    sorted_deltas = np.asarray(deltas, dtype=np.float64)[order]
    got_ids, got = decompress(f)
    assert got_ids.tolist() == sorted_ids.tolist()
    assert f.sign_values() == [1 if d >= 0 else -1 for d in sorted_deltas]
    assert len(f.scales) == -(-len(ids) // block_size)
    for b, alpha in enumerate(f.scales):
        block = slice(b * block_size, (b + 1) * block_size)
        expected = math.fsum(abs(d) for d in sorted_deltas[block]) / len(sorted_deltas[block])
        assert alpha == pytest.approx(expected, rel=1e-6, abs=1e-30)
        # Every Δ̂ of the block is ±alpha with Δ's sign, so its mean |Δ̂| is alpha.
        assert np.abs(got[block]).tolist() == [np.float32(alpha)] * len(got[block])
        assert float(np.abs(got[block]).mean()) == pytest.approx(alpha, rel=1e-6)
        nonzero = sorted_deltas[block] != 0
        if alpha > 0:
            assert (np.sign(got[block][nonzero]) == np.sign(sorted_deltas[block][nonzero])).all()
    assert ExpertFactors.parse(f.to_dict()) == f


def test_factors_validate_and_survive_canonical_encoding() -> None:
    rng = np.random.default_rng(7)
    ids = rng.choice(49152, size=131, replace=False)
    f = compress(ids, rng.normal(size=131), TAG, block_size=64)
    assert len(f.signs) == 17 and len(f.scales) == 3
    assert ExpertFactors.parse(f.to_dict()) == f
    e = experience(f, confidence=0.8)
    data = encode_experience(e)
    back = decode_experience(data)
    assert back == e
    assert back.factors == f
    assert encode_experience(back) == data
    assert decompress(back.factors)[1].tolist() == decompress(f)[1].tolist()


def test_compression_ratio_realistic_case() -> None:
    rng = np.random.default_rng(1)
    f = compress(rng.choice(49152, size=256, replace=False), rng.normal(size=256), TAG, block_size=64)
    # 1-bit payload: 256 uint32 ids (1024 B) + 32 sign bytes + 4 float32 scales (16 B) = 1072 B.
    assert fx.packed_nbytes(f) == 1072
    # Dense fp32 over the 49152-token vocabulary: 196608 B -> 183.40x; vocab size read from the tag.
    assert compression_ratio(f) == 196608 / 1072
    assert compression_ratio(f) == pytest.approx(183.402985, rel=1e-6)
    assert compression_ratio(f, vocab_size=49152) == compression_ratio(f)
    # Sparse fp32 (id + value): 2048 B -> 1.91x; values alone: 1024 B over 48 B -> 21.33x.
    assert compression_ratio(f, against="sparse") == pytest.approx(2048 / 1072)
    assert compression_ratio(f, against="values") == pytest.approx(1024 / 48)
    with pytest.raises(ValueError):
        compression_ratio(compress([1], [1.0], "not-a-tag"))


# -- weights ------------------------------------------------------------------------------------------


def test_expert_weight_is_the_log_odds_and_cannot_boost_an_unreliable_expert() -> None:
    assert expert_weight(0.5) == 0.0  # a coin: no effect
    assert expert_weight(0.75) == pytest.approx(math.log(3))
    assert expert_weight(0.25) == pytest.approx(-math.log(3))  # usually wrong: trusted in reverse
    assert expert_weight(ONE) == pytest.approx(1.0, abs=1e-5)
    assert expert_weight(0.75, eta=2.0) == pytest.approx(2 * math.log(3))
    assert expert_weight(0.99) == 4.0 and expert_weight(0.01) == -4.0  # clipped to the cap
    assert expert_weight(0.99, cap=10.0) == pytest.approx(math.log(99))
    assert expert_weight(1.0) == 4.0 and expert_weight(1.0, cap=2.5) == 2.5
    assert expert_weight(0.0) == -4.0 and expert_weight(-0.3) == -4.0
    assert expert_weight(1.0, eta=0.0) == 0.0
    # Monotone in q, odd around 0.5.
    qs = [i / 20 for i in range(1, 20)]
    weights = [expert_weight(q) for q in qs]
    assert weights == sorted(weights)
    assert all(expert_weight(q) == pytest.approx(-expert_weight(1 - q)) for q in qs)
    for bad in (
        {"confidence": math.nan},
        {"confidence": 0.5, "eta": -1.0},
        {"confidence": 0.5, "cap": math.inf},
    ):
        with pytest.raises(ValueError):
            expert_weight(**bad)


def test_an_expert_of_unknown_reliability_has_no_effect() -> None:
    strong = compress([7], [100.0], TAG)
    assert build_processor([experience(strong, confidence=0.5)], TAG, 100) is None
    real = experience(compress([3], [2.0], TAG), confidence=ONE, text="When real, boost token three.")
    both = build_processor([experience(strong, confidence=0.5), real], TAG, 100)
    alone = build_processor([real], TAG, 100)
    assert both is not None and alone is not None
    assert torch.equal(both.bias, alone.bias)
    assert both.bias[7] == 0 and both.bias[3] == pytest.approx(2.0, abs=1e-4)
    # An expert that is usually wrong pushes the other way.
    wrong = build_processor([experience(compress([3], [2.0], TAG), confidence=1 - ONE)], TAG, 100)
    assert wrong is not None and wrong.bias[3] == pytest.approx(-2.0, abs=1e-4)


# -- tokenizer identity -------------------------------------------------------------------------------


def test_tokenizer_tag_is_stable_and_matches_on_vocabulary(chat: tuple[Any, Any]) -> None:
    from transformers import AutoTokenizer

    _model, tokenizer = chat
    tag = tokenizer_tag(tokenizer)
    assert tag == tokenizer_tag(AutoTokenizer.from_pretrained(tokenizer.name_or_path))
    parsed = parse_tokenizer_tag(tag)
    assert parsed is not None and parsed.vocab_size == 49152 == len(tokenizer)
    assert parsed.name == Path(tokenizer.name_or_path).name
    assert tokenizers_match(tag, f"renamed-copy:49152:{parsed.digest}")
    assert not tokenizers_match(tag, f"{parsed.name}:49152:{'0' * 16}")
    assert not tokenizers_match(tag, "some-tokenizer")
    assert tokenizers_match("some-tokenizer", "some-tokenizer")


def test_tokenizer_mismatch_is_ignored_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    other = experience(
        compress([5], [3.0], "other-tokenizer:49152:fedcba9876543210"), text="When mismatched, warn once."
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert build_processor([other], TAG, 100) is None
    warnings = [r for r in caplog.records if r.name == LOGGER and other.id in r.getMessage()]
    assert len(warnings) == 1 and "tokenizer" in warnings[0].getMessage()
    caplog.clear()
    # Once per experience id: the next request does not repeat it; a matching experience still applies.
    good = experience(compress([5], [3.0], TAG), text="When matched, boost token five.")
    processor = build_processor([other, good], TAG, 100)
    assert processor is not None and processor.bias[5] == pytest.approx(3.0, abs=1e-4)
    assert not [r for r in caplog.records if other.id in r.getMessage()]
    assert build_processor([experience(None)], TAG, 100) is None  # no factors at all


def test_ids_beyond_vocab_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    f = compress([5, 60, 70], [1.0, 1.0, 1.0], TAG)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bias = combine([(f, 2.0)], vocab_size=50)
    assert bias.shape == (50,) and bias.dtype == torch.float32
    assert bias[5] == 2.0 and int((bias != 0).sum()) == 1
    assert any("2 token id(s) beyond the vocabulary of 50" in r.getMessage() for r in caplog.records)
    only_outside = experience(compress([60], [1.0], TAG), text="When outside, nothing applies here.")
    assert build_processor([only_outside], TAG, 50) is None


def test_combine_sums_weighted_factors() -> None:
    a = compress([1, 2, 3], [2.0, -1.0, 0.5], TAG, block_size=2)  # Δ̂ = [1.5, -1.5, 0.5]
    b = compress([1], [1.0], TAG)
    bias = combine([(a, 3.0), (b, 1.0), (b, 0.0)], vocab_size=5, dtype=torch.float64)
    assert bias.dtype == torch.float64
    assert bias.tolist() == [0.0, 5.5, -4.5, 1.5, 0.0]


# -- the processor -------------------------------------------------------------------------------------


def test_processor_pads_and_truncates_to_the_model_vocab(caplog: pytest.LogCaptureFixture) -> None:
    bias = torch.zeros(10)
    bias[2], bias[9] = 1.0, -2.0
    processor = ExpertFactorLogitsProcessor(bias)
    padded = processor(torch.zeros((2, 1), dtype=torch.long), torch.zeros(2, 16))
    assert padded[:, :10].tolist() == [bias.tolist()] * 2 and not padded[:, 10:].any()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    cut = processor(torch.zeros((1, 1), dtype=torch.long), torch.ones(1, 8, dtype=torch.bfloat16))
    assert cut.shape == (1, 8) and cut.dtype == torch.float32  # promoted, never rounded to bf16
    assert cut[0, 2] == 2.0 and cut[0, 0] == 1.0
    assert any("scores 8 tokens" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        ExpertFactorLogitsProcessor(torch.tensor([1.0, math.nan]))


def test_processor_changes_probabilities_as_the_formula_says(chat: tuple[Any, Any]) -> None:
    model, tokenizer = chat
    tag = tokenizer_tag(tokenizer)
    input_ids = prompt_ids(tokenizer, "What is the capital of France?")
    with torch.no_grad():
        old = model(input_ids).logits[:, -1].to(torch.float32)  # as generate() hands them over
    top = torch.topk(old[0], 4).indices.tolist()
    a, b, c = sorted(top[:3])
    unboosted = top[3]
    # Experience A (log-odds η = 3): Δ over [a, b, c] = [2, -1, 0.5], block 2 -> Δ̂ = [1.5, -1.5, 0.5].
    # Experience B (η = 1): Δ̂(a) = 1. Bias: a = 3·1.5 + 1 = 5.5, b = -4.5, c = 1.5.
    exp_a = experience(compress([a, b, c], [2.0, -1.0, 0.5], tag, 2), THREE, "When asked, prefer token a.")
    exp_b = experience(compress([a], [1.0], tag), ONE, "When asked again, prefer a.")
    processor = build_processor([exp_a, exp_b], tag, len(tokenizer))
    assert processor is not None
    expected = {a: 5.5, b: -4.5, c: 1.5}

    new = processor(input_ids, old.clone())
    diff = (new - old)[0]
    for token, value in expected.items():
        assert diff[token].item() == pytest.approx(value, abs=1e-4)
    others = torch.ones_like(diff, dtype=torch.bool)
    others[list(expected)] = False
    assert torch.equal(new[0][others], old[0][others])  # + 0.0 is exact

    p_old, p_new = torch.softmax(old[0].double(), -1), torch.softmax(new[0].double(), -1)
    bias = {**expected, unboosted: 0.0}
    for y, z in [(a, b), (a, c), (b, c), (a, unboosted), (unboosted, b)]:
        ratio_new = (p_new[y] / p_new[z]).item()
        ratio_old = (p_old[y] / p_old[z]).item()
        assert ratio_new == pytest.approx(ratio_old * math.exp(bias[y] - bias[z]), rel=1e-4)
    assert p_new[a] > p_old[a] and p_new[b] < p_old[b]  # c rises against unboosted tokens only (above)


def test_huge_factor_forces_greedy_generation(chat: tuple[Any, Any]) -> None:
    from transformers import LogitsProcessorList

    model, tokenizer = chat
    tag = tokenizer_tag(tokenizer)
    target = tokenizer.encode(" zebra", add_special_tokens=False)
    assert len(target) == 1
    input_ids = prompt_ids(tokenizer, "Name a colour.")
    kwargs = {"max_new_tokens": 3, "do_sample": False, "attention_mask": torch.ones_like(input_ids)}
    with torch.no_grad():
        plain = model.generate(input_ids, **kwargs)[0, input_ids.shape[1] :].tolist()
        assert target[0] not in plain
        e = experience(compress(target, [100.0], tag), confidence=ONE, text="When naming, say zebra.")
        processor = build_processor([e], tag, len(tokenizer))
        forced = model.generate(input_ids, logits_processor=LogitsProcessorList([processor]), **kwargs)
    assert forced[0, input_ids.shape[1] :].tolist() == target * 3


# -- vLLM ----------------------------------------------------------------------------------------------


def test_vllm_request_processor_matches_the_dense_processor() -> None:
    bias = torch.zeros(20)
    bias[[1, 4, 19]] = torch.tensor([0.5, -2.0, 3.0])
    processor = ExpertFactorLogitsProcessor(bias)
    request_lp = vllm_request_processor(processor)
    assert len(inspect.signature(request_lp).parameters) == 2  # vLLM's (output ids, logits) form
    row = torch.randn(24)  # a padded vocabulary
    expected = processor(torch.zeros((1, 1), dtype=torch.long), row[None].clone())[0]
    got = request_lp([11, 12], row.clone())
    assert torch.equal(got, expected)
    short = request_lp([], torch.zeros(10))  # id 19 does not exist in a 10-token row
    assert short.tolist() == bias[:10].tolist()


def test_vllm_adapter_class_with_a_stand_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="vLLM"):
        vllm_logits_processor_class()  # vLLM is not installed here

    class AdapterLogitsProcessor:  # the base class of vLLM's V1 API, reduced to what the adapter uses
        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.req_info: dict[int, Any] = {}

    names = ["vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.v1.sample.logits_processor"].AdapterLogitsProcessor = AdapterLogitsProcessor  # type: ignore[attr-defined]
    monkeypatch.setattr(fx, "_vllm_class", None)

    cls = vllm_logits_processor_class()
    assert issubclass(cls, AdapterLogitsProcessor) and vllm_logits_processor_class() is cls
    lp = cls(None, torch.device("cpu"), False)
    assert lp.is_argmax_invariant() is False
    bias = torch.zeros(8)
    bias[[2, 5]] = torch.tensor([1.5, -1.0])
    params = types.SimpleNamespace(extra_args=vllm_extra_args(bias))
    assert params.extra_args == {"zoo_expert_bias": {"ids": [2, 5], "values": [1.5, -1.0]}}
    cls.validate_params(params)
    request_lp = lp.new_req_logits_processor(params)
    assert request_lp([], torch.zeros(8)).tolist() == bias.tolist()
    assert lp.new_req_logits_processor(types.SimpleNamespace(extra_args=None)) is None
    with pytest.raises(ValueError):
        cls.validate_params(types.SimpleNamespace(extra_args={"zoo_expert_bias": {"ids": [1], "values": []}}))


def test_module_import_does_not_import_vllm(tmp_path: Path) -> None:
    # A vllm package that fails on import: importing zoo.inference.factors must not touch it.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('vllm was imported')\n")
    code = "import sys, zoo.inference.factors; assert 'vllm' not in sys.modules"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
