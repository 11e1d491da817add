"""Clients people point at an OpenAI-compatible server, run unchanged against a real node over a socket:
lm-evaluation-harness (generation through chat completions, multiple choice by log-likelihood through
completions) with the repository's local task (benchmarks/lmeval/, no network); LangChain's ChatOpenAI
(bind_tools and a two-step tool loop); the OpenAI Agents SDK (an agent with a function tool, on its
chat-completions model provider). Each test checks what the client received, not only that it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeProcess, base_config, launch, write_config
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "benchmarks" / "lmeval"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("outside-clients")
    cfg = write_config(tmp / "node.toml", base_config(tmp / "data", {"p2p": {"enabled": False}}))
    n = launch(cfg, tmp / "data")
    try:
        n.wait_listening()
        n.wait_component("model", "SERVING")
        yield n
    finally:
        n.stop()


def http(node: NodeProcess) -> str:
    return str(node.info["http"])


def lm_eval(
    model: str, model_args: dict[str, str], task: str, out: Path, *extra: str
) -> tuple[dict, list[dict]]:
    """Run lm-eval's own CLI; returns its results and the per-document samples it logged."""
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    cmd = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", args, "--tasks", task]
    cmd += ["--include_path", str(TASKS), "--output_path", str(out), "--log_samples", *extra]
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(out / "datasets")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"|{task}" in run.stdout  # the score table it prints
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"][task]
    samples = [
        json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()
    ]
    return results, samples


def test_lm_eval_scores_multiple_choice_by_the_nodes_log_likelihoods(
    node: NodeProcess, tmp_path: Path
) -> None:
    tokenizer_dir = prepare_bundled_chat_model(default_cache_dir()).path
    model_args = {
        "model": MODEL,
        "base_url": http(node) + "/v1/completions",
        "tokenizer": str(tokenizer_dir),  # lm-eval tokenizes itself and sends token ids (its default)
        "num_concurrent": "1",
        "max_retries": "1",
    }
    results, samples = lm_eval("local-completions", model_args, "zoo_capitals_mc", tmp_path)
    assert len(samples) == 10
    # Its accuracy is what the log-likelihoods it received say: the right choice scored highest. (The
    # samples it logs hold each (log-likelihood, is-greedy) pair as strings.)
    picked = [max(range(4), key=lambda i, s=s: float(s["resps"][i][0][0])) for s in samples]
    accuracy = sum(p == s["doc"]["answer"] for p, s in zip(picked, samples, strict=True)) / len(samples)
    assert results["acc,none"] == pytest.approx(accuracy)
    assert accuracy >= 0.5  # far above chance (0.25) for the bundled model on capitals
    # Each is the sum of the continuation tokens' log-probabilities the node reports for the text.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    doc = samples[0]
    for i in range(4):
        context, choice = (doc["arguments"][f"gen_args_{i}"][k] for k in ("arg_0", "arg_1"))
        ids = tok(context, add_special_tokens=False)["input_ids"]
        cont = tok(context + choice, add_special_tokens=False)["input_ids"][len(ids) :]
        body = {"model": MODEL, "prompt": ids + cont, "max_tokens": 1, "echo": True, "logprobs": 1}
        lp = httpx.post(http(node) + "/v1/completions", json=body, timeout=60).json()["choices"][0][
            "logprobs"
        ]
        direct = sum(lp["token_logprobs"][len(ids) : len(ids) + len(cont)])
        assert float(doc["resps"][i][0][0]) == pytest.approx(direct, abs=1e-6)


def test_lm_eval_generates_through_chat_completions(node: NodeProcess, tmp_path: Path) -> None:
    model_args = {
        "model": MODEL,
        "base_url": http(node) + "/v1/chat/completions",
        "num_concurrent": "1",
        "max_retries": "1",
    }
    results, samples = lm_eval(
        "local-chat-completions", model_args, "zoo_capitals_gen", tmp_path, "--apply_chat_template"
    )
    assert len(samples) == 10
    answers = [s["resps"][0][0] for s in samples]
    named = [s["doc"]["capital"].lower() in a.lower() for s, a in zip(samples, answers, strict=True)]
    assert results["names_capital,none"] == pytest.approx(sum(named) / len(named))
    # What it received is the node's (greedy) answer to the same question asked directly.
    question = json.loads(samples[3]["arguments"]["gen_args_0"]["arg_0"][0])
    body = {"model": MODEL, "messages": question, "max_tokens": 24, "temperature": 0, "stop": ["\n\n"]}
    direct = httpx.post(http(node) + "/v1/chat/completions", json=body, timeout=60).json()
    assert direct["choices"][0]["message"]["content"] == answers[3]


# ---------------------------------------------------------------------------------------------- agents


def test_langchain_binds_tools_and_runs_a_two_step_loop(node: NodeProcess) -> None:
    from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    llm = ChatOpenAI(
        model=MODEL,
        base_url=http(node) + "/v1",
        api_key="unused",
        temperature=0,
        max_tokens=60,
        max_retries=0,
    )
    bound = llm.bind_tools([add], tool_choice="required")
    messages = [HumanMessage("What is 2 + 3? Use the add tool.")]
    ai = bound.invoke(messages)
    assert ai.response_metadata["finish_reason"] == "tool_calls" and ai.tool_calls
    call = ai.tool_calls[0]
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    assert all(isinstance(v, int | float) for v in call["args"].values())
    # Streamed, LangChain assembles the same call from the deltas.
    merged: AIMessageChunk | None = None
    for piece in bound.stream(messages):
        merged = piece if merged is None else merged + piece
    assert merged is not None and [(c["name"], c["args"]) for c in merged.tool_calls] == [
        (call["name"], call["args"])
    ]
    # Step two: the tool's result goes back, and the model answers in text.
    messages += [ai, ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])]
    final = llm.invoke(messages)
    assert final.response_metadata["finish_reason"] == "stop" and final.content and not final.tool_calls


def test_an_openai_agents_agent_calls_its_function_tool_through_the_node(node: NodeProcess) -> None:
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"Sunny and 21 C in {city}."

    async def run() -> tuple:
        client = AsyncOpenAI(base_url=http(node) + "/v1", api_key="unused", max_retries=0)
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        settings = ModelSettings(tool_choice="required", max_tokens=60, temperature=0)
        weather = Agent(
            name="weather",
            instructions="Answer weather questions with the get_weather tool.",
            tools=[get_weather],
            model=model,
            model_settings=settings,
            tool_use_behavior="stop_on_first_tool",
        )
        called = await Runner.run(weather, "What is the weather in Lisbon?", max_turns=3)
        plain = Agent(
            name="plain",
            instructions="Answer briefly.",
            model=model,
            model_settings=ModelSettings(max_tokens=30),
        )
        answered = await Runner.run(plain, "Name a colour.", max_turns=1)
        await client.close()
        return called, answered

    called, answered = asyncio.run(run())
    assert len(cities) == 1 and cities[0].strip()  # the model's call reached the tool, its arguments valid
    assert called.final_output == f"Sunny and 21 C in {cities[0]}."  # the tool's output ended the run
    kinds = [type(item) for item in called.new_items]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem]
    assert isinstance(answered.final_output, str) and answered.final_output.strip()
    assert [type(item) for item in answered.new_items] == [MessageOutputItem]
