"""`zoo-node dao …`: contributors propose library versions, KEEPER holders vote and execute.

Signing keys come from --key: "devN" (a devnet dev account), "env:VAR" (hex private key in VAR) or
"keystore:PATH" (password from ZOO_NODE_KEYSTORE_PASSWORD). On the devnet --key defaults to dev0.
Keys are never printed or logged. Reverts are shown as the contract's custom error in words.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import Dao, connect, fail, ledger_of, reverts
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt

app = typer.Typer(
    help="Governance: propose, vote on and execute library versions and the DAO's calls (node registration).",
    no_args_is_help=True,
)

TOKEN = 10**18


def parse_root(value: str, what: str = "root") -> bytes:
    text = value.lower().removeprefix("0x")
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        err.print(f"[red]{what} must be 0x followed by 64 hex digits (got {value!r})[/red]")
        raise typer.Exit(2)
    return bytes.fromhex(text)


def resolve(dao: Dao, proposal: str) -> int:
    """The proposal id an argument names (a full id or an unambiguous prefix); exits 2 when it names none."""
    from web3.exceptions import Web3Exception

    from zoo.registry.chain import ChainError

    try:
        return int(dao.registry.resolve_proposal(proposal, from_block=dao.cfg.chain.from_block))
    except ValueError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    except (ChainError, Web3Exception, OSError) as e:
        err.print(f"[red]cannot list the registry's proposals to resolve {proposal!r}: {e}[/red]")
        raise typer.Exit(1) from None


def existing(dao: Dao, pid: int) -> Any:
    """The proposal with id `pid`; exits 1 when the registry holds none."""
    from zoo.registry.chain import format_proposal_id

    prop = dao.registry.proposal(pid)
    if prop is None:
        err.print(f"[red]there is no proposal {format_proposal_id(pid)}[/red]")
        raise typer.Exit(1)
    return prop


def keeper(units: int) -> str:
    return f"{units / TOKEN:,.4f} KEEPER"


def describe_call(dao: Dao, pid: int, *, short: bool = False) -> str:
    """What a call proposal calls, in words: the ledger's functions by name, the registry's `cancel` with the
    proposal it cancels (its id cut short with `short`, for a table), anything else by its target."""
    from zoo.registry.chain import LedgerClient, format_proposal_id

    found = dao.registry.proposed_call(pid)
    if found is None:
        return "nothing (not a call proposal)"
    target, data = found
    if dao.ledger_address and target.lower() == dao.ledger_address.lower():
        return f"{LedgerClient(dao.w3, target).describe_call(data)} on the UsageLedger {target}"
    if target == dao.registry.address:
        try:
            function, params = dao.registry.contract.decode_function_input(data)
        except ValueError:
            pass
        else:
            if function.fn_name == "cancel":
                canceled = format_proposal_id(params["proposalId"])
                shown = f"cancel({canceled[:18] + '…' if short else canceled})"
                if bytes(data) != dao.registry.cancel_call(params["proposalId"]):  # an older registry took it
                    shown += ", NOT canonically encoded"
                return f"{shown} on the registry"
    return f"a call to {target} (selector 0x{data[:4].hex()}, {len(data)} bytes of calldata)"


STALE_CALL = "stale: an identical call was executed since it was proposed"


def stale_note(dao: Dao, pid: int) -> str | None:
    """For a stale call proposal, why (its call's executions then and now); None for anything else."""
    binding = dao.registry.call_binding(pid)
    if binding is None or not binding.stale:
        return None
    then, now = binding.executions_at_proposal, binding.executions_now
    return f"{STALE_CALL} ({then} executions of it then, {now} now): it can never run"


def check_content(dao: Dao, proposal: Any, timeout_s: float | None = None, *, with_diff: bool = False) -> Any:
    """Fetch the proposal's content from IPFS and check it against its root, size and parent version.

    The parent version's library (another fetch) is read only `with_diff`, for what `dao review` prints;
    voting, proposing and listing need the verdict alone.
    """
    from dataclasses import replace

    from zoo.registry.chain import ContractRevert
    from zoo.registry.ipfs import IpfsClient
    from zoo.registry.review import Review, review_proposal

    if not dao.ipfs_api:
        return Review(False, "no IPFS API configured (set ipfs.api_url)", available=False)
    timeout = timeout_s or dao.cfg.ipfs.timeout_s
    try:
        parent_root = dao.registry.version_at(proposal.parent_version).root
    except ContractRevert:
        parent_root = None  # a version that does not exist (yet): the review says so
    with IpfsClient(dao.ipfs_api, timeout=timeout) as ipfs:
        parent = None
        if with_diff and parent_root is not None:
            parent = _library_of_version(dao, ipfs, proposal.parent_version, parent_root, timeout)
        result = review_proposal(
            proposal,
            ipfs,
            parent_root=parent_root,
            parent=parent,
            timeout_s=timeout,
            max_bytes=dao.cfg.ipfs.max_library_bytes,
        )
    return result if with_diff else replace(result, diff=None)


def _library_of_version(dao: Dao, ipfs: Any, version: int, root: bytes, timeout: float) -> Any:
    """Library version `version` (to diff against): from the local store, else from IPFS if it matches the
    chain's root; None for version 0 or when it cannot be had."""
    from zoo.registry.canonical import decode_library
    from zoo.registry.errors import ZooError
    from zoo.registry.library_store import LibraryStore
    from zoo.registry.merkle import library_root

    if version == 0:
        return None
    try:
        return LibraryStore(dao.cfg.data_dir).get(version=version, root="0x" + root.hex()).library
    except ZooError:
        pass
    try:
        cid = dao.registry.version_at(version).cid
        library = decode_library(
            ipfs.fetch_verified(cid, timeout=timeout), max_size=dao.cfg.ipfs.max_library_bytes
        )
    except ZooError:
        return None
    return library if library_root(library) == root else None


def _print_review(result: Any) -> None:
    from rich.markup import escape

    if result.verified:
        out.print("[green]content verified[/green]: it hashes to the CID and rebuilds the proposed root")
    else:
        out.print(f"[red]content NOT verified[/red]: {escape(result.problem)}", highlight=False)
    if result.diff is not None:
        out.print(f"changes against the parent version: {result.diff.summary}")
        print_diff(result.diff)


def print_diff(diff: Any) -> None:
    """Added (+), removed (-) and modified (~) experiences of a LibraryDiff, one line each."""
    from rich.markup import escape

    def line(e: Any) -> str:
        return f"{e.id} {escape(f'[{e.domain}]')} {escape(e.text)}"

    for e in diff.added:
        out.print(f"[green]+ {line(e)}[/green]", highlight=False)
    for e in diff.removed:
        out.print(f"[red]- {line(e)}[/red]", highlight=False)
    for old, new in diff.modified:
        fields = ("confidence", "reasoning", "examples", "factors", "provenance")
        changed = [f for f in fields if getattr(old, f, None) != getattr(new, f, None)]
        out.print(
            f"[yellow]~ {line(new)} ({', '.join(changed) or 'record'} changed; confidence "
            f"{old.confidence:.2f} -> {new.confidence:.2f})[/yellow]",
            highlight=False,
        )


@app.command()
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
        out.print(f"voting from {_when(prop.vote_start)} to {_when(prop.vote_end)}")
        out.print(f"vote with `zoo-node dao vote {pid[:18]} --for`")


def _print_call_proposal(tx: Any, prop: Any, what: str) -> None:
    """A call proposal just made: its id, what it calls, its transaction and its voting window."""
    from zoo.registry.chain import format_proposal_id

    out.print(f"proposed {format_proposal_id(tx.proposal_id)}: {what} (tx {tx.tx_hash}, gas {tx.gas_used})")
    if prop is not None:
        out.print(f"voting {_when(prop.vote_start)} → {_when(prop.vote_end)}; then `zoo-node dao execute`")


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
    _print_call_proposal(tx, dao.registry.proposal(tx.proposal_id), ledger.describe_call(data))


@app.command("propose-node")
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


@app.command("propose-resolve")
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


@app.command()
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


@app.command("propose-cancel")
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
    _print_call_proposal(tx, prop, f"cancel({format_proposal_id(pid)})")


@app.command()
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


@app.command()
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


@app.command("review")
def review_cmd(
    proposal: str = typer.Argument(..., help="Proposal id, or an unambiguous prefix of one (0x…)."),
    eval_tasks: Path | None = typer.Option(
        None, "--eval", help="Also score the proposed version against its parent on these tasks (JSONL)."
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Fetch a proposal's content from IPFS, verify it against the proposed root and size, and show what it
    changes (added, removed, modified experiences). Exits 1 when the content is missing or does not match.
    With --eval, score the parent version (A) and the proposed one (B) on a task file through this node's
    model and prompt path, with the paired difference (zoo-node eval): what the proposal does, before a
    vote."""
    from zoo.registry.chain import format_proposal_id, shown_cid

    dao = connect(config, data_dir, None, need_key=False)
    pid = resolve(dao, proposal)
    with reverts():
        prop = existing(dao, pid)
        state = dao.registry.state(pid)
        if prop.is_call:
            out.print(f"proposal {format_proposal_id(pid)} ({state.name.lower()}) by {prop.proposer}")
            out.print(f"a call proposal, no library content: it calls {describe_call(dao, pid)}")
            return
        result = check_content(dao, prop, with_diff=True)
    out.print(f"proposal {format_proposal_id(pid)} ({state.name.lower()}) by {prop.proposer}")
    out.print(f"version {prop.parent_version + 1}: root 0x{prop.root.hex()}, {prop.tree_size} experiences, "
              f"cid {shown_cid(prop.cid)}")  # fmt: skip
    _print_review(result)
    if not result.verified:
        raise typer.Exit(1)
    if eval_tasks is not None:
        _eval_proposal(dao, result, eval_tasks)


def _eval_proposal(dao: Dao, result: Any, tasks: Path) -> None:
    """`zoo-node eval` of the parent version (A) against the proposed one (B) on `tasks`."""
    import asyncio
    import tempfile

    from zoo.node.cli.eval import Configuration, EvalError, difference_line, render
    from zoo.node.cli.eval import evaluate as evaluate_configurations
    from zoo.registry.canonical import encode_library

    with tempfile.TemporaryDirectory(prefix="zoo-review-") as tmp:
        files = []
        for name, library in (("parent", result.parent), ("proposed", result.library)):
            path = Path(tmp) / f"{name}.json"
            if library is None:
                files.append("none")  # version 0 has no library: A is the model with none
                continue
            path.write_bytes(encode_library(library))
            files.append(str(path))
        try:
            scored = asyncio.run(evaluate_configurations(
                dao.cfg, tasks, [Configuration(files[0], "none"), Configuration(files[1], "none")]
            ))  # fmt: skip
        except EvalError as e:
            raise fail(f"--eval: {e}", 2) from None
    out.print("evaluation: A is the parent version, B the proposed one")
    out.print(render(scored))
    out.print(difference_line(scored["difference"]))


@app.command()
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


@app.command()
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
    table.add_row("snapshot", f"{p.snapshot} ({_when(p.snapshot)})")
    table.add_row("voting", f"{_when(p.vote_start)} → {_when(p.vote_end)}")
    table.add_row(
        "execution", f"{_when(executable_at)} → {_when(executable_at + params.grace_period)} (then expired)"
    )
    table.add_row("for / against", f"{p.for_weight:,} / {p.against_weight:,} (passes if for > 2 x against)")
    table.add_row("quorum", f"{p.for_weight:,} of {params.quorum:,} for (against votes do not count)")
    table.add_row("executed", str(p.executed))
    table.add_row("canceled", str(p.canceled))
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
