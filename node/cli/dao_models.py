"""`zoo-node dao models` and `propose-model`: the base models the DAO approved, by their weights' SHA-256.

A library of format 4 names the weights it was made for by hash (registry/library.py); the DAO keeps the
list of such hashes it approves on the ExperienceRegistry (`setBaseModel`, called only through a passed
call proposal). `zoo-node library propose` refuses a library whose model the DAO has not approved.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer

from zoo.node.cli.console import err, out
from zoo.node.cli.context import connect, reverts
from zoo.node.cli.dao_calls import print_call_proposal
from zoo.node.cli.dao_lookup import parse_root
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt

SHA256_RE = re.compile(r"(0x)?[0-9a-fA-F]{64}")


def parse_model_hash(value: str) -> str:
    """64 lower-case hex digits from a SHA-256 as `zoo-node status` or `sha256sum` prints it (a 0x prefix
    is taken too); a usage error (exit 2) otherwise."""
    if not SHA256_RE.fullmatch(value):
        err.print(f"[red]not a SHA-256: {value!r} (64 hex digits, as `zoo-node status` shows them)[/red]")
        raise typer.Exit(2)
    return value.lower().removeprefix("0x")


def models(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """List the base models the DAO approved (their weights' SHA-256): those a library may name."""
    dao = connect(config, data_dir, None, need_key=False)
    with reverts():
        approved = dao.registry.base_models()
    if not approved:
        out.print("no base model approved yet: `zoo-node dao propose-model SHA256` proposes one")
    for model_hash in approved:
        out.print(model_hash)


def propose_model(
    model_sha256: str = typer.Argument(..., help="The weights' SHA-256 (`zoo-node status` shows it)."),
    withdraw: bool = typer.Option(False, "--withdraw", help="Propose withdrawing an approved model instead."),
    salt: str | None = typer.Option(None, "--salt", help="32-byte hex salt (default: random)."),
    key: str | None = KeyOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Propose that the DAO approve the model weights hashed MODEL_SHA256 as a base model libraries may name
    (or, with --withdraw, no longer). Voted on and executed like any proposal: `dao vote`, `dao execute`."""
    model_hash = parse_model_hash(model_sha256)
    salt_bytes = parse_root(salt, "salt") if salt is not None else None
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        approved = dao.registry.base_model_approved(model_hash)
        if approved != withdraw:
            state = "already" if approved else "not"
            err.print(f"[red]refused: the model {model_hash} is {state} approved[/red]")
            raise typer.Exit(1)
        tx = dao.registry.propose_base_model(model_hash, approve=not withdraw, salt=salt_bytes)
        prop = dao.registry.proposal(tx.proposal_id)
    print_call_proposal(tx, prop, f"{'withdraw' if withdraw else 'approve'} base model {model_hash}")
