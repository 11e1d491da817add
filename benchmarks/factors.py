"""Benchmark expert factors: storage of the 1-bit form, and the decode-time cost of applying them.

Storage, for K factor tokens in blocks of 64 over the bundled model's 49152-token vocabulary:
- dense fp32: one float32 per vocabulary entry (4 · 49152 B);
- sparse fp32: a uint32 id and a float32 value per token (8 · K B);
- 1-bit: K uint32 ids + ceil(K/8) sign bytes + one float32 scale per block (inference/factors.py);
- values only: the BitDelta-style per-element figure (ids left out of both sides), the one comparable
  to the paper's ≈29.5x; 21.3x at block 64, and 29.5x at block 384 (printed for reference);
- JSON: what the factors add to an experience's canonical encoding (decimal ids, base64 signs/scales).

Decode overhead: greedy generation of exactly 64 new tokens on the bundled model, with and without an
ExpertFactorLogitsProcessor built from 4 experiences of 256 factor tokens each, alternated in the same
run (median tokens/s of each and their ratio), plus the processor's own time per decoding step.
The default dtype is float32: it decodes faster than bf16 on CPUs without bf16 units, so the relative
overhead it shows is the larger (conservative) one; --dtype bfloat16 is the node's default setting.

Run: .venv/bin/python benchmarks/factors.py [--repeats N] [--dtype float32|bfloat16] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.factors import (
    ExpertFactorLogitsProcessor,
    build_processor,
    compress,
    compression_ratio,
    dense_fp32_nbytes,
    packed_nbytes,
    sparse_fp32_nbytes,
    tokenizer_tag,
)
from zoo.registry.canonical import encode_experience
from zoo.registry.experience import Experience

VOCAB = 49152  # the bundled SmolLM2 tokenizer's vocabulary
BLOCK = 64
NEW_TOKENS = 64
AUTHOR = "0x" + "ab" * 20


def _experience(i: int, factors: object | None, confidence: float = 0.75) -> Experience:
    return Experience.create(
        text=f"When benchmarking expert factors, apply lesson number {i}.",
        domain="bench.factors",
        confidence=confidence,
        author=AUTHOR,
        base_model="smollm2-135m-instruct",
        created_at="2025-10-17T12:00:00Z",
        factors=factors,  # type: ignore[arg-type]
    )


def storage_table(tag: str) -> None:
    rng = np.random.default_rng(0)
    print(f"storage, vocabulary {VOCAB}, block {BLOCK} (bytes; ratio = uncompressed / 1-bit)")
    header = ("K", "1-bit B", "dense B", "sparse B", "JSON B", "dense x", "sparse x", "values x")
    print("  " + " ".join(f"{h:>9}" for h in header))
    for k in (64, 256, 1024):
        f = compress(rng.choice(VOCAB, size=k, replace=False), rng.normal(size=k), tag, block_size=BLOCK)
        json_bytes = len(encode_experience(_experience(0, f))) - len(encode_experience(_experience(0, None)))
        row = (
            k,
            packed_nbytes(f),
            dense_fp32_nbytes(VOCAB),
            sparse_fp32_nbytes(f),
            json_bytes,
            f"{compression_ratio(f, VOCAB):.1f}",
            f"{compression_ratio(f, against='sparse'):.2f}",
            f"{compression_ratio(f, against='values'):.2f}",
        )
        print("  " + " ".join(f"{v:>9}" for v in row))
    f = compress(np.arange(3072), rng.normal(size=3072), tag, block_size=384)
    print(f"  values x at block 384 (K=3072): {compression_ratio(f, against='values'):.2f}")


def decode_overhead(repeats: int, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    path = prepare_bundled_chat_model(Path.home() / ".cache" / "zoo-node").path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    tag = tokenizer_tag(tokenizer)

    rng = np.random.default_rng(1)
    experiences = [
        _experience(
            i, compress(rng.choice(VOCAB, 256, replace=False), rng.normal(size=256), tag), 0.6 + i / 10
        )
        for i in range(4)
    ]
    builds = []
    for _ in range(5):  # the first call in a process also pays numpy/torch warm-up; median of 5
        started = time.perf_counter()
        processor = build_processor(experiences, tag, len(tokenizer))
        builds.append((time.perf_counter() - started) * 1000)
    build_ms = statistics.median(builds)
    assert isinstance(processor, ExpertFactorLogitsProcessor)

    messages = [{"role": "user", "content": "Explain how a bicycle stays upright."}]
    ids = torch.tensor(
        [
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        ]
    )
    kwargs = {
        "max_new_tokens": NEW_TOKENS,
        "min_new_tokens": NEW_TOKENS,  # no early end-of-sequence: both runs decode exactly 64 tokens
        "do_sample": False,
        "attention_mask": torch.ones_like(ids),
    }

    def run(processors: LogitsProcessorList | None) -> tuple[float, float]:
        """(tokens per wall second, tokens per CPU second of this process)."""
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            out = model.generate(ids, logits_processor=processors, **kwargs)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert out.shape[1] - ids.shape[1] == NEW_TOKENS
        return NEW_TOKENS / wall, NEW_TOKENS / cpu

    with_factors = LogitsProcessorList([processor])
    run(None), run(with_factors)  # warm-up: allocator, kernels
    plain: list[tuple[float, float]] = []
    factored: list[tuple[float, float]] = []
    for r in range(repeats):  # alternated A B, B A, ... so drifting machine load hits both alike
        if r % 2:
            factored.append(run(with_factors))
            plain.append(run(None))
        else:
            plain.append(run(None))
            factored.append(run(with_factors))

    scores = torch.randn(1, len(tokenizer))
    processor(ids, scores)  # fit the bias to this vocabulary once, as generate() does on its first step
    calls = 2000
    started = time.perf_counter()
    for _ in range(calls):
        processor(ids, scores)
    step_us = (time.perf_counter() - started) / calls * 1e6

    print(
        f"decode, greedy {NEW_TOKENS} tokens, {dtype}, {torch.get_num_threads()} threads, {repeats} runs each"
    )
    print(f"  build_processor (4 experiences x 256 tokens): {build_ms:.2f} ms")
    # CPU seconds of this process are less disturbed than wall time when other jobs share the cores.
    for i, clock in enumerate(("wall", "CPU")):
        p = statistics.median(r[i] for r in plain)
        f = statistics.median(r[i] for r in factored)
        print(f"  {clock:>4} clock: without {p:.2f} tokens/s, with {f:.2f} tokens/s, ratio {f / p:.3f}")
        print(f"    runs without: {', '.join(f'{r[i]:.2f}' for r in plain)}")
        print(f"    runs with:    {', '.join(f'{r[i]:.2f}' for r in factored)}")
    plain_step_us = 1e6 / statistics.median(r[0] for r in plain)
    print(
        f"  processor per step: {step_us:.1f} us ({step_us / plain_step_us * 100:.3f}% of a plain wall step)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="generations timed with and without")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    storage_table(f"smollm2-135m-instruct:{VOCAB}:{'0' * 16}")
    print()
    decode_overhead(args.repeats, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
