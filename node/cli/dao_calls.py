"""`zoo-node dao propose-node`, `propose-resolve` and `propose-cancel`: proposals that the DAO make a call.

The DAO governs the UsageLedger through call proposals: register or deregister a node, resolve the challenge
of a node's report; and it cancels any proposal (a passed one too) by a call proposal of the registry's own
`cancel`. Each is refused up front when the call could only fail, then voted on and executed like any
proposal (dao_proposals.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from zoo.node.cli.console import err, out
from zoo.node.cli.context import Dao, connect, ledger_of, reverts
from zoo.node.cli.dao_lookup import existing, parse_root, resolve, utc_time
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt


def print_call_proposal(tx: Any, prop: Any, what: str) -> None:
    """A call proposal just made: its id, what it calls, its transaction and its voting window."""
    from zoo.registry.chain import format_proposal_id

    out.print(f"proposed {format_proposal_id(tx.proposal_id)}: {what} (tx {tx.tx_hash}, gas {tx.gas_used})")
    if prop is not None:
        out.print(
            f"voting {utc_time(prop.vote_start)} → {utc_time(prop.vote_end)}; then `zoo-node dao execute`"
        )


def _ledger_proposer(
    node: str, salt: str | None, key: str | None, config: Path | None, data_dir: Path | None
) -> tuple[Dao, Any, bytes | None]:
    """(dao, its ledger, the salt) for a call proposal about NODE on the UsageLedger; a malformed address or
    salt is a usage error (exit 2)."""
    from web3 import Web3

    if not Web3.is_address(node):
        err.print(f"[red]not an address: {node!r} (0x and 40 hex digits)[/red]")
        raise typer.Exit(2)
    salt_bytes = parse_root(salt, "salt") if salt is not None else None
    dao = connect(config, data_dir, key, need_key=True)
    return dao, ledger_of(dao), salt_bytes


def _propose_ledger_call(dao: Dao, ledger: Any, data: bytes, salt_bytes: bytes | None) -> None:
    """Propose that the DAO make one UsageLedger call (`data`), and say what was proposed."""
    tx = dao.registry.propose_call(dao.ledger_address, data, salt=salt_bytes)
    print_call_proposal(tx, dao.registry.proposal(tx.proposal_id), ledger.describe_call(data))


def propose_node(
    node: str = typer.Argument(..., help="The node's address (`zoo-node status` shows it as node_address)."),
    deregister: bool = typer.Option(False, "--deregister", help="Propose removing the node instead."),
    salt: str | None = typer.Option(None, "--salt", help="32-byte hex salt (default: random)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose that the DAO register NODE on the UsageLedger, so it may post usage reports (or, with
    --deregister, remove it). Voted on and executed like a library version: `dao vote`, `dao execute`."""
    from web3 import Web3

    dao, ledger, salt_bytes = _ledger_proposer(node, salt, key, config, data_dir)
    with reverts():
        registered = ledger.is_registered(node)
        if registered != deregister:
            err.print(f"[red]refused: {Web3.to_checksum_address(node)} is "
                      f"{'already' if registered else 'not'} registered[/red]")  # fmt: skip
            raise typer.Exit(1)
        data = ledger.governor_call("deregisterNode" if deregister else "registerNode", node)
        _propose_ledger_call(dao, ledger, data, salt_bytes)


def propose_resolve(
    node: str = typer.Argument(..., help="The node whose report was challenged (address)."),
    epoch: int = typer.Argument(..., min=0, help="The epoch of the challenged report."),
    uphold: bool = typer.Option(
        ...,
        "--uphold/--dismiss",
        help="Uphold: the report is void, the challenger's bond returned. "
        "Dismiss: the report becomes claimable, the bond goes to the node.",
    ),
    salt: str | None = typer.Option(None, "--salt", help="32-byte hex salt (default: random)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose that the DAO resolve the challenge of NODE's report for EPOCH (`credits challenge` made it).
    Voted on and executed like any proposal: `dao vote`, `dao execute`."""
    from web3 import Web3

    dao, ledger, salt_bytes = _ledger_proposer(node, salt, key, config, data_dir)
    with reverts():
        report = ledger.report(node, epoch)
        if report is None or not report.challenged:
            what = "no report" if report is None else "a report that is not under challenge"
            err.print(f"[red]refused: {Web3.to_checksum_address(node)} has {what} for epoch {epoch}[/red]")
            raise typer.Exit(1)
        lapses = report.challenged_at + ledger.params().resolution_period
        if int(dao.w3.eth.get_block("latest")["timestamp"]) >= lapses:
            settle = f"zoo-node credits settle-challenge {report.node} {epoch}"
            err.print(f"[red]refused: the challenge lapsed at {lapses}: the DAO can no longer resolve it; "
                      f"`{settle}` releases the report[/red]")  # fmt: skip
            raise typer.Exit(1)
        data = ledger.governor_call("resolveChallenge", node, epoch, uphold)
        _propose_ledger_call(dao, ledger, data, salt_bytes)


def propose_cancel(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    salt: str | None = typer.Option(None, "--salt", help="32-byte hex salt (default: random)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose that the DAO cancel PROPOSAL: a call proposal of the registry's own `cancel`. Once it passes
    and is executed, PROPOSAL is canceled whatever its state, as long as it was not executed first (a passed
    proposal the DAO no longer wants). Voted on and executed like any proposal: `dao vote`, `dao execute`."""
    from zoo.registry.chain import ProposalState, format_proposal_id

    salt_bytes = parse_root(salt, "salt") if salt is not None else None
    dao = connect(config, data_dir, key, need_key=True)
    pid = resolve(dao, proposal)
    with reverts():
        existing(dao, pid)
        state = dao.registry.state(pid)
        if state in (ProposalState.EXECUTED, ProposalState.CANCELED):
            err.print(f"[red]refused: proposal {format_proposal_id(pid)} is {state.name.lower()}: "
                      "there is nothing left to cancel[/red]")  # fmt: skip
            raise typer.Exit(1)
        tx = dao.registry.propose_cancel(pid, salt=salt_bytes)
        prop = dao.registry.proposal(tx.proposal_id)
    print_call_proposal(tx, prop, f"cancel({format_proposal_id(pid)})")
