"""`zoo-node devnet up|down|reset|status|warp`: the local chain + IPFS + contracts for running and testing."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import load
from zoo.node.cli.options import ConfigOpt, DataDirOpt

app = typer.Typer(
    help="Local devnet: anvil chain, IPFS daemon, deployed contracts, dev accounts. Its chain and IPFS "
    "repository are kept across stops and crashes; `reset` deletes them.",
    no_args_is_help=True,
)


def _devnet(config: Path | None, data_dir: Path | None):
    from zoo.devnet.manager import Devnet
    from zoo.node.endpoints import devnet_settings

    cfg = load(config, data_dir=data_dir and str(data_dir))
    return Devnet(cfg.data_dir, devnet_settings(cfg), cfg.cache_dir)


@app.command()
def up(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Start the devnet (or reuse the one already running) and print its endpoints."""
    from zoo.devnet.manager import DevnetError

    devnet = _devnet(config, data_dir)
    t0 = time.perf_counter()
    try:
        with err.status("starting devnet…") as status:
            info, reused = devnet.up(progress=lambda msg: status.update(f"devnet: {msg}…"))
    except (DevnetError, RuntimeError, OSError) as e:
        err.print(f"[red]devnet failed to start: {e}[/red]")
        raise typer.Exit(1) from None
    took = time.perf_counter() - t0
    err.print(f"devnet {'already running' if reused else 'up'} in {took:.1f} s")
    _print(info, devnet.state_file)


@app.command()
def down(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Stop exactly the processes this data dir's devnet started; its chain is kept for the next `up`."""
    stopped = _devnet(config, data_dir).down()
    err.print(f"stopped {', '.join(stopped)}" if stopped else "no devnet process was running")


@app.command()
def reset(
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Stop the devnet and delete its chain and IPFS repository; the next start deploys a new one."""
    devnet = _devnet(config, data_dir)
    if not yes and not typer.confirm(
        f"Delete the devnet in {devnet.dir} (every proposal, vote and library version on its chain)?"
    ):
        err.print("nothing deleted")
        raise typer.Exit(1)
    stopped = devnet.reset()
    err.print(
        (f"stopped {', '.join(stopped)}; " if stopped else "")
        + f"deleted the devnet chain and IPFS repository in {devnet.dir}"
    )


@app.command()
def status(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Show whether the devnet is up, and its endpoints."""
    from zoo.devnet.manager import DevnetError

    devnet = _devnet(config, data_dir)
    try:
        info = devnet.running()
    except DevnetError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    if info is None:
        err.print("devnet is not running (start it with `zoo-node devnet up`)")
        raise typer.Exit(1)
    _print(info, devnet.state_file)


@app.command()
def warp(
    seconds: int = typer.Argument(..., min=1, help="Seconds to move the chain clock forward."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Move the devnet chain's clock forward (to end a voting period without waiting)."""
    from web3 import Web3

    from zoo.devnet.info import warp as do_warp

    info = _devnet(config, data_dir).running()
    if info is None:
        err.print("devnet is not running")
        raise typer.Exit(1)
    ts = do_warp(Web3(Web3.HTTPProvider(info.rpc_url)), seconds)
    out.print(f"chain time is now {ts} ({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ts))} UTC)")


def _print(info, state_file: Path) -> None:
    table = Table(show_header=False, box=None)
    table.add_row("rpc", info.rpc_url)
    table.add_row("chain id", str(info.chain_id))
    table.add_row("ipfs api", info.ipfs_api)
    table.add_row("KeeperToken", info.token_address)
    table.add_row("ExperienceRegistry", info.registry_address)
    s = info.settings
    table.add_row("voting period", f"{s['voting_period_s']} s (+{s['execution_delay_s']} s delay)")
    if info.genesis:
        g = info.genesis
        table.add_row("genesis library", f"version {g['version']} root {g['root']} cid {g['cid']}")
    table.add_row("accounts", ", ".join(f"{a['name']}={a['address']}" for a in info.accounts[:3]) + ", …")
    table.add_row("state", str(state_file))
    table.add_row("chain state", str(state_file.parent / "chain-state.json") + " (kept across restarts)")
    out.print(table)
