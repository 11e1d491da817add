"""`zoo-node usage report`: what this node has metered, per epoch and author (DATA_DIR/usage.sqlite).

Reads the database read-only, so it works beside a running node and with none.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import load
from zoo.node.cli.options import ConfigOpt, DataDirOpt, JsonTableOpt

app = typer.Typer(help="Usage this node has metered for experience authors.", no_args_is_help=True)


@app.command()
def report(
    epoch: int | None = typer.Option(None, "--epoch", min=0, help="Epoch number (default: the current one)."),
    as_json: bool = JsonTableOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Usage units (answer tokens) this node credited to each author in one epoch."""
    from zoo.node.credits.meter import UsageMeter

    cfg = load(config, data_dir=data_dir and str(data_dir))
    try:
        meter = UsageMeter(cfg.data_dir / "usage.sqlite", cfg.credits.epoch_s, read_only=True)
    except FileNotFoundError as e:
        err.print(f"[yellow]{escape(str(e))}[/yellow]", highlight=False)
        raise typer.Exit(0) from None
    try:
        which = meter.epoch_of() if epoch is None else epoch
        answered, units = meter.answered(which)
        authors = meter.by_author(which)
        clients = meter.by_client(which)
        start, end = meter.epoch_bounds(which)
        epochs = meter.epochs()
    finally:
        meter.close()
    if as_json:
        doc = {
            "epoch": which,
            "start": start,
            "end": end,
            "answered": answered,
            "units": units,
            "authors": [{"author": a.author, "units": a.units, "requests": a.requests} for a in authors],
            "clients": [
                {"client": c.client, "units": c.units, "requests": c.requests, "spent": c.spent}
                for c in clients
            ],
        }
        out.print_json(json.dumps(doc))
        return
    when = f"{_utc(start)} to {_utc(end)}"
    out.print(f"[bold]epoch {which}[/bold] ({when}): {answered} requests answered, {units} units")
    table = Table("author", "units", "requests", "share")
    credited = sum(a.units for a in authors) or 1
    for a in authors:
        table.add_row(escape(a.author), str(a.units), str(a.requests), f"{100 * a.units / credited:.1f}%")
    out.print(table)
    if clients:
        signed = Table("signed client", "units", "requests", "credits spent")
        for c in clients:
            signed.add_row(c.client, str(c.units), str(c.requests), str(c.spent))
        out.print(signed)
    if epochs and which not in epochs:
        out.print(f"epochs with usage: {', '.join(map(str, epochs[-10:]))}")


def _utc(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")
