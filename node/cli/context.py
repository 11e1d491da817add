"""What the command groups share beyond their options (options.py) and consoles (console.py): the
configuration a command runs with (`load`), the error exit (`fail`), and the connection to the chain's
registry and ledger of the dao, credits and library commands (`connect`, `Dao`, `ledger_of`, `reverts`).

Every group imports these from here, so main.py only assembles the app and nothing imports it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from zoo.node.cli.console import err


def load(config: Path | None, **overrides: Any) -> Any:
    from zoo.node.config_loading import ConfigError, load_config

    flat = {k: v for k, v in overrides.items() if v is not None}
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        return load_config(config, overrides=tree)
    except ConfigError as e:
        err.print(f"[red]zoo-node: {e}[/red]", highlight=False)
        raise typer.Exit(2) from None


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]{escape(message)}[/red]", highlight=False)
    return typer.Exit(code)


@dataclass
class Dao:
    w3: Any
    registry: Any
    devnet: bool
    ipfs_api: str | None
    cfg: Any
    ledger_address: str | None = None


def connect(config: Path | None, data_dir: Path | None, key: str | None, need_key: bool) -> Dao:
    from web3 import Web3

    from zoo.node.endpoints import EndpointsUnavailable, resolve_endpoints
    from zoo.registry.chain import RegistryClient
    from zoo.registry.keys import KeyLoadError, load_signer

    cfg = load(config, data_dir=data_dir and str(data_dir))
    try:
        ep = resolve_endpoints(cfg)
    except EndpointsUnavailable as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    signer = None
    if need_key:
        spec = key or ("dev0" if ep.devnet else None)
        if spec is None:
            err.print("[red]--key is required off the devnet (devN, env:VAR or keystore:PATH)[/red]")
            raise typer.Exit(2)
        try:
            signer = load_signer(spec)
        except (KeyLoadError, ValueError, OSError) as e:
            err.print(f"[red]cannot load signing key: {e}[/red]")
            raise typer.Exit(2) from None
        err.print(f"signing as {signer.address}")
    w3 = Web3(Web3.HTTPProvider(ep.rpc_url, request_kwargs={"timeout": 30}))
    registry = RegistryClient(w3, ep.registry_address, signer)
    return Dao(w3, registry, ep.devnet, ep.ipfs_api, cfg, ep.ledger_address)


@contextmanager
def reverts() -> Iterator[None]:
    """Show chain errors as one readable line and exit 1."""
    from zoo.registry.chain import ChainError

    try:
        yield
    except ChainError as e:
        err.print(f"[red]refused: {e}[/red]")
        raise typer.Exit(1) from None
    except ValueError as e:
        err.print(f"[red]invalid input: {e}[/red]")
        raise typer.Exit(2) from None


def ledger_of(dao: Dao, signer: Any = None) -> Any:
    """A client of the UsageLedger (signing with `signer`, if given); exits 1 when none is configured."""
    from zoo.registry.chain import LedgerClient

    if not dao.ledger_address:
        err.print("[red]no UsageLedger is configured: set chain.ledger_address (a devnet has one)[/red]")
        raise typer.Exit(1)
    return LedgerClient(dao.w3, dao.ledger_address, signer)
