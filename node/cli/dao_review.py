"""`zoo-node dao review`: check a proposal's content against what it commits to, and show what it changes.

check_content fetches a proposal's content from IPFS and checks it against its root, size and parent
version (registry/review.py); `dao propose`, `dao vote --for` and `dao proposals` ask it for the verdict,
`dao review` for the changes too, and with --eval scores the parent version against the proposed one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from zoo.node.cli.console import out
from zoo.node.cli.context import Dao, connect, fail, reverts
from zoo.node.cli.dao_lookup import describe_call, existing, resolve
from zoo.node.cli.options import ConfigOpt, DataDirOpt


def check_content(dao: Dao, proposal: Any, timeout_s: float | None = None, *, with_diff: bool = False) -> Any:
    """Fetch the proposal's content from IPFS and check it against its root, size and parent version, and
    that the base model it names by hash (format 4) is one the DAO approved.

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
    if result.verified and result.library is not None:
        problem = unapproved_model(dao, result.library)
        if problem is not None:
            result = replace(result, verified=False, problem=problem)
    return result if with_diff else replace(result, diff=None)


def unapproved_model(dao: Dao, library: Any) -> str | None:
    """Why `library` cannot become current: it names a base model (by hash) the DAO has not approved; None
    when it names none (an older format) or an approved one."""
    model_hash = library.base_model_sha256
    if not model_hash or dao.registry.base_model_approved(model_hash):
        return None
    return (
        f"it names a base model the DAO has not approved (sha256 {model_hash}): propose the model first, "
        f"`zoo-node dao propose-model {model_hash}`"
    )


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
            _review_challenge(dao, pid)
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


def _review_challenge(dao: Dao, pid: int) -> None:
    """For a proposal to resolve a challenge: whether the challenged report's records follow from the
    receipts it names (credits audit), so the vote weighs the evidence."""
    from zoo.node.cli.credits import AuditUnavailable, audit_posted
    from zoo.registry.chain import LedgerClient

    found = dao.registry.proposed_call(pid)
    if found is None or not dao.ledger_address or found[0].lower() != dao.ledger_address.lower():
        return
    ledger = LedgerClient(dao.w3, found[0])
    try:
        function, args = ledger.contract.decode_function_input(found[1])
    except ValueError:
        return
    if function.fn_name != "resolveChallenge":
        return
    node, epoch = args["node"], args["epoch"]
    try:
        _report, document, problems = audit_posted(dao, ledger, node, epoch)
    except AuditUnavailable as e:
        out.print(f"[yellow]the challenged report: {escape(str(e))}[/yellow]")
        return
    if problems:
        out.print(
            f"[red]the challenged report is not borne out by its {len(document.receipts)} receipts:[/red]"
        )
        for p in problems:
            out.print(f"  [red]{escape(p)}[/red]", highlight=False)
    else:
        out.print(f"[green]the challenged report: every record follows from its {len(document.receipts)} "
                  "signed receipts[/green]")  # fmt: skip
    out.print(f"(`zoo-node credits audit {node} {epoch} --account 0x…` lists the receipts behind a record)")
