"""`zoo-node dao …`: contributors propose library versions, KEEPER holders vote and execute.

Signing keys come from --key: "devN" (a devnet dev account), "env:VAR" (hex private key in VAR) or
"keystore:PATH" (password from ZOO_NODE_KEYSTORE_PASSWORD). On the devnet --key defaults to dev0.
Keys are never printed or logged. Reverts are shown as the contract's custom error in words.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Governance: propose, vote on and execute library versions.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)

TOKEN = 10**18
ConfigOpt = typer.Option(None, "--config", "-c", help="TOML config file.")
DataDirOpt = typer.Option(None, "--data-dir", help="Data directory (for the devnet's endpoints).")
KeyOpt = typer.Option(
    None, "--key", help="Signing key: devN, env:VAR or keystore:PATH (default on the devnet: dev0)."
)


@dataclass
class Dao:
    w3: Any
    registry: Any
    devnet: bool


def connect(config: Path | None, data_dir: Path | None, key: str | None, need_key: bool) -> Dao:
    from web3 import Web3

    from zoo.node.cli import load
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
    return Dao(w3, RegistryClient(w3, ep.registry_address, signer), ep.devnet)


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


def parse_root(value: str, what: str = "root") -> bytes:
    text = value.lower().removeprefix("0x")
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        err.print(f"[red]{what} must be 0x followed by 64 hex digits (got {value!r})[/red]")
        raise typer.Exit(2)
    return bytes.fromhex(text)


def keeper(units: int) -> str:
    return f"{units / TOKEN:,.4f} KEEPER"


@app.command()
def propose(
    root: str = typer.Option(..., "--root", help="Merkle root of the library version (0x + 64 hex)."),
    cid: str = typer.Option(..., "--cid", help="IPFS CID of the library's canonical bytes."),
    parent: str | None = typer.Option(None, "--parent", help="Root it replaces (default: the current root)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose a library version (its root and CID) to replace the current one."""
    r = parse_root(root)
    p = parse_root(parent, "--parent") if parent else None
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        tx = dao.registry.propose(r, cid, p)
        prop = dao.registry.proposal(r)
    out.print(f"proposed {root} (tx {tx.tx_hash}, gas {tx.gas_used})")
    if prop:
        out.print(f"voting from {_when(prop.vote_start)} to {_when(prop.vote_end)}")


@app.command()
def vote(
    root: str = typer.Argument(..., help="Root of the proposal."),
    support: bool = typer.Option(..., "--for/--against", help="Vote for or against."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Vote on a proposal with quadratic weight sqrt(votes at its snapshot)."""
    r = parse_root(root)
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        tx = dao.registry.vote(r, support)
        t = dao.registry.tallies(r)
    out.print(f"voted {'for' if support else 'against'} (tx {tx.tx_hash}, gas {tx.gas_used})")
    out.print(f"tally: for {t.for_weight:,} against {t.against_weight:,}")


@app.command()
def execute(
    root: str = typer.Argument(..., help="Root of the proposal."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Execute a passed proposal after its voting window: it becomes the current library version."""
    r = parse_root(root)
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        tx = dao.registry.execute(r)
        cur = dao.registry.current()
    out.print(
        f"executed (tx {tx.tx_hash}, gas {tx.gas_used}): "
        f"library version {cur.version} is now 0x{cur.root.hex()}"
    )


@app.command()
def proposals(
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    limit: int = typer.Option(20, "--limit", min=1, help="Most recent proposals to show."),
) -> None:
    """List proposals: state, for/against weight, quorum, time left."""
    from zoo.registry import chain

    dao = connect(config, data_dir, None, need_key=False)
    with reverts():
        events = dao.registry.proposal_created_events()[-limit:]
        params = dao.registry.params()
        now = int(dao.w3.eth.get_block("latest")["timestamp"])
        rows = [(e, dao.registry.state(e.root), dao.registry.tallies(e.root)) for e in reversed(events)]
    table = Table("root", "state", "for", "against", "for/quorum", "time left", "cid")
    for e, state, t in rows:
        left = e.vote_end - now
        table.add_row(
            "0x" + e.root.hex()[:12] + "…",
            state.name.lower(),
            f"{t.for_weight:,}",
            f"{t.against_weight:,}",
            f"{t.for_weight:,}/{params.quorum:,}",
            f"{left} s" if left > 0 else "closed",
            chain.shown_cid(e.cid, 20),
        )
    out.print(table if rows else "no proposals yet")


@app.command()
def show(
    root: str = typer.Argument(...), config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt
) -> None:
    """Show one proposal in full."""
    from zoo.registry import chain

    r = parse_root(root)
    dao = connect(config, data_dir, None, need_key=False)
    with reverts():
        p = dao.registry.proposal(r)
        if p is None:
            err.print(f"[red]no proposal with root {root}[/red]")
            raise typer.Exit(1)
        state = dao.registry.state(r)
        params = dao.registry.params()
    table = Table(show_header=False, box=None)
    table.add_row("root", "0x" + p.root.hex())
    table.add_row("state", state.name.lower())
    table.add_row("proposer", p.proposer)
    table.add_row("parent root", "0x" + p.parent_root.hex())
    table.add_row("cid", chain.shown_cid(p.cid))
    table.add_row("snapshot", f"{p.snapshot} ({_when(p.snapshot)})")
    table.add_row("voting", f"{_when(p.vote_start)} → {_when(p.vote_end)}")
    table.add_row("for / against", f"{p.for_weight:,} / {p.against_weight:,} (passes if for > 2 x against)")
    table.add_row("quorum", f"{p.for_weight:,} of {params.quorum:,} for (against votes do not count)")
    table.add_row("executed", str(p.executed))
    out.print(table)


@app.command()
def balance(
    address: str | None = typer.Argument(None, help="Address or devN (default: the --key account)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """KEEPER balance, current votes and delegate of an address."""
    from zoo.registry.keys import dev_address

    dao = connect(config, data_dir, key if address is None else None, need_key=address is None)
    who = address or dao.registry.account.address
    if who.startswith("dev"):
        who = dev_address(who)
    with reverts():
        token = dao.registry.token()
        bal, votes, delegate = token.balance(who), token.get_votes(who), token.delegates(who)
        weight = dao.registry.quadratic_weight(votes)
    out.print(f"{who}: balance {keeper(bal)}, votes {keeper(votes)} (quadratic weight {weight:,})")
    out.print(f"delegates to {delegate or 'nobody (its balance does not vote until it delegates)'}")


@app.command()
def delegate(
    to: str | None = typer.Argument(None, help="Delegatee address (default: yourself)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Delegate your votes (to yourself, to make your own balance vote)."""
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        tx = dao.registry.token().delegate(to)
    out.print(f"delegated to {to or 'self'} (tx {tx.tx_hash})")


def _when(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
