"""`zoo-node dao balance` and `dao delegate`: an account's KEEPER, its votes and whom it delegates them to.

A KEEPER balance votes only once delegated (to its holder or to another account); a proposal weighs the
votes an account had at its snapshot quadratically.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zoo.node.cli.console import out
from zoo.node.cli.context import connect, reverts
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt

TOKEN = 10**18


def keeper(units: int) -> str:
    return f"{units / TOKEN:,.4f} KEEPER"


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
