"""The OpenAI API's agent and evaluation features (issue 36), each beside its simplest alternative in the
same run, on the bundled model through the engine the node serves with (llamacpp by default):

1. Tool calls: the share of answers that are a valid call (it parses, names a tool, its arguments
   validate) under `required` and under `auto`, with the grammar (what the node does) and without it
   (the tools only described in the prompt, the simplest alternative).
2. Log-probabilities: decode time per generated token with `top_logprobs` 5 and 20 against none,
   alternating, alone and with 4 requests at once.
3. n = 4: one request for 4 choices (one prefill, copied) against 4 separate requests of the same prompt
   at once (what a client without n sends), on a long prompt and a short one.

Usage: ./zoo bench api [--only 1,2,3] [--backend llamacpp|transformers] [--runs 4] [--samples 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.pop("OMP_WAIT_POLICY", None)  # passive OpenMP waits slow llama.cpp two- to threefold

from zoo.inference.backend_protocol import ChoiceGroup, GenerationRequest, ResponseFormat, generate  # noqa: E402
from zoo.inference.engine import choice_seed  # noqa: E402
from zoo.inference.tools import Tool, ToolSpec, parse_answer, render_turns  # noqa: E402

THREADS = 2
WEATHER = Tool(
    "get_weather",
    "The current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ADD = Tool(
    "add",
    "Add two numbers.",
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)
CONVERT = Tool(
    "convert_currency",
    "Convert an amount of money between currencies.",
    {
        "type": "object",
        "properties": {
            "amount": {"type": "number"},
            "from": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
            "to": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
        },
        "required": ["amount", "from", "to"],
    },
)
# Questions each of which one of the tools answers.
QUESTIONS = [
    "What is the weather in Lisbon right now?",
    "What is 17 plus 25?",
    "How many euros are 40 US dollars?",
    "Is it raining in Oslo today?",
    "Add 3.5 and 4.25 for me.",
    "Convert 100 GBP to JPY.",
    "What's the temperature in Nairobi?",
    "What is the sum of 1200 and 34?",
]
LONG_PROMPT = " ".join(["Here is some background about the history of bread baking in Europe."] * 40)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="1,2,3")
    ap.add_argument("--backend", choices=("llamacpp", "transformers"), default="llamacpp")
    ap.add_argument("--runs", type=int, default=4, help="alternating runs for the timing figures")
    ap.add_argument("--samples", type=int, default=16, help="questions per tool-call cell (cycled)")
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",")}
    backend = load(args.backend)
    print(f"on the {args.backend} backend, {THREADS} threads")
    try:
        if 1 in only:
            tool_calls(backend, args.samples)
        if 2 in only:
            logprob_cost(backend, args.runs)
        if 3 in only:
            choices_vs_requests(backend, args.runs)
    finally:
        asyncio.run(backend.close())


def load(name: str) -> Any:
    if name == "llamacpp":
        from zoo.inference.bundled_models import bundled_gguf
        from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend.load(bundled_gguf(), "local", max_batch_size=16, threads=THREADS)
    import torch

    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.inference.transformers_backend import TransformersBackend
    from zoo.node.config import default_cache_dir

    torch.set_num_threads(THREADS)
    return TransformersBackend.load(
        prepare_bundled_chat_model(default_cache_dir()).path, "local", max_batch_size=16
    )


def run(backend: Any, requests: list[GenerationRequest]) -> list:
    async def go() -> list:
        return list(await asyncio.gather(*(generate(backend, r) for r in requests)))

    return asyncio.run(go())


# ---------------------------------------------------------------------------------------------- 1


def tool_calls(backend: Any, samples: int) -> None:
    print(
        "\n1. tool calls: share of answers that are a valid call (parses, names a tool, arguments validate)"
    )
    tools = (WEATHER, ADD, CONVERT)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(samples)]
    for choice in ("required", "auto"):
        spec = ToolSpec(tools, choice)
        for grammar in (True, False):
            fmt = ResponseFormat("structural_tag", spec.structural_tag()) if grammar else None
            requests = [
                GenerationRequest(
                    render_turns([{"role": "user", "content": q}], spec), max_tokens=80, response_format=fmt
                )
                for q in questions
            ]
            t0 = time.perf_counter()
            answers = run(backend, requests)
            seconds = time.perf_counter() - t0
            parsed = [parse_answer(a.text, spec) for a in answers]
            valid = sum(bool(p.calls) for p in parsed)
            attempted = sum("<tool_call>" in a.text for a in answers)
            how = "grammar (the node)" if grammar else "prompt only      "
            print(
                f"   {choice:8s} {how}: {valid}/{len(questions)} valid calls "
                f"({attempted} answers opened a call), {seconds:.1f} s"
            )


# ---------------------------------------------------------------------------------------------- 2


def logprob_cost(backend: Any, runs: int) -> None:
    print("\n2. log-probabilities: ms per generated token (decode and scoring), alternating runs")
    ask = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    tokens = 128
    for concurrent in (1, 4):
        times: dict[str, list[float]] = {"none": [], "top 5": [], "top 20": []}
        for _ in range(runs):
            for label, top in (("none", None), ("top 5", 5), ("top 20", 20)):
                requests = [
                    GenerationRequest(ask, max_tokens=tokens, logprobs=top, seed=i, temperature=0.7)
                    for i in range(concurrent)
                ]
                t0 = time.perf_counter()
                results = run(backend, requests)
                generated = sum(r.completion_tokens for r in results)
                times[label].append((time.perf_counter() - t0) * 1000 / generated * concurrent)
        base = statistics.median(times["none"])
        cells = ", ".join(
            f"{label} {statistics.median(v):.2f} ms ({statistics.median(v) / base:.2f}x)"
            for label, v in times.items()
        )
        print(f"   {concurrent} at once, per token of a request: {cells}")


# ---------------------------------------------------------------------------------------------- 3


def choices_vs_requests(backend: Any, runs: int) -> None:
    print("\n3. n = 4 choices in one request vs 4 separate requests of the same prompt at once")
    for name, text in (
        ("long prompt", LONG_PROMPT),
        ("short prompt", "Name a fruit and say why you like it."),
    ):
        one: list[float] = []
        four: list[float] = []
        for r in range(runs):
            seed = 100 + r
            # A prompt of its own for every measurement (no cache of an earlier one helps either way),
            # and the order alternating.
            as_n_ask = [{"role": "user", "content": f"Run {r}, asked once. {text}"}]
            apart_ask = [{"role": "user", "content": f"Run {r}, asked apart. {text}"}]
            group = ChoiceGroup(4)
            as_n = [
                GenerationRequest(
                    as_n_ask, max_tokens=48, temperature=0.8, seed=choice_seed(seed, i), group=group
                )
                for i in range(4)
            ]
            separate = [
                # The same seeds: the same answers, so only how they are scheduled differs.
                GenerationRequest(apart_ask, max_tokens=48, temperature=0.8, seed=choice_seed(seed, i))
                for i in range(4)
            ]
            order = [(as_n, one), (separate, four)]
            for batch, times in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                results = run(backend, batch)
                times.append(sum(x.completion_tokens for x in results) / (time.perf_counter() - t0))
        prompt_tokens = backend.count_prompt_tokens(
            [{"role": "user", "content": f"Run 0, asked once. {text}"}]
        )
        n_rate, sep_rate = statistics.median(one), statistics.median(four)
        print(
            f"   {name} ({prompt_tokens} tokens): n=4 {n_rate:.0f} tok/s, 4 requests {sep_rate:.0f} tok/s "
            f"({n_rate / sep_rate:.2f}x)"
        )


if __name__ == "__main__":
    main()
