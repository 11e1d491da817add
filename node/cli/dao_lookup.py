"""What the `zoo-node dao` commands share: the proposal an argument names, and what a proposal is in words.

A proposal is named by its full id or an unambiguous prefix (resolve); one the registry does not hold is an
error (existing). A call proposal is described by what it calls (describe_call), and a stale one says why it
can never run (stale_note). Also how a 32-byte hex argument is read (parse_root) and a chain time shown
(utc_time).
"""

from __future__ import annotations

import time
from typing import Any

import typer

from zoo.node.cli.console import err
from zoo.node.cli.context import Dao


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


def describe_call(dao: Dao, pid: int, *, short: bool = False) -> str:
    """What a call proposal calls, in words: the ledger's functions by name, the registry's `cancel` with the
    proposal it cancels and its `setBaseModel` with the model (cut short with `short`, for a table),
    anything else by its target."""
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
            if function.fn_name == "setBaseModel":
                model_hash = bytes(params["modelHash"]).hex()
                verb = "approve" if params["approved"] else "withdraw"
                return f"{verb} base model {model_hash[:16] + '…' if short else model_hash} on the registry"
    return f"a call to {target} (selector 0x{data[:4].hex()}, {len(data)} bytes of calldata)"


STALE_CALL = "stale: an identical call was executed since it was proposed"


def stale_note(dao: Dao, pid: int) -> str | None:
    """For a stale call proposal, why (its call's executions then and now); None for anything else."""
    binding = dao.registry.call_binding(pid)
    if binding is None or not binding.stale:
        return None
    then, now = binding.executions_at_proposal, binding.executions_now
    return f"{STALE_CALL} ({then} executions of it then, {now} now): it can never run"


def utc_time(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
