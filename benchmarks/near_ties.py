"""How far llama.cpp's batched arithmetic moves a greedy answer (the bound of tests/inference/near_ties.py).

Each prompt is answered alone, then inside batches of 2-8 rows with other prompts, then as copies of one
prefilled cache (five identical requests, the prefix-copy path). For every batched or copied answer, the
log-probabilities of the tokens it shares with the lone answer (up to where they part) are compared:
printed are the largest and 99th-percentile difference, the share of answers that parted, and the lead of
the lone answer's token wherever they parted (a near-tie is a lead within twice the tolerance). The
instruction set is the one this process runs under (`ZOO_TEST_ISA=avx2 ./zoo bench near_ties` caps it
where the CPU has AVX-512; see docs/development.md).

Usage: ./zoo bench near_ties [--rounds 2] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from zoo.inference.backend_protocol import GenerationRequest, GenerationResult, generate
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.inference.near_ties import LOGPROB_TOL, disagreement

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Name a prime number and say why it is prime.",
    "Write a haiku about rust.",
    "What is 7 times 8? Show the steps.",
    "List three colors and say why each one is pretty.",
    "Give me a word that rhymes with cat, and use it in a sentence.",
    "Explain how a rainbow forms, step by step, for a curious child. " * 4,
    "Describe the water cycle to a ten-year-old.",
    "Why do cats purr?",
    "Write a short poem about the sea at night.",
    "What is the capital of France, and what is it famous for?",
    "How does a bicycle stay upright?",
    "Give three tips for learning a new language.",
    "What is photosynthesis?",
    "Summarise the story of Cinderella in three sentences.",
    "How many legs does a spider have, and why?",
    "Explain what a prime number is to a child.",
    "Write a recipe for a simple salad.",
    "What causes the seasons on Earth?",
    "Tell me a fun fact about octopuses.",
    "How do airplanes fly?",
    "Name the planets of the solar system in order.",
    "What is the difference between weather and climate?",
    "Why is exercise good for you?",
]


def request(prompt: str, tokens: int) -> GenerationRequest:
    return GenerationRequest([{"role": "user", "content": prompt}], max_tokens=tokens, logprobs=2)


def accepted_as_the_same(tol: float, alone: dict[str, GenerationResult]) -> str:
    """The test's power: how many pairs of different prompts' answers the near-tie rule would pass."""
    pairs = [(p, q) for p in alone for q in alone if p != q]
    passed = sum(disagreement(alone[p], alone[q], tol) is None for p, q in pairs)
    return f"{passed} of {len(pairs)} pairs of different prompts' answers pass as one at tolerance {tol}"


def compare(alone: GenerationResult, other: GenerationResult, diffs: list[float], leads: list[float]) -> bool:
    """Adds the shared tokens' differences and, where they part, the lone answer's lead; True if parted."""
    assert alone.logprobs is not None and other.logprobs is not None
    for a, o in zip(alone.logprobs, other.logprobs, strict=False):
        if a.bytes == o.bytes and a.eos == o.eos:
            diffs.append(abs(float(a.logprob or 0.0) - float(o.logprob or 0.0)))
            continue
        alternatives = {(t, b): lp for t, b, lp in a.top}
        leads.append(float(a.logprob or 0.0) - alternatives.get((o.token, o.bytes), float("-inf")))
        return True
    return False


async def measure(backend: LlamaCppBackend, rounds: int, tokens: int) -> None:
    alone = {p: await generate(backend, request(p, tokens)) for p in PROMPTS}
    diffs: dict[str, list[float]] = {"batched": [], "copied": []}
    leads: dict[str, list[float]] = {"batched": [], "copied": []}
    answers = {"batched": 0, "copied": 0}
    parted = {"batched": 0, "copied": 0}
    for r in range(rounds):
        for size in (2, 4, 8):
            for start in range(0, len(PROMPTS), size):
                batch = PROMPTS[start : start + size]
                if r % 2:
                    batch = batch[::-1]
                results = await asyncio.gather(*(generate(backend, request(p, tokens)) for p in batch))
                for p, res in zip(batch, results, strict=True):
                    answers["batched"] += 1
                    parted["batched"] += compare(alone[p], res, diffs["batched"], leads["batched"])
            print(f"round {r + 1}: batches of {size} done", file=sys.stderr, flush=True)
        for p in PROMPTS[r :: max(1, len(PROMPTS) // 4)]:
            # Something else first, so the copies come from a fresh prefill, not a cached one.
            await asyncio.gather(*(generate(backend, request(f"Say {i}.", 2)) for i in range(8)))
            copies = await asyncio.gather(*(generate(backend, request(p, tokens)) for _ in range(5)))
            for res in copies:
                answers["copied"] += 1
                parted["copied"] += compare(alone[p], res, diffs["copied"], leads["copied"])
    print(f"llama.cpp: {system_info()}")
    print(accepted_as_the_same(LOGPROB_TOL, alone))
    for path in ("batched", "copied"):
        d = sorted(diffs[path])
        p99 = d[int(0.99 * (len(d) - 1))]
        shown = ", ".join(f"{x:.4f}" for x in sorted(leads[path])) or "none"
        print(
            f"{path}: {answers[path]} answers, {len(d)} tokens shared with the lone answer; "
            f"|logprob difference| max {d[-1]:.5f}, p99 {p99:.5f}, median {statistics.median(d):.6f}; "
            f"{parted[path]} parted from it ({parted[path] / answers[path]:.1%}), "
            f"where the lone answer's token led by {shown}"
        )


def system_info() -> str:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    return " ".join(f for f in info.split("|") if "AVX" in f or "FMA" in f).replace("  ", " ").strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    backend = LlamaCppBackend.load(
        bundled_gguf(),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        max_batch_size=8,
        context_length=1024,
        threads=2,
    )
    try:
        asyncio.run(measure(backend, args.rounds, args.tokens))
    finally:
        asyncio.run(backend.close())


if __name__ == "__main__":
    main()
