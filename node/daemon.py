"""The daemon's lifecycle: validate, lock the data dir, start metrics, components and gRPC, serve,
drain on SIGINT/SIGTERM, exit 0. Start-up failures exit non-zero with one clear line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from zoo.node import __version__
from zoo.node.components import Component, DisabledComponent, Supervisor
from zoo.node.config import NodeConfig, parse_listen
from zoo.node.datadir import DataDir, DataDirLocked
from zoo.node.logs import configure_logging, get_logger
from zoo.node.metrics import NodeMetrics
from zoo.node.probes import ChainComponent, IpfsComponent, LibraryComponent, ModelComponent
from zoo.node.server import BindError, HealthBridge, build_server
from zoo.node.services import NodeServicer

log = get_logger("zoo.node.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_LOCKED = 3


class StartupError(Exception):
    """The node cannot start; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def resolve_model_path(cfg: NodeConfig) -> Path:
    from zoo.inference.models import ModelUnavailable, prepare_bundled_chat_model

    if cfg.model.path is not None:
        return cfg.model.path
    try:
        prepared = prepare_bundled_chat_model(cfg.cache_dir)
    except ModelUnavailable as e:
        raise StartupError(str(e)) from None
    if prepared.converted:
        log.info("bundled model converted", path=str(prepared.path), seconds=round(prepared.seconds, 1))
    return prepared.path


def build_components(cfg: NodeConfig, data_dir: DataDir, model_path: Path) -> list[Component]:
    comps: list[Component] = []
    if cfg.chain.mode == "off":
        comps.append(DisabledComponent("chain", "chain.mode = 'off'"))
    elif cfg.chain.mode == "external":
        assert cfg.chain.rpc_url  # guaranteed by ChainConfig's validator
        comps.append(
            ChainComponent(cfg.chain.rpc_url, cfg.chain.registry_address, cfg.chain.probe_interval_s)
        )
    else:
        comps.append(DisabledComponent("chain", "devnet mode: start a devnet with `zoo-node devnet up`"))
    if cfg.ipfs.api_url:
        comps.append(IpfsComponent(cfg.ipfs.api_url, cfg.ipfs.probe_interval_s))
    else:
        comps.append(DisabledComponent("ipfs", "ipfs.api_url is not set"))
    comps.append(ModelComponent(model_path, cfg.model.device, cfg.model.dtype, cfg.model.threads))
    comps.append(LibraryComponent())
    return comps


async def serve(cfg: NodeConfig) -> int:
    """Run the node until SIGINT/SIGTERM; returns the process exit code."""
    started = time.monotonic()
    data_dir = DataDir(cfg.data_dir)
    try:
        data_dir.lock()
    except DataDirLocked as e:
        raise StartupError(str(e), EXIT_LOCKED) from None
    except OSError as e:
        raise StartupError(f"cannot use data directory {cfg.data_dir}: {e}") from None
    try:
        return await _serve_locked(cfg, data_dir, started)
    finally:
        data_dir.clear_node_info()
        data_dir.unlock()


async def _serve_locked(cfg: NodeConfig, data_dir: DataDir, started: float) -> int:
    admin_token = (
        cfg.server.admin_token.get_secret_value() if cfg.server.admin_token else data_dir.admin_token()
    )
    model_path = await asyncio.to_thread(resolve_model_path, cfg)
    from zoo.inference.models import model_id_for

    metrics = NodeMetrics(__version__)
    metrics_url = ""
    if cfg.metrics.enabled:
        host, port = parse_listen(cfg.metrics.listen)
        try:
            bound = metrics.serve(host.strip("[]"), port)
        except OSError as e:
            raise StartupError(f"cannot serve metrics on {cfg.metrics.listen}: {e}") from None
        metrics_url = f"http://{host}:{bound}/metrics"

    supervisor = Supervisor(build_components(cfg, data_dir, model_path))
    supervisor.on_change(metrics.component_changed)
    health = HealthBridge(supervisor)
    host, _ = parse_listen(cfg.server.listen)
    bound_port = 0
    servicer = NodeServicer(
        supervisor, str(cfg.data_dir), lambda: f"{host}:{bound_port}", model_id_for(model_path)
    )
    try:
        server, bound_port = build_server(cfg, supervisor, metrics, admin_token, servicer, health)
    except BindError as e:
        metrics.shutdown()
        raise StartupError(str(e)) from None

    loop = asyncio.get_running_loop()
    supervisor.on_change(lambda _s: loop.create_task(health.update()))
    await health.update()
    await server.start()
    supervisor.start()
    address = f"{host}:{bound_port}"
    tls = bool(cfg.server.tls_cert)
    data_dir.write_node_info(
        {"pid": os.getpid(), "listen": address, "tls": tls, "metrics": metrics_url, "version": __version__}
    )
    log.info(
        "zoo-node listening",
        grpc=address,
        tls=tls,
        metrics=metrics_url or "off",
        data_dir=str(cfg.data_dir),
        startup_s=round(time.monotonic() - started, 2),
    )
    _print_banner(address, metrics_url, cfg, tls)

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("shutting down", grace_period_s=cfg.server.grace_period_s)
    await health.shutdown()
    # New RPCs are refused at once; in-flight ones get the grace period to finish.
    await server.stop(cfg.server.grace_period_s)
    await supervisor.stop()
    metrics.shutdown()
    log.info("stopped")
    return EXIT_OK


def _print_banner(address: str, metrics_url: str, cfg: NodeConfig, tls: bool) -> None:
    if not sys.stdout.isatty() and os.environ.get("ZOO_NODE_BANNER", "1") == "0":
        return
    data_flag = f" --data-dir {cfg.data_dir}"
    lines = [
        f"zoo-node {__version__} is up: gRPC {address}{' (TLS)' if tls else ''}",
        f"  metrics:  {metrics_url or 'off'}",
        f"  status:   zoo-node status{data_flag}",
        f"  grpcurl:  grpcurl -plaintext {address} zoo.v1.NodeService/GetStatus"
        if not tls
        else f"  grpcurl:  grpcurl {address} zoo.v1.NodeService/GetStatus",
        f"  python:   from zoo.node.client import NodeClient; print(NodeClient({address!r}).status())",
    ]
    print("\n".join(lines), flush=True)


def run(cfg: NodeConfig) -> int:
    # Progress bars from transformers/huggingface would interleave with the structured log on stderr.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    configure_logging(cfg.log.level, cfg.log.format)
    try:
        return asyncio.run(serve(cfg))
    except StartupError as e:
        log.error("cannot start", reason=str(e))
        print(f"zoo-node: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_OK
