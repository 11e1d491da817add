"""Distil token-level expert factors from a TF-GRPO group's rollouts (ASO Algorithm 2, lines 11-12).

A group's completions are split by the sign of their advantage; tokens that the better completions use
more often than the worse ones get a positive log-boost, the others a negative one. The result is an
ExpertFactors (1-bit compressed by zoo.inference.factors.compress) that the inference side adds to the
logits at decode time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from zoo.inference.factors import compress, tokenizer_tag
from zoo.registry.expert_factors import ExpertFactors


def _count_tokens(texts: Sequence[str], tokenizer: Any, special: frozenset[int]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        counts.update(int(t) for t in ids if int(t) not in special)
    return counts


def distill_factors(
    completions: Sequence[str],
    advantages: Sequence[float],
    tokenizer: Any,
    *,
    top_k: int = 32,
    smoothing: float = 1.0,
    min_count: int = 1,
    max_abs_delta: float = 4.0,
) -> ExpertFactors | None:
    """Token-level factors from one group: smoothed log-ratios of token frequencies, high vs low advantage.

    The high set holds the completions with advantage > 0, the low set those with advantage < 0 (0 is
    ignored). Each completion is tokenised with `tokenizer(text, add_special_tokens=False)` (a Hugging
    Face tokenizer); ids in `tokenizer.all_special_ids` are dropped. With c_hi(t), c_lo(t) the number of
    occurrences of token t in each set, N_hi, N_lo the sets' total token counts, s = `smoothing` and V the
    number of distinct tokens seen in either set (the smoothing vocabulary):

        Δ(t) = log((c_hi(t) + s) / (N_hi + s·V)) - log((c_lo(t) + s) / (N_lo + s·V))

    i.e. the log-ratio of t's add-s smoothed frequency in the high set to that in the low set. Only
    tokens occurring at least `min_count` times over both sets are candidates; Δ is clipped to
    [-max_abs_delta, max_abs_delta]. The `top_k` candidates with the largest |Δ| are kept (ties go to the
    smaller token id, so the result is deterministic), those with Δ = 0 are dropped, and the rest are
    compressed to 1 bit per token (sign) plus a per-block scale.

    The factors are tied to this tokenizer by its tag (zoo.inference.factors.tokenizer_tag): a node
    applies them only under a tokenizer with the same vocabulary. Returns None when either set is empty
    or no token survives the filters.
    """
    if isinstance(completions, str):
        raise ValueError("completions must be a sequence of strings, not one string")
    if len(completions) != len(advantages):
        raise ValueError(
            f"completions and advantages must have one length (got {len(completions)} and {len(advantages)})"
        )
    for i, text in enumerate(completions):
        if not isinstance(text, str):
            raise ValueError(f"completion {i} must be a string, not {type(text).__name__}")
    values: list[float] = []
    for i, a in enumerate(advantages):
        if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a):
            raise ValueError(f"advantage {i} must be a finite number (got {a!r})")
        values.append(float(a))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1 (got {top_k!r})")
    if isinstance(smoothing, bool) or not isinstance(smoothing, int | float) or not 0 < smoothing < math.inf:
        raise ValueError(f"smoothing must be a finite number > 0 (got {smoothing!r})")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1 (got {min_count!r})")
    if (
        isinstance(max_abs_delta, bool)
        or not isinstance(max_abs_delta, int | float)
        or not 0 < max_abs_delta < math.inf
    ):
        raise ValueError(f"max_abs_delta must be a finite number > 0 (got {max_abs_delta!r})")

    high = [t for t, a in zip(completions, values, strict=True) if a > 0]
    low = [t for t, a in zip(completions, values, strict=True) if a < 0]
    if not high or not low:
        return None

    special = frozenset(int(t) for t in getattr(tokenizer, "all_special_ids", None) or ())
    c_hi = _count_tokens(high, tokenizer, special)
    c_lo = _count_tokens(low, tokenizer, special)
    n_hi, n_lo = sum(c_hi.values()), sum(c_lo.values())
    vocab = set(c_hi) | set(c_lo)
    if not vocab:
        return None
    s = float(smoothing)
    v = len(vocab)
    log_den_hi = math.log(n_hi + s * v)
    log_den_lo = math.log(n_lo + s * v)

    scored: list[tuple[int, float]] = []
    for token in vocab:
        hi, lo = c_hi[token], c_lo[token]
        if hi + lo < min_count:
            continue
        delta = (math.log(hi + s) - log_den_hi) - (math.log(lo + s) - log_den_lo)
        scored.append((token, max(-max_abs_delta, min(max_abs_delta, delta))))
    scored.sort(key=lambda item: (-abs(item[1]), item[0]))
    kept = [(token, delta) for token, delta in scored[:top_k] if delta != 0.0]
    if not kept:
        return None
    return compress([t for t, _ in kept], [d for _, d in kept], tokenizer_tag(tokenizer))
