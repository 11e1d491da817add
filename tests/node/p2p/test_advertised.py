"""What a node advertises (zoo.node.components.wiring.capabilities): no model while it cannot answer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from zoo.node.components.wiring import capabilities
from zoo.node.config_loading import load_config


def test_a_node_advertises_its_model_only_while_its_model_component_can_answer(tmp_path: Path) -> None:
    cfg = load_config(None, environ={}, overrides={"data_dir": str(tmp_path)})
    library = SimpleNamespace(version=3, root="0x" + "ab" * 32)
    admission = SimpleNamespace(stats=lambda: SimpleNamespace(running=1, waiting=1, slots=4))
    answering = [False]
    now = capabilities(
        cfg, "base", "cd" * 32, library, admission, lambda: "127.0.0.1:1", "", lambda: answering[0]
    )

    loading = now()  # still loading, or its upstream is down: no routing target, but still a peer
    assert loading.models == [] and loading.library_version == 3 and loading.load == 0.5
    answering[0] = True
    assert now().models == ["base"]
