"""Locate the JavaScript tools zoo-node runs (anvil, solcjs, OpenZeppelin, js-ipfs) in node_modules.

`./zoo setup` installs them with `npm ci` from the committed package-lock.json into the repository's
node_modules. An installed (non-editable) zoo-node finds them through ZOO_NODE_MODULES.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class JsToolMissing(RuntimeError):
    """A JavaScript tool that zoo-node needs is not installed.

    Not a ZooError: contracts is the layer below registry, where ZooError lives, and imports nothing of
    zoo's; it is a build tool's error that no client sees.
    """


def node_modules_dir() -> Path:
    """The node_modules folder holding zoo-node's JavaScript tools."""
    env = os.environ.get("ZOO_NODE_MODULES")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise JsToolMissing(f"ZOO_NODE_MODULES={env} is not a directory")
        return path
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "node_modules"
        if (candidate / "@foundry-rs").is_dir() or (candidate / "solc").is_dir():
            return candidate
    raise JsToolMissing(
        "zoo-node's JavaScript tools are not installed: run `./zoo setup` in the zoo-node checkout "
        "(or set ZOO_NODE_MODULES to a node_modules folder installed from its package-lock.json)"
    )


def node_binary() -> str:
    """The `node` executable (Node.js 20+)."""
    found = shutil.which("node")
    if not found:
        raise JsToolMissing("Node.js (`node`) is not on PATH; zoo-node needs Node.js 20 or newer")
    return found


def anvil_binary() -> Path:
    """The native anvil binary (launched directly, never through the Node wrapper, so it can be killed)."""
    path = node_modules_dir() / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
    if not path.is_file():
        raise JsToolMissing(f"anvil binary not found at {path}; run `./zoo setup`")
    return path


def jsipfs_cli() -> Path:
    """The js-ipfs command-line entry point (run with `node`)."""
    path = node_modules_dir() / "ipfs" / "src" / "cli.js"
    if not path.is_file():
        raise JsToolMissing(f"js-ipfs not found at {path}; run `./zoo setup`")
    return path
