"""Distilling token-level expert factors from a group, with the real bundled tokenizer."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from zoo.inference.factors import decompress, tokenizer_tag
from zoo.registry.experience import Experience
from zoo.trainer.tfgrpo.distill import distill_factors

HIGH = [
    "Check units carefully, then the answer is 42.",
    "Check the units carefully and verify: the answer is 42.",
]
LOW = [
    "Guess quickly, so the answer is 17.",
    "Just guess quickly: the answer is 17.",
]
COMPLETIONS = HIGH + LOW
ADVANTAGES = [1.0, 0.5, -0.7, -0.8]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    path = prepare_bundled_chat_model(default_cache_dir()).path
    return AutoTokenizer.from_pretrained(path)


def single_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return int(ids[0])


def as_dict(factors: Any) -> dict[int, float]:
    ids, values = decompress(factors)
    return {int(t): float(v) for t, v in zip(ids, values, strict=True)}


def test_high_only_tokens_get_positive_and_low_only_negative_factors(tokenizer: Any) -> None:
    factors = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=64)
    assert factors is not None
    deltas = as_dict(factors)
    carefully, quickly = single_token(tokenizer, " carefully"), single_token(tokenizer, " quickly")
    assert deltas[carefully] > 0
    assert deltas[quickly] < 0
    high_ids = {t for text in HIGH for t in tokenizer(text, add_special_tokens=False)["input_ids"]}
    low_ids = {t for text in LOW for t in tokenizer(text, add_special_tokens=False)["input_ids"]}
    for t, v in deltas.items():
        if t in high_ids - low_ids:
            assert v > 0, t
        elif t in low_ids - high_ids:
            assert v < 0, t
    assert all(t not in tokenizer.all_special_ids for t in deltas)


def reference_deltas(tokenizer: Any, high: list[str], low: list[str], s: float) -> dict[int, float]:
    """The formula written out directly (no clipping, no filters)."""
    hi = [t for text in high for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    lo = [t for text in low for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    v = len(set(hi) | set(lo))
    return {
        t: math.log((hi.count(t) + s) / (len(hi) + s * v)) - math.log((lo.count(t) + s) / (len(lo) + s * v))
        for t in set(hi) | set(lo)
    }


@pytest.mark.parametrize("smoothing", [1.0, 0.25])
def test_delta_is_the_smoothed_log_ratio(tokenizer: Any, smoothing: float) -> None:
    high, low = ["Check units carefully. Check twice."], ["Guess quickly."]
    expected = reference_deltas(tokenizer, high, low, smoothing)
    ranked = sorted(expected.items(), key=lambda item: (-abs(item[1]), item[0]))
    # With block_size 64 and one token kept, the block's scale is exactly |Δ| of that token.
    for k in (1, 2):
        factors = distill_factors(
            high + low, [1.0, -1.0], tokenizer, top_k=k, smoothing=smoothing, max_abs_delta=100.0
        )
        assert factors is not None
        assert list(factors.token_ids) == sorted(t for t, _ in ranked[:k])
        assert factors.scales[0] == pytest.approx(np.mean([abs(d) for _, d in ranked[:k]]), rel=1e-6)
        signs = dict(zip(factors.token_ids, factors.sign_values(), strict=True))
        assert all(signs[t] == (1 if d > 0 else -1) for t, d in ranked[:k])


def test_clipping_bounds_the_scale(tokenizer: Any) -> None:
    factors = distill_factors(COMPLETIONS * 5, ADVANTAGES * 5, tokenizer, smoothing=0.01, max_abs_delta=0.5)
    assert factors is not None
    assert max(factors.scales) <= 0.5 + 1e-6


def test_top_k_is_respected(tokenizer: Any) -> None:
    full = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=1000)
    assert full is not None and len(full.token_ids) > 3
    for k in (1, 3):
        factors = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=k)
        assert factors is not None
        assert len(factors.token_ids) == k
        assert set(factors.token_ids) <= set(full.token_ids)


def test_min_count_filters_rare_tokens(tokenizer: Any) -> None:
    loose = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=1000)
    strict = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=1000, min_count=2)
    assert loose is not None and strict is not None
    assert set(strict.token_ids) < set(loose.token_ids)
    assert single_token(tokenizer, " quickly") in strict.token_ids  # occurs twice in the low set
    assert distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, min_count=1000) is None


@pytest.mark.parametrize(
    "advantages",
    [[1.0, 0.5, 0.2, 0.1], [-1.0, -0.5, -0.2, -0.1], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
)
def test_none_without_both_a_high_and_a_low_set(tokenizer: Any, advantages: list[float]) -> None:
    assert distill_factors(COMPLETIONS, advantages, tokenizer) is None


def test_none_when_the_completions_hold_no_tokens(tokenizer: Any) -> None:
    assert distill_factors(["", ""], [1.0, -1.0], tokenizer) is None
    # Identical completions: every Δ is 0 and is dropped.
    assert distill_factors(["Same text.", "Same text."], [1.0, -1.0], tokenizer) is None


def test_deterministic_and_tagged_with_the_tokenizer(tokenizer: Any) -> None:
    a = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=5)
    b = distill_factors(list(reversed(COMPLETIONS)), list(reversed(ADVANTAGES)), tokenizer, top_k=5)
    c = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer, top_k=5)
    assert a is not None and a == b == c
    assert a.tokenizer == tokenizer_tag(tokenizer)


def test_round_trips_through_an_experience(tokenizer: Any) -> None:
    factors = distill_factors(COMPLETIONS, ADVANTAGES, tokenizer)
    assert factors is not None
    exp = Experience.create(
        text="When a problem states units, check them carefully before answering.",
        domain="math.arithmetic",
        confidence=0.7,
        author="job:test",
        base_model="smollm2-135m-instruct",
        created_at="2025-10-17T12:00:00Z",
        factors=factors,
    )
    assert exp.factors == factors
    again = Experience.parse(exp.to_dict())
    assert again == exp
    ids, values = decompress(again.factors)  # type: ignore[arg-type]
    assert list(ids) == list(factors.token_ids)
    assert np.array_equal(values, decompress(factors)[1])


@pytest.mark.parametrize(
    ("completions", "advantages", "kwargs", "message"),
    [
        (COMPLETIONS, ADVANTAGES[:3], {}, "one length"),
        ("a string", [1.0] * 8, {}, "sequence of strings"),
        ([1, 2], [1.0, -1.0], {}, "must be a string"),
        (COMPLETIONS, [1.0, float("nan"), -1.0, -1.0], {}, "finite"),
        (COMPLETIONS, [1.0, math.inf, -1.0, -1.0], {}, "finite"),
        (COMPLETIONS, ADVANTAGES, {"top_k": 0}, "top_k"),
        (COMPLETIONS, ADVANTAGES, {"top_k": 2.5}, "top_k"),
        (COMPLETIONS, ADVANTAGES, {"smoothing": 0.0}, "smoothing"),
        (COMPLETIONS, ADVANTAGES, {"smoothing": -1.0}, "smoothing"),
        (COMPLETIONS, ADVANTAGES, {"min_count": 0}, "min_count"),
        (COMPLETIONS, ADVANTAGES, {"max_abs_delta": 0.0}, "max_abs_delta"),
    ],
)
def test_bad_arguments_raise_value_error(
    tokenizer: Any, completions: Any, advantages: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        distill_factors(completions, advantages, tokenizer, **kwargs)
