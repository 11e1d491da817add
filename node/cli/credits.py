"""`zoo-node credits …`: inference credits on the UsageLedger — what an address holds and can claim, and
claiming it.

An author's credits come from the usage reports nodes post: each names the IPFS CID of its content, whose
records must give the root the ledger holds. `show` and `claim` fetch every report (or those of --node /
--epoch), check its content against its on-chain root, and find the address's records in it; a report
whose content is unavailable or does not match is shown with the reason and never claimed from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import Dao, connect, ledger_of, reverts
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt

app = typer.Typer(help="Inference credits: balances, claimable usage, claims.", no_args_is_help=True)

NodeOpt = typer.Option(None, "--node", help="Only reports of this node (address).")
EpochOpt = typer.Option(None, "--epoch", min=0, help="Only reports of this epoch.")


@dataclass
class Entry:
    """One record of `account` in one report, or a report that could not be read."""

    node: str
    epoch: int
    kind: str  # earned | spent | "" (the report could not be checked)
    units: int
    status: str  # claimable | claimed | applied | pending | waiting | challenged | lapsed | voided | frozen
    # | unreadable
    detail: str = ""
    index: int = -1
    proof: list[str] | None = None


def _address(text: str) -> str:
    from web3 import Web3

    from zoo.registry.keys import dev_address

    value = dev_address(text) if text.startswith("dev") else text
    if not Web3.is_address(value):
        err.print(f"[red]not an address: {text!r} (0x and 40 hex digits, or devN)[/red]")
        raise typer.Exit(2)
    return Web3.to_checksum_address(value)


def entries_of(dao: Dao, ledger: Any, account: str, node: str | None, epoch: int | None) -> list[Entry]:
    """Every record of `account` in the reports posted (filtered by node and epoch), with its status."""
    from zoo.registry.chain.ledger import EARNED, SPENT
    from zoo.registry.ipfs import IpfsClient, IpfsError
    from zoo.registry.usage_report import ReportError, fetch_report

    params = ledger.params()
    now = int(dao.w3.eth.get_block("latest")["timestamp"])
    found: list[Entry] = []
    posted_reports = ledger.posted_reports(dao.cfg.chain.from_block, node, epoch)
    registrations = {r.node: ledger.registration(r.node) for r in posted_reports}
    with IpfsClient(dao.ipfs_api or "http://127.0.0.1:5001") as ipfs:
        for posted in posted_reports:
            try:
                if not dao.ipfs_api:
                    raise IpfsError("no IPFS API is configured")
                report = fetch_report(ipfs, posted, timeout=min(10.0, dao.cfg.ipfs.timeout_s))
            except (ReportError, IpfsError, ValueError) as e:
                kind = "mismatch" if isinstance(e, ReportError) else "unavailable"
                found.append(Entry(posted.node, posted.epoch, "", 0, "unreadable", f"content {kind}: {e}"))
                continue
            tree = report.tree()
            for kind, name in ((EARNED, "earned"), (SPENT, "spent")):
                hit = report.find(kind, account)
                if hit is None:
                    continue
                index, record = hit
                settled = ledger.settled(posted.node, posted.epoch, kind, account)
                opens = posted.posted_at + params.challenge_window
                lapses = posted.challenged_at + params.resolution_period
                registration = registrations[posted.node]
                if posted.voided:
                    status, detail = "voided", "the DAO upheld a challenge: nothing of it applies"
                elif settled:
                    status, detail = ("claimed" if kind == EARNED else "applied"), ""
                elif not registration.active or registration.number != posted.registration:
                    status, detail = "frozen", "the DAO deregistered the node since: nothing of it applies"
                elif posted.challenged and now < lapses:
                    status, detail = (
                        "challenged",
                        f"waiting for the DAO to resolve the challenge until {lapses}",
                    )
                elif posted.challenged:
                    status, detail = (
                        "lapsed",
                        f"the DAO left the challenge unresolved; anyone releases the report: "
                        f"`zoo-node credits settle-challenge {posted.node} {posted.epoch}`",
                    )
                elif now < opens:
                    status, detail = (
                        "waiting",
                        f"claimable from {opens} (challenge window, {opens - now} s left)",
                    )
                else:
                    status, detail = ("claimable" if kind == EARNED else "pending"), ""
                proof = ["0x" + p.hex() for p in tree.prove(index).path]
                found.append(
                    Entry(posted.node, posted.epoch, name, record.units, status, detail, index, proof)
                )
    return found


def _table(rows: list[Entry]) -> Table:
    table = Table("node", "epoch", "record", "units", "status", "detail")
    colors = {"claimable": "green", "claimed": "dim", "applied": "dim", "unreadable": "red", "voided": "red"}
    for r in rows:
        color = colors.get(r.status)
        status = f"[{color}]{r.status}[/{color}]" if color else r.status
        table.add_row(r.node, str(r.epoch), r.kind or "-", f"{r.units:,}", status, escape(r.detail))
    return table


@app.command()
def show(
    address: str = typer.Argument(..., help="An address, or devN."),
    node: str | None = NodeOpt,
    epoch: int | None = EpochOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """An address's credits: balance on the ledger, and its records in every report (claimable or not)."""
    account = _address(address)
    node_address = _address(node) if node else None
    dao = connect(config, data_dir, None, need_key=False)
    ledger = ledger_of(dao)
    with reverts():
        balance, earned, spent = ledger.balance(account), ledger.earned(account), ledger.spent(account)
        rows = entries_of(dao, ledger, account, node_address, epoch)
    if as_json:
        doc = {"address": account, "balance": balance, "earned": earned, "spent": spent,
               "records": [{k: v for k, v in asdict(r).items() if k != "proof"} for r in rows]}  # fmt: skip
        out.print_json(json.dumps(doc))
        return
    out.print(f"{account}: balance {balance:,} credits (claimed {earned:,}, spent {spent:,})")
    claimable = sum(r.units for r in rows if r.status == "claimable")
    out.print(_table(rows) if rows else "no usage report names this address")
    if claimable:
        out.print(f"{claimable:,} credits claimable now: `zoo-node credits claim --key …`")
    if any(r.status == "unreadable" for r in rows):
        raise typer.Exit(1)


@app.command()
def claim(
    node: str | None = NodeOpt,
    epoch: int | None = EpochOpt,
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Claim every credit the signing account can claim now: its earned records in reports whose
    challenge window has passed, each proven against its report's root. Exits 1 if a report's content is
    unavailable or does not match its root, or a claim is refused."""
    from zoo.registry.chain import ChainError

    node_address = _address(node) if node else None
    dao = connect(config, data_dir, key, need_key=True)
    signer = dao.registry.account
    ledger = ledger_of(dao, signer)
    account = signer.address
    with reverts():
        rows = entries_of(dao, ledger, account, node_address, epoch)
    failed = False
    claimed = 0
    for r in rows:
        if r.status == "unreadable":
            err.print(f"[red]report of node {r.node}, epoch {r.epoch}: {escape(r.detail)}[/red]")
            failed = True
        if r.status != "claimable" or r.proof is None:
            continue
        try:
            tx = ledger.claim(r.node, r.epoch, r.units, r.index, [bytes.fromhex(p[2:]) for p in r.proof])
        except ChainError as e:
            err.print(f"[red]claim from node {r.node}, epoch {r.epoch} refused: {escape(str(e))}[/red]")
            failed = True
            continue
        claimed += r.units
        out.print(f"claimed {r.units:,} credits from node {r.node}, epoch {r.epoch} "
                  f"(tx {tx.tx_hash}, gas {tx.gas_used})")  # fmt: skip
    waiting = [r for r in rows if r.status in ("waiting", "challenged", "lapsed")]
    for r in waiting:
        out.print(f"not yet: {r.units:,} from node {r.node}, epoch {r.epoch}: {r.detail}")
    with reverts():
        balance = ledger.balance(account)
    out.print(f"{account}: claimed {claimed:,} now; balance {balance:,} credits")
    if failed:
        raise typer.Exit(1)


class AuditUnavailable(Exception):
    """A posted report, or the receipts it names, that cannot be read (the message says why).

    Not a ZooError: the CLI's own signal between audit_posted and its callers, who print it (exit 2 or a
    note); it never reaches an API."""


def audit_posted(dao: Dao, ledger: Any, node: str, epoch: int) -> tuple[Any, Any, list[str]]:
    """(report, receipts document, problems) of NODE's posted report for EPOCH: its content and receipts
    fetched from IPFS, each against its CID, and audited (node.credits.receipt_log.audit; no problems: every
    record follows from the receipts). AuditUnavailable when either cannot be read."""
    from zoo.node.credits.receipt_log import MAX_DOCUMENT_BYTES, ReceiptsDocument, audit
    from zoo.registry.errors import ValidationError
    from zoo.registry.ipfs import IpfsClient, IpfsError
    from zoo.registry.usage_report import ReportError, fetch_report

    posted = ledger.report(node, epoch)
    if posted is None:
        raise AuditUnavailable(f"node {node} posted no report for epoch {epoch}")
    timeout = dao.cfg.ipfs.timeout_s
    try:
        if not dao.ipfs_api:
            raise IpfsError("no IPFS API is configured")
        with IpfsClient(dao.ipfs_api) as ipfs:
            report = fetch_report(ipfs, posted, timeout=timeout)
            if report.receipts is None:
                raise ReportError("the report is in format 1: it names no receipts to audit")
            data = ipfs.fetch_verified(report.receipts.cid, timeout=timeout, max_size=MAX_DOCUMENT_BYTES)
        document = ReceiptsDocument.decode(data)
    except (ReportError, IpfsError, ValidationError) as e:
        raise AuditUnavailable(f"cannot audit the report of node {node}, epoch {epoch}: {e}") from None
    return report, document, audit(report, document, ledger.params().max_units_per_report)


@app.command()
def audit(
    node: str = typer.Argument(..., help="The reporting node (address)."),
    epoch: int = typer.Argument(..., min=0, help="The epoch of its report."),
    account: str | None = typer.Option(
        None, "--account", help="Also list the receipts behind this address's records (devN or 0x…)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Check a posted usage report against the receipts it names: the receipts' root, every receipt's
    signature and time, and every record recomputed from them (what to do before `credits challenge`).
    Exit 0: every record follows from its receipts; 1: not, saying which; 2: the report or its receipts
    cannot be read."""
    from zoo.node.credits.receipt_log import behind
    from zoo.registry.chain.ledger import EARNED, SPENT

    node_address = _address(node)
    wanted = _address(account) if account else None
    dao = connect(config, data_dir, None, need_key=False)
    ledger = ledger_of(dao)
    try:
        with reverts():
            report, document, problems = audit_posted(dao, ledger, node_address, epoch)
    except AuditUnavailable as e:
        err.print(f"[red]{escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    listed = []
    if wanted is not None:
        for kind, name in ((EARNED, "earned"), (SPENT, "spent")):
            for index, m, units in behind(document.receipts, kind, wanted):
                listed.append(
                    {"record": name, "index": index, "units": units, "receipt": m.receipt.to_json()}
                )
    root = "0x" + document.tree().root.hex()
    if as_json:
        doc = {"node": node_address, "epoch": epoch, "records": len(report.records), "root": root,
               "receipts": len(document.receipts), "problems": problems, "behind": listed}  # fmt: skip
        out.print_json(json.dumps(doc))
    else:
        out.print(
            f"report of node {node_address}, epoch {epoch}: {len(report.records)} records, "
            f"{len(document.receipts)} receipts (root {root})"
        )
        if listed:
            table = Table("record", "receipt", "units", "tokens", "time", "client", "library")
            for row in listed:
                r = row["receipt"]
                table.add_row(row["record"], str(row["index"]), f"{row['units']:,}",
                              f"{r['prompt_tokens'] + r['completion_tokens']:,}", str(r["timestamp"]),
                              r["client"], r["library"][:18] + "…")  # fmt: skip
            out.print(table)
        for p in problems:
            err.print(f"[red]{escape(p)}[/red]", highlight=False)
        if not problems:
            out.print(
                f"[green]every record follows from its {len(document.receipts)} signed receipts[/green]"
            )
    if problems:
        raise typer.Exit(1)


@app.command()
def challenge(
    node: str = typer.Argument(..., help="The reporting node (address)."),
    epoch: int = typer.Argument(..., min=0, help="The epoch of its report."),
    reason: str = typer.Option(..., "--reason", help="Why (for the DAO to read when it resolves it)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Challenge a node's usage report within its challenge window (a KEEPER holder), staking the ledger's
    challenge bond: returned if the DAO upholds the challenge, paid to the node if it dismisses it, returned
    (and the report released) if the DAO has not resolved it within the ledger's resolution period."""
    node_address = _address(node)
    dao = connect(config, data_dir, key, need_key=True)
    ledger = ledger_of(dao, dao.registry.account)
    with reverts():
        bond = ledger.params().challenge_bond
        tx = ledger.challenge(node_address, epoch, reason)
    out.print(
        f"challenged the report of node {node_address}, epoch {epoch}, staking {bond / 10**18:g} ETH "
        f"(tx {tx.tx_hash}, gas {tx.gas_used}); the DAO resolves it: "
        f"`zoo-node dao propose-resolve {node_address} {epoch} --uphold|--dismiss`"
    )


@app.command("settle-challenge")
def settle_challenge(
    node: str = typer.Argument(..., help="The reporting node (address)."),
    epoch: int = typer.Argument(..., min=0, help="The epoch of its challenged report."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Settle a challenge the DAO left unresolved past the ledger's resolution period (anyone may): the
    challenger's bond is returned (`credits withdraw`) and the report released, claimable as if never
    challenged. Refused, with the time it lapses, while the DAO may still resolve it."""
    node_address = _address(node)
    dao = connect(config, data_dir, key, need_key=True)
    ledger = ledger_of(dao, dao.registry.account)
    with reverts():
        tx = ledger.settle_lapsed_challenge(node_address, epoch)
        report = ledger.report(node_address, epoch)
    challenger = report.challenger if report is not None else "the challenger"
    out.print(
        f"settled the lapsed challenge of node {node_address}'s report for epoch {epoch}: the report is "
        f"released and the bond returned to {challenger} (tx {tx.tx_hash}, gas {tx.gas_used})"
    )


@app.command()
def withdraw(
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Withdraw the challenge bonds the ledger awarded the signing account (an upheld challenge's own bond,
    or a dismissed challenger's bond paid to the node it froze). Exits 1 when there is nothing."""
    dao = connect(config, data_dir, key, need_key=True)
    ledger = ledger_of(dao, dao.registry.account)
    account = dao.registry.account.address
    with reverts():
        owed = ledger.withdrawable(account)
        if owed == 0:
            err.print(f"[red]{account} has no awarded bonds to withdraw[/red]")
            raise typer.Exit(1)
        tx = ledger.withdraw()
    out.print(f"withdrew {owed / 10**18:g} ETH to {account} (tx {tx.tx_hash}, gas {tx.gas_used})")
