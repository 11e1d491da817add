"""`zoo-node dao` on proposals: propose a library version, cancel your own proposal, vote, execute, and
list or show proposals.

A library version is proposed by its CID, Merkle root and size, and voted on with quadratic weight; the
content is checked (dao_review.py) before it is proposed or voted for. Call proposals (the DAO's calls,
dao_calls.py) are voted on, executed, listed and shown by these same commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import connect, reverts
from zoo.node.cli.dao_lookup import describe_call, existing, parse_root, resolve, stale_note, utc_time
from zoo.node.cli.dao_review import check_content
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt


def propose(
    cid: str = typer.Option(..., "--cid", help="IPFS CID of the library's canonical bytes."),
    root: str | None = typer.Option(
        None, "--root", help="Merkle root of the library (0x + 64 hex; default: computed from the content)."
    ),
    size: int | None = typer.Option(
        None, "--size", min=1, help="Number of experiences (default: counted in the content)."
    ),
    parent_version: int | None = typer.Option(
        None, "--parent-version", min=0, help="Version it replaces (default: the current version)."
    ),
    salt: str | None = typer.Option(None, "--salt", help="0x + 64 hex making the proposal id unique."),
    force: bool = typer.Option(False, "--force", help="Propose even if the content cannot be verified."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose a library version (its CID, root and size) to replace the current one.

    The content is fetched and checked first (it must rebuild the root, hold `size` experiences and name
    the parent version); a proposal nobody can verify only wastes the voters' time, so it is refused unless
    --force.
    """
    from types import SimpleNamespace

    from zoo.registry.chain import format_proposal_id
    from zoo.registry.merkle import library_root

    r = parse_root(root, "--root") if root else None
    salt_bytes = parse_root(salt, "--salt") if salt else None
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        parent = dao.registry.current_version() if parent_version is None else parent_version

        def check() -> Any:
            claimed = SimpleNamespace(
                root=r or bytes(32), tree_size=size or 0, cid=cid, parent_version=parent
            )
            return check_content(dao, claimed)

        content = check()
        if content.library is not None and (r is None or size is None):
            # What was left out is taken from the content, then everything is checked together.
            r = r or library_root(content.library)
            size = size or len(content.library.experiences)
            content = check()
        if not content.verified and not force:
            err.print(f"[red]refused: the content of {cid} is not verified: {content.problem}[/red]")
            err.print("(pass --force to propose it anyway)")
            raise typer.Exit(1)
        if r is None or size is None:
            err.print("[red]--root and --size are needed when the content cannot be read[/red]")
            raise typer.Exit(2)
        tx = dao.registry.propose(r, cid, tree_size=size, parent_version=parent, salt=salt_bytes)
        prop = dao.registry.proposal(tx.proposal_id)
    pid = format_proposal_id(tx.proposal_id)
    out.print(f"proposed {pid} (root 0x{r.hex()}, {size} experiences, tx {tx.tx_hash}, gas {tx.gas_used})")
    if prop:
        out.print(f"voting from {utc_time(prop.vote_start)} to {utc_time(prop.vote_end)}")
        out.print(f"vote with `zoo-node dao vote {pid[:18]} --for`")


def cancel(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Cancel your own proposal while it is pending or active (before its vote ends): it can then never be
    voted on or executed. The DAO cancels anyone's proposal, a passed one too, with `dao propose-cancel`."""
    from zoo.registry.chain import ProposalState, format_proposal_id

    dao = connect(config, data_dir, key, need_key=True)
    pid = resolve(dao, proposal)
    shown = format_proposal_id(pid)
    with reverts():
        prop = existing(dao, pid)
        signer = dao.registry.account.address
        state = dao.registry.state(pid)
        if prop.proposer != signer:
            err.print(f"[red]refused: {signer} did not make proposal {shown} ({prop.proposer} did)[/red]")
            err.print("(the DAO cancels anyone's proposal: `zoo-node dao propose-cancel`)")
            raise typer.Exit(1)
        if state not in (ProposalState.PENDING, ProposalState.ACTIVE):
            err.print(f"[red]refused: proposal {shown} is {state.name.lower()}: its proposer may cancel it "
                      "only while it is pending or active[/red]")  # fmt: skip
            if state not in (ProposalState.EXECUTED, ProposalState.CANCELED):
                err.print("(the DAO still can: `zoo-node dao propose-cancel`)")
            raise typer.Exit(1)
        tx = dao.registry.cancel(pid)
    out.print(f"canceled {shown} (tx {tx.tx_hash}, gas {tx.gas_used})")


def vote(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    support: bool = typer.Option(..., "--for/--against", help="Vote for or against."),
    force: bool = typer.Option(
        False, "--force", help="Vote for even though the content is missing or does not match the root."
    ),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Vote on a proposal with quadratic weight sqrt(votes at its snapshot).

    Before a vote *for*, the proposal's content is fetched and verified against its root: a version whose
    content does not match would pass and then be refused by every node.
    """
    dao = connect(config, data_dir, key, need_key=True)
    pid = resolve(dao, proposal)
    with reverts():
        prop = existing(dao, pid)
        if prop.is_call:
            out.print(f"a call proposal: it calls {describe_call(dao, pid)}")
        elif support:
            content = check_content(dao, prop)
            if not content.verified:
                if not force:
                    err.print(
                        f"[red]refused: the proposal's content is not verified: {content.problem}[/red]"
                    )
                    err.print("(review it with `zoo-node dao review`; pass --force to vote for it anyway)")
                    raise typer.Exit(1)
                err.print(f"[yellow]voting for unverified content (--force): {content.problem}[/yellow]")
        tx = dao.registry.vote(pid, support)
        t = dao.registry.tallies(pid)
    out.print(f"voted {'for' if support else 'against'} (tx {tx.tx_hash}, gas {tx.gas_used})")
    out.print(f"tally: for {t.for_weight:,} against {t.against_weight:,}")


def execute(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Execute a passed proposal after its voting window: it becomes the current library version (or, for
    a call proposal, its call is made)."""
    dao = connect(config, data_dir, key, need_key=True)
    pid = resolve(dao, proposal)
    with reverts():
        if existing(dao, pid).is_call:
            what = describe_call(dao, pid)
            tx = dao.registry.execute(pid)
            out.print(f"executed (tx {tx.tx_hash}, gas {tx.gas_used}): called {what}")
            return
        tx = dao.registry.execute(pid)
        cur = dao.registry.current()
    out.print(
        f"executed (tx {tx.tx_hash}, gas {tx.gas_used}): "
        f"library version {cur.version} is now 0x{cur.root.hex()}"
    )


def proposals(
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    limit: int = typer.Option(20, "--limit", min=1, help="Most recent proposals to show."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Fetch each open proposal's content and check it (slower)."
    ),
) -> None:
    """List proposals: id, state, content check, for/against weight, quorum, time left."""
    from zoo.registry import chain

    open_states = {chain.ProposalState.PENDING, chain.ProposalState.ACTIVE, chain.ProposalState.QUEUED,
                   chain.ProposalState.SUCCEEDED}  # fmt: skip
    dao = connect(config, data_dir, None, need_key=False)
    with reverts():
        library = dao.registry.proposal_created_events(dao.cfg.chain.from_block)
        calls = dao.registry.call_proposed_events(dao.cfg.chain.from_block)
        events = sorted([*library, *calls], key=lambda e: e.block_number)[-limit:]
        params = dao.registry.params()
        now = int(dao.w3.eth.get_block("latest")["timestamp"])
        rows = []
        for e in reversed(events):
            state, prop = dao.registry.state(e.proposal_id), dao.registry.proposal(e.proposal_id)
            if isinstance(e, chain.ProposedCall):
                content = "call: " + describe_call(dao, e.proposal_id, short=True).split(" on the ")[0]
                if state is chain.ProposalState.STALE:
                    content += " (an identical call was executed since)"
            elif not verify:
                content = "-"
            elif state in open_states and prop is not None:
                content = check_content(dao, prop, timeout_s=min(5.0, dao.cfg.ipfs.timeout_s)).label
            else:
                content = "(closed)"
            rows.append((e, state, prop, content))
    # The CID is in `dao show`: the columns that decide a vote fit a terminal without it.
    table = Table("id", "state", "content", "version", "for", "against", "for/quorum", "time left")
    for e, state, prop, content in rows:
        left = e.vote_end - now
        color = {"verified": "green", "MISMATCH": "red", "unavailable": "yellow"}.get(content)
        table.add_row(
            chain.format_proposal_id(e.proposal_id)[:14] + "…",
            state.name.lower(),
            f"[{color}]{content}[/{color}]" if color else content,
            "-" if isinstance(e, chain.ProposedCall) else str(e.parent_version + 1),
            f"{prop.for_weight:,}" if prop else "-",
            f"{prop.against_weight:,}" if prop else "-",
            f"{prop.for_weight if prop else 0:,}/{params.quorum:,}",
            f"{left} s" if left > 0 else "closed",
        )
    out.print(table if rows else "no proposals yet")


def show(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Show one proposal in full."""
    from zoo.registry import chain

    dao = connect(config, data_dir, None, need_key=False)
    pid = resolve(dao, proposal)
    with reverts():
        p = existing(dao, pid)
        state = dao.registry.state(pid)
        params = dao.registry.params()
        stale = stale_note(dao, pid) if p.is_call and state is chain.ProposalState.STALE else None
    executable_at = p.vote_end + params.execution_delay
    table = Table(show_header=False, box=None)
    table.add_row("id", chain.format_proposal_id(p.id))
    table.add_row("state", stale or state.name.lower())
    table.add_row("proposer", p.proposer)
    if p.is_call:
        with reverts():
            table.add_row("calls", describe_call(dao, pid))
    else:
        table.add_row("root", "0x" + p.root.hex())
        table.add_row("experiences", str(p.tree_size))
        table.add_row("version", f"{p.parent_version + 1} (on top of version {p.parent_version})")
        table.add_row("cid", chain.shown_cid(p.cid))
    table.add_row("snapshot", f"{p.snapshot} ({utc_time(p.snapshot)})")
    table.add_row("voting", f"{utc_time(p.vote_start)} → {utc_time(p.vote_end)}")
    table.add_row(
        "execution",
        f"{utc_time(executable_at)} → {utc_time(executable_at + params.grace_period)} (then expired)",
    )
    table.add_row("for / against", f"{p.for_weight:,} / {p.against_weight:,} (passes if for > 2 x against)")
    table.add_row("quorum", f"{p.for_weight:,} of {params.quorum:,} for (against votes do not count)")
    table.add_row("executed", str(p.executed))
    table.add_row("canceled", str(p.canceled))
    out.print(table)
