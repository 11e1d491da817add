"""The `zoo-node` command line: start the daemon, inspect it, prepare models, build contracts.

Sub-command groups (devnet, dao, library, job, train, usage, credits, eval) live in their own modules and
are added here; what they share lives in context.py, options.py and console.py, so none imports this module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zoo.node import __version__
from zoo.node.cli.console import err, out
from zoo.node.cli.context import load
from zoo.node.cli.options import ConfigOpt, DataDirOpt, JsonTableOpt, NodeAddressOpt

app = typer.Typer(
    name="zoo-node",
    help="zoo-node: serve frozen LLMs improved by verified, DAO-governed experience libraries.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
models_app = typer.Typer(help="Bundled models.", no_args_is_help=True)
contracts_app = typer.Typer(help="Solidity contracts.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(contracts_app, name="contracts")


def _add_groups() -> None:
    # Imported here so that `zoo-node --help` stays fast and each group lives in its own module.
    from zoo.node.cli import credits, dao, devnet, job, library, train, usage
    from zoo.node.cli.eval import eval_command
    from zoo.node.cli.proofs import verify_answer
    from zoo.node.cli.receipts import verify_receipt

    app.add_typer(devnet.app, name="devnet")
    app.add_typer(dao.app, name="dao")
    app.add_typer(library.app, name="library")
    app.add_typer(job.app, name="job")
    app.add_typer(train.app, name="train")
    app.add_typer(usage.app, name="usage")
    app.add_typer(credits.app, name="credits")
    app.command("eval")(eval_command)
    app.command("verify-receipt")(verify_receipt)
    app.command("verify-answer")(verify_answer)


_add_groups()


def _version(value: bool) -> None:
    if value:
        out.print(f"zoo-node {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """zoo-node command line."""


@app.command()
def start(
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    listen: str | None = typer.Option(None, "--listen", help="gRPC listen address HOST:PORT."),
    check: bool = typer.Option(
        False,
        "--check",
        help="Only check the configuration and that no running node holds the data directory (exit 3 "
        "if one does), then exit.",
    ),
) -> None:
    """Run the node daemon in the foreground until SIGINT/SIGTERM."""
    cfg = load(config, data_dir=data_dir and str(data_dir), **{"server.listen": listen})
    if check:
        from zoo.node.datadir import DataDir, DataDirLocked

        free = DataDir(cfg.data_dir)
        try:
            free.lock()
        except DataDirLocked as e:
            typer.echo(f"zoo-node: {e}", err=True)  # the daemon's own words (and exit code) for it
            raise typer.Exit(3) from None
        free.unlock()
        return
    from zoo.node.daemon import run

    raise typer.Exit(run(cfg))


@app.command()
def status(
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    address: str | None = NodeAddressOpt,
    as_json: bool = JsonTableOpt,
) -> None:
    """Ask the running node for its status and print a readable summary."""
    st = _ask_node(config, data_dir, address, lambda client: client.status())
    if as_json:
        _print_proto_json(st)
        return
    from zoo.v1 import node_pb2

    lib = st.library
    out.print(f"[bold]zoo-node {st.node_version}[/bold] at {st.listen_address}, up {st.uptime_seconds:.0f} s")
    out.print(f"data dir  {st.data_dir}")
    if st.role == "light":
        out.print("role      light node: serves no model; gossip, library content and routing to peers")
    else:
        out.print(f"model     {st.model_id or '-'}")
        out.print(f"sha256    {st.model_sha256 or 'unknown (a remote backend: its weights are not here)'}")
    out.print(f"chain id  {st.chain_id or '-'}")
    out.print(
        f"library   version {lib.version} root {lib.root} ({lib.experience_count} experiences)"
        if lib.root
        else "library   none active yet"
    )
    out.print(f"openai    {st.http_address or 'off'}")
    sv = st.serving
    out.print(
        f"serving   {sv.running}/{sv.max_batch_size} running, {sv.waiting}/{sv.max_queued} waiting, "
        f"last batch {sv.last_batch_size}, mean wait {sv.mean_wait_ms:.0f} ms, "
        f"refused {sv.refused_queue_full} (queue full) + {sv.refused_wait_timeout} (wait too long)"
    )
    table = Table("component", "state", "detail")
    colours = {
        "SERVING": "green",
        "DEGRADED": "yellow",
        "FAILED": "red",
        "STARTING": "cyan",
        "DISABLED": "dim",
    }
    for c in st.components:
        state = node_pb2.ComponentState.Name(c.state).removeprefix("COMPONENT_STATE_")
        table.add_row(c.name, f"[{colours.get(state, 'white')}]{state.lower()}[/]", c.detail)
    out.print(table)


@app.command()
def peers(
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    address: str | None = NodeAddressOpt,
    as_json: bool = JsonTableOpt,
) -> None:
    """List the peers the running node knows over libp2p: connection, score, capabilities, last seen."""
    import time

    answer = _ask_node(config, data_dir, address, lambda client: client.peers())
    if as_json:
        _print_proto_json(answer)
        return
    if not answer.peer_id:
        out.print("p2p is off on this node (p2p.enabled = false) or still starting (see zoo-node status)")
        return
    out.print(f"[bold]peer {answer.peer_id}[/bold]")
    for addr in answer.listen_addrs:
        out.print(f"  listening on {addr}")
    table = Table("peer", "state", "score", "models", "library", "load", "grpc", "last seen")
    now = time.time()
    for p in answer.peers:
        caps = p.capabilities if p.HasField("capabilities") else None
        state = "[red]banned[/]" if p.banned else "[green]connected[/]" if p.connected else "[dim]known[/]"
        seen = now - p.last_seen.ToNanoseconds() / 1e9 if p.last_seen.ToNanoseconds() else None
        table.add_row(
            p.peer_id,
            state,
            f"{p.score:+.0f}",
            _models(caps) if caps else "[dim]expired[/]",
            f"v{caps.library_version}" if caps else "-",
            f"{caps.load:.2f}" if caps else "-",
            caps.grpc_address if caps else "-",
            f"{seen:.0f} s ago" if seen is not None else "never",
        )
    out.print(table if answer.peers else "no peers known yet (see p2p.bootstrap)")


def _models(caps: Any) -> str:
    """A peer's models; the first (its base model) with the start of the weights' hash it claims."""
    names = list(caps.models)
    if names and caps.model_sha256:
        names[0] += f" (sha256 {caps.model_sha256[:12]}…)"
    return ", ".join(names)


def _ask_node(config: Path | None, data_dir: Path | None, address: str | None, call: Any) -> Any:
    """Connect to the running node (by --address or the data dir) and make one call; clear errors."""
    import grpc

    from zoo.node.client import NodeClient, NodeNotRunning

    cfg = load(config, data_dir=data_dir and str(data_dir))
    try:
        client = NodeClient(address) if address else NodeClient.from_data_dir(cfg.data_dir)
        return call(client)
    except NodeNotRunning as e:
        err.print(f"[red]{e}[/red] (start one with `zoo-node start`, or pass --address)")
        raise typer.Exit(1) from None
    except grpc.RpcError as e:
        err.print(f"[red]cannot reach the node: {e.code().name}: {e.details()}[/red]")
        raise typer.Exit(1) from None


def _print_proto_json(message: Any) -> None:
    import json

    from google.protobuf.json_format import MessageToDict

    out.print_json(json.dumps(MessageToDict(message, preserving_proto_field_name=True)))


@config_app.command("show")
def config_show(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Print the effective configuration (file + environment + defaults) as TOML, secrets masked."""
    import tomli_w

    from zoo.node.config_loading import effective_config

    cfg = load(config, data_dir=data_dir and str(data_dir))
    data = _drop_none(effective_config(cfg))
    sys.stdout.write(tomli_w.dumps(data))


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    # TOML has no null: an unset optional setting is simply absent.
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


@models_app.command("prepare")
def models_prepare(
    config: Path | None = ConfigOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing when already prepared."),
) -> None:
    """Convert the bundled chat model into a cached Hugging Face directory (once)."""
    from zoo.inference.bundled_models import bundled_embedder_dir, bundled_gguf, prepare_bundled_chat_model

    cfg = load(config)
    bundled_gguf(), bundled_embedder_dir()  # fail early and clearly when a model package is missing
    with err.status("converting the bundled SmolLM2-135M-Instruct model (once, ~25 s)…"):
        prepared = prepare_bundled_chat_model(cfg.cache_dir)
    if prepared.converted:
        err.print(f"converted bundled model into {prepared.path} in {prepared.seconds:.1f} s")
    elif not quiet:
        err.print(f"bundled model ready at {prepared.path}")


@contracts_app.command("build")
def contracts_build() -> None:
    """Compile the Solidity contracts with solcjs (always, refreshing the cached artifacts)."""
    from zoo.contracts.build import build

    with err.status("compiling contracts with solcjs…"):
        artifacts = build(force=True)
    for name in artifacts.names():
        out.print(f"compiled {name}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
