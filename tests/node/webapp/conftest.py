"""A light node on its own devnet (real anvil, IPFS and contracts; no model), serving the web app: what the
web app's tests open, over HTTP and in a real browser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import NodeProcess, base_config, launch, write_config


def start_light_devnet_node(where: Path, http: dict | None = None) -> NodeProcess:
    extra = {
        "chain": {"mode": "devnet", "poll_interval_s": 0.3},
        "model": {"backend": "none"},
        "p2p": {"enabled": False},
        **({"http": http} if http else {}),
    }
    where.mkdir(parents=True, exist_ok=True)
    data_dir = where / "data"
    node = launch(write_config(where / "node.toml", base_config(data_dir, extra)), data_dir)
    node.wait_listening(timeout_s=120)
    node.wait_component("library", "SERVING", timeout_s=180)
    return node


@pytest.fixture(scope="module")
def light_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = start_light_devnet_node(tmp_path_factory.mktemp("webapp-node"))
    try:
        yield node
    finally:
        node.stop()
