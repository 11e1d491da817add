"""Decode-time expert factors: 1-bit compression of token-level advantages and Product-of-Experts decoding.

The ASO paper (§3, §4, §7.1, Algorithm 1, Algorithm 2 lines 11-12) in the terms of this module:

- Experience i may carry a sparse factor over a vocabulary subset V_i (eq. 8): log φ_i(y) = Δ_i(y) for
  y in V_i and 0 elsewhere.
- It is stored 1-bit (Algorithm 1, applied per block as §4.2 allows: "one scalar per matrix block"):
  the token ids sorted ascending, sign(Δ) per token packed into bits, and one float32 scale per block
  of `block_size` consecutive entries, alpha_b = mean |Δ| over the block. Decompression gives
  Δ̂ = alpha_b · sign(Δ). Tie rule: Δ = 0 (either zero) is stored with sign +1, so it decompresses to
  +alpha_b; its |Δ| = 0 still counts in alpha_b's mean, as in Algorithm 1. Leave a token out if the
  factor has no opinion about it.
- Decoding (eqs. 4-5, η_0 = 1): z = log p_base + Σ_i η_i Δ̂_i, i.e. p(y) ∝ p_base(y) · Π_i exp(η_i Δ̂_i(y));
  the softmax's normaliser is the per-token partition function Z. Adding the bias to raw logits is the
  same thing, since log p_base and the logits differ by a per-step constant.
- η_i comes from the experience's reliability q_i (its confidence): the Bayes log-odds weight
  η_i = η · log(q_i / (1 - q_i)), clipped to [-cap, cap]. It is zero at q = 0.5 (an expert no better than
  a coin adds nothing) and negative below it (an expert that is usually wrong is trusted in reverse), so a
  factor whose reliability is unknown cannot push decoding anywhere. (q / (1 - q), the odds, is positive
  for every q > 0 and would still boost an expert that is wrong most of the time.)

Factors are tied to one tokenizer by a tag (tokenizer_tag); a node ignores factors made for another one.
Tensors here are CPU or accelerator torch tensors; numpy holds the stored (host-side) form.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import PurePath
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from transformers import LogitsProcessor

from zoo.inference.defaults import DEFAULT_FACTOR_CAP, DEFAULT_FACTOR_ETA
from zoo.registry.expert_factors import MAX_TOKEN_ID, ExpertFactors
from zoo.registry.validation import MAX_NAME_CHARS

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 64
ID_BYTES = 4  # a token id stored as uint32 (the schema's id range is [0, 2**32))
VALUE_BYTES = 4  # a float32 value or scale
VLLM_EXTRA_ARGS_KEY = "zoo_expert_bias"  # SamplingParams.extra_args key read by the vLLM adapter class

# Experience ids already warned about (factors tied to another tokenizer): one warning per id per process.
_warned_mismatch: set[str] = set()
_warned_lock = threading.Lock()


# -- 1-bit compression (Algorithm 1) ----------------------------------------------------------------


def compress(
    token_ids: Sequence[int] | np.ndarray,
    deltas: Sequence[float] | np.ndarray,
    tokenizer: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> ExpertFactors:
    """1-bit factors of a sparse Δ (Algorithm 1 per block): sorted ids, sign bits, alpha_b = mean |Δ|.

    Entries are sorted by token id first, so block b holds the b-th run of `block_size` ids in ascending
    order (the last block may be shorter). alpha_b is computed in float64 and stored as float32. Δ = 0 gets
    sign +1 (see the module docstring). Ids must be unique integers in [0, 2**32); deltas finite.
    """
    ids = np.asarray(token_ids)
    values = np.asarray(deltas, dtype=np.float64)
    if ids.ndim != 1 or values.ndim != 1 or len(ids) != len(values):
        raise ValueError(
            f"token_ids and deltas must be 1-D of one length (got {ids.shape} and {values.shape})"
        )
    if len(ids) == 0:
        raise ValueError("a factor needs at least one token")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, not {ids.dtype}")
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer (got {block_size!r})")
    block_size = int(block_size)
    if not np.isfinite(values).all():
        raise ValueError("deltas must be finite")
    ids = ids.astype(np.int64)
    if ids.min() < 0 or ids.max() > MAX_TOKEN_ID:
        raise ValueError("token ids must lie in [0, 2**32)")
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order], values[order]
    if len(ids) > 1 and (np.diff(ids) == 0).any():
        duplicate = int(ids[1:][np.diff(ids) == 0][0])
        raise ValueError(f"token id {duplicate} occurs more than once")
    positive = values >= 0  # tie rule: +0.0 and -0.0 both count as +1
    signs = np.packbits(positive, bitorder="little").tobytes()  # LSB first, as schema's pack_signs
    magnitudes = np.abs(values)
    scales = tuple(
        float(magnitudes[start : start + block_size].mean()) for start in range(0, len(ids), block_size)
    )
    return ExpertFactors.create(
        tokenizer=tokenizer,
        token_ids=tuple(int(t) for t in ids),
        signs=signs,
        block_size=block_size,
        scales=scales,
    )


def decompress(f: ExpertFactors) -> tuple[np.ndarray, np.ndarray]:
    """(token ids as int64, Δ̂ as float32), both of shape (K,): Δ̂_j = sign_j · alpha_{j // block_size}."""
    n = len(f.token_ids)
    ids = np.asarray(f.token_ids, dtype=np.int64)
    bits = np.unpackbits(np.frombuffer(f.signs, dtype=np.uint8), count=n, bitorder="little")
    signs = bits.astype(np.float32) * 2 - 1  # bit 1 -> +1, bit 0 -> -1
    scales = np.asarray(f.scales, dtype=np.float32)[np.arange(n) // f.block_size]
    return ids, signs * scales


# -- storage size ------------------------------------------------------------------------------------


def packed_nbytes(f: ExpertFactors) -> int:
    """Bytes of the 1-bit form's payload: K uint32 ids + ceil(K/8) sign bytes + one float32 per block.

    The tokenizer tag and block size (a few dozen bytes of metadata per factor) are not counted.
    """
    n = len(f.token_ids)
    return ID_BYTES * n + (n + 7) // 8 + VALUE_BYTES * len(f.scales)


def dense_fp32_nbytes(vocab_size: int) -> int:
    """Bytes of a dense fp32 factor: one float32 for every entry of the tokenizer's vocabulary."""
    return VALUE_BYTES * vocab_size


def sparse_fp32_nbytes(f: ExpertFactors) -> int:
    """Bytes of the same sparse factor uncompressed: a uint32 id and a float32 value per token."""
    return (ID_BYTES + VALUE_BYTES) * len(f.token_ids)


def compression_ratio(
    f: ExpertFactors,
    vocab_size: int | None = None,
    against: Literal["dense", "sparse", "values"] = "dense",
) -> float:
    """How many times smaller the 1-bit form is than an uncompressed one.

    - "dense": dense_fp32_nbytes(vocab_size) / packed_nbytes(f), the default. vocab_size defaults to the
      vocabulary size written in f.tokenizer when it is a tokenizer_tag().
    - "sparse": sparse_fp32_nbytes(f) / packed_nbytes(f), i.e. (id + fp32 value) per token; ≈ 1.9x,
      because the ids, which both forms need, dominate.
    - "values": the value payload alone, 4·K / (ceil(K/8) + 4·blocks), ids left out of both sides: the
      BitDelta-style per-element figure, 32 / (1 + 32/block_size) for full blocks, so 21.3x at block 64.
      This is the figure comparable to the paper's ≈29.5x, which it reaches at block_size 384 (29.54x).
    """
    n = len(f.token_ids)
    if against == "dense":
        if vocab_size is None:
            tag = parse_tokenizer_tag(f.tokenizer)
            if tag is None:
                raise ValueError(f"give vocab_size: {f.tokenizer!r} is not a tokenizer_tag() naming one")
            vocab_size = tag.vocab_size
        return dense_fp32_nbytes(vocab_size) / packed_nbytes(f)
    if against == "sparse":
        return sparse_fp32_nbytes(f) / packed_nbytes(f)
    if against == "values":
        return VALUE_BYTES * n / ((n + 7) // 8 + VALUE_BYTES * len(f.scales))
    raise ValueError(f'against must be "dense", "sparse" or "values" (got {against!r})')


# -- tokenizer identity -------------------------------------------------------------------------------


_TAG_RE = re.compile(r"(?P<name>.*):(?P<vocab>[0-9]{1,12}):(?P<digest>[0-9a-f]{16})", re.DOTALL)


class TokenizerTag(NamedTuple):
    name: str  # informational: the basename of the tokenizer's name_or_path
    vocab_size: int  # entries in get_vocab(), added tokens included
    digest: str  # first 16 hex digits of the sha256 of the vocabulary (see tokenizer_tag)


def tokenizer_tag(tokenizer: Any) -> str:
    """A stable name for a HF tokenizer: "<basename>:<vocab size>:<16 hex of sha256 of the vocabulary>".

    The digest covers the canonical JSON of the [id, token] pairs sorted by id (added tokens included),
    so two tokenizers with equal tags map every token string to the same id. The name part is for
    people only; tokenizers_match() compares vocabulary size and digest.
    """
    vocab: dict[str, int] = tokenizer.get_vocab()
    pairs = sorted((int(i), str(t)) for t, i in vocab.items())
    blob = json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(blob).hexdigest()[:16]
    raw = str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
    name = PurePath(raw.rstrip("/\\")).name or "tokenizer"
    # Keep the tag within the schema's name limit and free of the separator and control characters.
    name = "".join(c if c.isprintable() and c != ":" else "_" for c in name)
    suffix = f":{len(vocab)}:{digest}"
    return name[: MAX_NAME_CHARS - len(suffix)] + suffix


def parse_tokenizer_tag(tag: str) -> TokenizerTag | None:
    """The parts of a tokenizer_tag() string; None for any other tokenizer name."""
    match = _TAG_RE.fullmatch(tag)
    if match is None:
        return None
    return TokenizerTag(match["name"], int(match["vocab"]), match["digest"])


def tokenizers_match(a: str, b: str) -> bool:
    """Whether factors tagged `a` apply under tokenizer `b`: same vocabulary fingerprint, else same string."""
    ta, tb = parse_tokenizer_tag(a), parse_tokenizer_tag(b)
    if ta is not None and tb is not None:
        return (ta.vocab_size, ta.digest) == (tb.vocab_size, tb.digest)
    return a == b


# -- expert weights and the combined bias ------------------------------------------------------------


def expert_weight(
    confidence: float, eta: float = DEFAULT_FACTOR_ETA, cap: float = DEFAULT_FACTOR_CAP
) -> float:
    """Precision η_i of an expert with reliability q = confidence: eta · log(q / (1 - q)), in [-cap, cap].

    Zero at q = 0.5, negative below; q ≤ 0 gives -cap and q ≥ 1 gives cap (infinite log-odds), unless eta
    is 0. With the defaults the weight is 1 at q ≈ 0.731 and reaches the cap at q ≈ 0.982.
    """
    for name, value in (("confidence", confidence), ("eta", eta), ("cap", cap)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite (got {value})")
    if eta < 0 or cap < 0:
        raise ValueError(f"eta and cap must be non-negative (got eta={eta}, cap={cap})")
    if eta == 0:
        return 0.0
    if confidence <= 0:
        return -float(cap)
    if confidence >= 1:
        return float(cap)
    return float(max(-cap, min(eta * math.log(confidence / (1.0 - confidence)), cap)))


def _accumulate(bias: np.ndarray, f: ExpertFactors, weight: float, label: str) -> int:
    """bias += weight · Δ̂ over the ids below len(bias); ids beyond it are dropped with a warning.

    Returns how many entries were added.
    """
    ids, values = decompress(f)
    inside = ids < len(bias)
    if not inside.all():
        dropped = ids[~inside]
        logger.warning(
            "expert factors of %s: %d token id(s) beyond the vocabulary of %d ignored (largest %d)",
            label, len(dropped), len(bias), int(dropped.max()),
        )  # fmt: skip
    # Ids within one factor are unique, so a fancy-indexed += adds each exactly once.
    bias[ids[inside]] += weight * values[inside].astype(np.float64)
    return int(inside.sum())


def combine(
    factors_with_weights: Iterable[tuple[ExpertFactors, float]],
    vocab_size: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dense bias of shape (vocab_size,): Σ_i η_i Δ̂_i, summed in float64, then cast to dtype on device.

    Token ids ≥ vocab_size cannot be produced by the model and are ignored with a warning.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive (got {vocab_size})")
    bias = np.zeros(vocab_size, dtype=np.float64)
    for i, (f, weight) in enumerate(factors_with_weights):
        if not math.isfinite(weight):
            raise ValueError(f"weight {i} is not finite ({weight})")
        if weight != 0:
            _accumulate(bias, f, weight, f"factor #{i} ({f.tokenizer})")
    return torch.from_numpy(bias).to(device=device, dtype=dtype)


# -- transformers -------------------------------------------------------------------------------------


class ExpertFactorLogitsProcessor(LogitsProcessor):
    """Adds a fixed bias vector to every row of the next-token logits (PoE with token-local experts).

    scores: (batch, V_model) logits. V_model may differ from the bias's length V (the tokenizer's
    vocabulary): an lm_head padded to a multiple of 64/128 gets zeros in the padding; a smaller one
    drops the bias entries it cannot produce (warned once). The result is scores + bias with torch's
    type promotion (float32 at least), so a bf16 score never rounds the bias away; transformers'
    generate() already hands float32 logits to its processors.
    """

    def __init__(self, bias: torch.Tensor) -> None:
        if bias.ndim != 1 or bias.numel() == 0:
            raise ValueError(f"bias must be a non-empty 1-D tensor (got shape {tuple(bias.shape)})")
        if not bool(torch.isfinite(bias).all()):
            raise ValueError("bias must be finite")
        self.bias = bias.detach().to(torch.float32)
        self._fitted: dict[tuple[torch.device, int], torch.Tensor] = {}
        self._warned_truncation = False

    def fitted_bias(self, vocab: int, device: torch.device) -> torch.Tensor:
        """The bias padded with zeros or cut to `vocab` entries, on `device` (cached)."""
        key = (device, vocab)
        fitted = self._fitted.get(key)
        if fitted is None:
            bias = self.bias
            if vocab > len(bias):
                bias = torch.cat([bias, bias.new_zeros(vocab - len(bias))])
            elif vocab < len(bias):
                if not self._warned_truncation and bool(bias[vocab:].any()):
                    logger.warning(
                        "the model scores %d tokens but expert factors cover %d; factors beyond ignored",
                        vocab, len(bias),
                    )  # fmt: skip
                    self._warned_truncation = True
                bias = bias[:vocab]
            fitted = bias.to(device)
            self._fitted[key] = fitted
        return fitted

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.fitted_bias(scores.shape[-1], scores.device)


def build_processor(
    experiences: Iterable[Any],
    tokenizer_name: str,
    vocab_size: int,
    eta: float = DEFAULT_FACTOR_ETA,
    cap: float = DEFAULT_FACTOR_CAP,
    device: torch.device | str | None = None,
) -> ExpertFactorLogitsProcessor | None:
    """The processor for the factors of these experiences, each weighted by expert_weight(confidence).

    `experiences` are zoo.registry.experience.Experience objects (anything with .id, .confidence and
    .factors). Experiences without factors or with weight 0 are skipped; factors tied to a tokenizer that
    does not match `tokenizer_name` (tokenizers_match) are skipped with a warning, once per experience id.
    Returns None when no factor applies (none left, or all their ids lie beyond vocab_size).
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive (got {vocab_size})")
    bias = np.zeros(vocab_size, dtype=np.float64)
    applied = 0
    for e in experiences:
        f: ExpertFactors | None = e.factors
        if f is None:
            continue
        if not tokenizers_match(f.tokenizer, tokenizer_name):
            with _warned_lock:
                first = e.id not in _warned_mismatch
                _warned_mismatch.add(e.id)
            if first:
                logger.warning(
                    "experience %s: expert factors are for tokenizer %r, not this model's %r; ignored",
                    e.id, f.tokenizer, tokenizer_name,
                )  # fmt: skip
            continue
        weight = expert_weight(e.confidence, eta, cap)
        if weight == 0:
            continue
        applied += _accumulate(bias, f, weight, f"experience {e.id}")
    if not applied:
        return None
    return ExpertFactorLogitsProcessor(torch.from_numpy(bias).to(device=device, dtype=torch.float32))


FactorBuilder = Callable[[Sequence[Any]], ExpertFactorLogitsProcessor | None]


def processor_builder(
    backend: Any, eta: float = DEFAULT_FACTOR_ETA, cap: float = DEFAULT_FACTOR_CAP
) -> FactorBuilder | None:
    """experiences -> the logits processor of their factors, for this backend's model (serving and learning
    jobs build it the same way); None when the backend cannot apply factors (no local tokenizer, or no
    logits processors). The tokenizer's tag is computed once here, not per request."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None or not getattr(backend, "supports_logits_processors", False):
        return None
    tag = tokenizer_tag(tokenizer)
    config = getattr(getattr(backend, "model", None), "config", None)
    vocab = int(config.vocab_size) if config is not None else len(tokenizer)

    def build(experiences: Sequence[Any]) -> ExpertFactorLogitsProcessor | None:
        return build_processor(experiences, tag, vocab, eta, cap)

    return build


# -- vLLM ---------------------------------------------------------------------------------------------


def _sparse(bias: torch.Tensor | ExpertFactorLogitsProcessor) -> tuple[torch.Tensor, torch.Tensor]:
    dense = bias.bias if isinstance(bias, ExpertFactorLogitsProcessor) else bias.detach().to(torch.float32)
    ids = torch.nonzero(dense, as_tuple=True)[0]
    return ids, dense[ids]


class VllmRequestLogitsProcessor:
    """vLLM's request-level logits processor form: fn(output_token_ids, logits) -> logits.

    logits is one request's row, shape (V_model,) (a (batch, V_model) tensor works too); the bias is held
    sparse and added in place to the ids below V_model. Exactly two parameters, so vLLM's
    AdapterLogitsProcessor passes (output ids, logits) rather than (prompt ids, output ids, logits).
    """

    def __init__(self, token_ids: torch.Tensor, values: torch.Tensor) -> None:
        self.token_ids = token_ids.to(torch.int64)
        self.values = values.to(torch.float32)
        self._on: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        key = (logits.device, logits.shape[-1])
        on = self._on.get(key)
        if on is None:
            inside = self.token_ids < logits.shape[-1]
            on = (self.token_ids[inside].to(logits.device), self.values[inside].to(logits.device))
            self._on[key] = on
        ids, values = on
        logits.index_add_(logits.ndim - 1, ids, values.to(logits.dtype))
        return logits


def vllm_request_processor(bias: torch.Tensor | ExpertFactorLogitsProcessor) -> VllmRequestLogitsProcessor:
    """The per-request callable (output_token_ids, logits) -> logits for a dense bias or a processor."""
    return VllmRequestLogitsProcessor(*_sparse(bias))


def vllm_extra_args(bias: torch.Tensor | ExpertFactorLogitsProcessor) -> dict[str, Any]:
    """SamplingParams.extra_args that make vllm_logits_processor_class() apply this bias to a request.

    The bias travels sparse as plain lists, which survive vLLM's serialisation to its engine process.
    """
    ids, values = _sparse(bias)
    return {VLLM_EXTRA_ARGS_KEY: {"ids": ids.tolist(), "values": values.tolist()}}


_vllm_class: type | None = None


def vllm_logits_processor_class() -> type:
    """An AdapterLogitsProcessor subclass (vLLM V1 model runner) applying vllm_extra_args() per request.

    Pass it at engine construction (LLM(..., logits_processors=[cls]) or its FQCN) and give each request
    SamplingParams(extra_args=vllm_extra_args(processor)). vLLM is imported here, never at module import.
    """
    global _vllm_class
    if _vllm_class is not None:
        return _vllm_class
    try:
        from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
    except ImportError as err:
        raise RuntimeError(
            "vLLM's V1 logits processor API (vllm.v1.sample.logits_processor) is not importable; "
            "install 'zoo-node[gpu]' on a CUDA machine"
        ) from err

    class ZooExpertFactorsLogitsProcessor(AdapterLogitsProcessor):  # type: ignore[misc, valid-type]
        """Adds each request's expert-factor bias (extra_args[VLLM_EXTRA_ARGS_KEY]) to its logits row."""

        @classmethod
        def validate_params(cls, params: Any) -> None:
            spec = (getattr(params, "extra_args", None) or {}).get(VLLM_EXTRA_ARGS_KEY)
            if spec is None:
                return
            ok = (
                isinstance(spec, dict)
                and isinstance(spec.get("ids"), list)
                and isinstance(spec.get("values"), list)
                and len(spec["ids"]) == len(spec["values"])
                and all(type(i) is int and i >= 0 for i in spec["ids"])
                and all(isinstance(v, int | float) and math.isfinite(v) for v in spec["values"])
            )
            if not ok:
                raise ValueError(f"{VLLM_EXTRA_ARGS_KEY} must be {{'ids': [int >= 0], 'values': [finite]}}")

        def is_argmax_invariant(self) -> bool:
            return False  # a bias can change which token is most likely

        def new_req_logits_processor(self, params: Any) -> Callable[..., torch.Tensor] | None:
            spec = (getattr(params, "extra_args", None) or {}).get(VLLM_EXTRA_ARGS_KEY)
            if not spec or not spec["ids"]:
                return None
            return VllmRequestLogitsProcessor(
                torch.tensor(spec["ids"], dtype=torch.int64),
                torch.tensor(spec["values"], dtype=torch.float32),
            )

    _vllm_class = ZooExpertFactorsLogitsProcessor
    return _vllm_class
