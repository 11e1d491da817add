"""The options every command group shares, defined once (typer reads them as parameter defaults)."""

from __future__ import annotations

import typer

ConfigOpt = typer.Option(None, "--config", "-c", help="TOML config file (env ZOO_NODE_* overrides it).")
DataDirOpt = typer.Option(None, "--data-dir", help="Data directory (default ~/.local/share/zoo-node).")
KeyOpt = typer.Option(
    None, "--key", help="Signing key: devN, env:VAR or keystore:PATH (default on the devnet: dev0)."
)
NodeAddressOpt = typer.Option(None, "--address", help="HOST:PORT of the node (default: from data dir).")
JsonTableOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")
