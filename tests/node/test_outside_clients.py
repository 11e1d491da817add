"""Clients people point at an OpenAI-compatible server, run unchanged against a real node over a socket:
lm-evaluation-harness (generation through chat completions, multiple choice by log-likelihood through
completions), with the repository's local task (benchmarks/lmeval/, no network). Each test checks what the
client received against what the node answers when asked directly."""

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
from zoo.inference.models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ROOT = Path(__file__).resolve().parents[2]
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
