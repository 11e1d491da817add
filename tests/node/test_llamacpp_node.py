"""A node on the llama.cpp backend (the default for the bundled model on a CPU): it answers over HTTP with
torch and transformers unimportable when its library is empty, loads the embedder once a library needs
it, and refuses a configuration it cannot serve with a message naming the key."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import base_config, launch, write_config
from zoo.inference.bundled_models import bundled_gguf
from zoo.node.api.http.routes import BUNDLED_EMBEDDER_ID
from zoo.node.client import NodeClient
from zoo.node.components.probes import ModelComponent
from zoo.node.config import ModelConfig, llamacpp_installed

pytestmark = pytest.mark.skipif(
    not llamacpp_installed(), reason="llama-cpp-python is built by ./zoo setup; its build failed here"
)
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_auto_picks_llamacpp_for_a_gguf_on_cpu_and_transformers_otherwise(tmp_path: Path) -> None:
    assert ModelConfig().backend == "llamacpp"
    assert ModelConfig(path=tmp_path / "m.gguf").backend == "llamacpp"
    assert ModelConfig(path=tmp_path).backend == "transformers"  # a weights directory
    assert ModelConfig(device="cuda").backend == "transformers"
    with pytest.raises(ValueError, match="GGUF"):
        ModelConfig(backend="llamacpp", path=tmp_path)
    with pytest.raises(ValueError, match="CPU"):
        ModelConfig(backend="llamacpp", device="cuda")


def test_a_node_with_an_empty_library_answers_without_torch_or_transformers(tmp_path: Path) -> None:
    # Importing any of these in the node fails loudly: the answer below proves its path never does.
    blocked = tmp_path / "blocked"
    for name in ("torch", "transformers", "sentence_transformers", "xgrammar"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    data_dir = tmp_path / "data"
    cfg = write_config(tmp_path / "node.toml", base_config(data_dir, {"model": {"threads": 2}}))
    node = launch(cfg, data_dir, env={"PYTHONPATH": str(blocked)})
    try:
        node.wait_listening()
        node.wait_component("model", "SERVING")
        url = str(node.info["http"]) + "/v1/chat/completions"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Name a prime number."}],
            "max_tokens": 8,
        }
        reply = httpx.post(url, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"].strip()
        with NodeClient(node.address) as c:
            states = {s.name: s.detail for s in c.status().components}
        assert "llamacpp" in states["model"]
        assert "embedder not loaded" in states["retrieval"]
    finally:
        node.stop()
    log = node.log()
    assert "backend=llamacpp" in log
    assert "was imported" not in log


def test_an_embeddings_request_loads_the_deferred_embedder(start_node) -> None:
    node = start_node({"model": {"threads": 2}})
    node.wait_component("model", "SERVING")
    url = str(node.info["http"]) + "/v1/embeddings"
    body = {"model": BUNDLED_EMBEDDER_ID, "input": "The area of a triangle."}
    first = httpx.post(url, json=body, timeout=30)
    assert first.status_code == 503 and "loading" in first.text  # asked for, not there yet
    node.wait_component("retrieval", "DEGRADED")
    deadline = time.monotonic() + 120
    while (
        reply := httpx.post(url, json=body, timeout=30)
    ).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["data"][0]["embedding"]) == 384
    with NodeClient(node.address) as c:
        deadline = time.monotonic() + 10  # the component is probed once a second
        while "no library to index yet" not in (
            detail := {s.name: s.detail for s in c.status().components}["retrieval"]
        ):
            assert time.monotonic() < deadline, detail
            time.sleep(0.1)


def test_a_llamacpp_config_the_node_cannot_serve_is_refused_at_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    cfg = write_config(
        tmp_path / "node.toml",
        base_config(data_dir, {"model": {"backend": "llamacpp", "path": str(tmp_path)}}),
    )
    done = subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "start", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "model" in done.stderr and "GGUF" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stop_after_s", [0.0, 0.02, 0.1, 0.3, 1.5])
def test_a_model_stopped_anywhere_in_its_load_leaves_no_native_thread_running(stop_after_s: float) -> None:
    # A node stopped while llama.cpp loads (or runs the readiness token) must not exit with llama.cpp's
    # loader or scheduler still in C: the interpreter's teardown under them crashed a node (SIGSEGV).
    async def start_then_stop() -> ModelComponent:
        comp = ModelComponent(ModelConfig(threads=1), bundled_gguf(), MODEL)
        setup = asyncio.create_task(comp.setup())
        await asyncio.sleep(stop_after_s)
        setup.cancel()  # what the supervisor does first on shutdown
        with contextlib.suppress(asyncio.CancelledError):
            await setup
        await comp.stop()
        return comp

    comp = asyncio.run(start_then_stop())
    assert comp.backend is None
    for thread in threading.enumerate():
        if thread.name in ("load-model", "llamacpp-scheduler"):
            thread.join(5)  # the load thread returns right after it reports idle
            assert not thread.is_alive(), f"{thread.name} still runs after the model component stopped"
