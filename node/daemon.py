"""The daemon's lifecycle: validate, lock the data dir, start metrics, components and gRPC, serve,
drain on SIGINT/SIGTERM, exit 0. Start-up failures exit non-zero with one clear line. What it starts is
built in zoo.node.components.wiring; where the chain and IPFS are (a devnet it brings up) is found in
zoo.node.endpoints.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from zoo.inference.adapters import AdapterDirectory
from zoo.inference.provenance.weights import WEIGHT_HASHES_FILE, WeightHashes
from zoo.node import __version__
from zoo.node.api.admission import Admission
from zoo.node.api.grpc_server import BindError, HealthBridge, build_server
from zoo.node.api.http.routes import ApiDeps, embedder_model_id
from zoo.node.api.http.server import HttpServer, start_http_api
from zoo.node.api.inference_service import InferenceServicer, serving_stats
from zoo.node.api.job_service import JobServicer
from zoo.node.api.library_service import LibraryServicer
from zoo.node.api.node_service import NodeServicer
from zoo.node.api.serving import ServingRules
from zoo.node.components.inference import RetrievalComponent, answer_metering, engine_provider
from zoo.node.components.probes import ModelComponent
from zoo.node.components.served_model import model_id, resolve_model_path
from zoo.node.components.supervisor import Supervisor
from zoo.node.components.wiring import (
    Parts,
    advertised_grpc,
    build_components,
    capabilities,
    credit_book,
    embedder,
    onchain_roots,
    router,
    spend_check,
)
from zoo.node.config import NodeConfig, parse_listen
from zoo.node.credits.book import CreditBook
from zoo.node.credits.identity import Identify
from zoo.node.credits.meter import UsageMeter
from zoo.node.credits.verifier import RequestVerifier
from zoo.node.datadir import DataDir, DataDirLocked
from zoo.node.endpoints import EndpointsUnavailable, Wiring, wire
from zoo.node.logs import configure_logging, get_logger
from zoo.node.metrics import NodeMetrics
from zoo.node.provenance.receipts import Notary
from zoo.node.webapp.site import WebApp
from zoo.node.webapp.wiring import web_app
from zoo.registry.errors import ZooError
from zoo.v1 import inference_pb2_grpc, jobs_pb2_grpc, library_pb2_grpc, node_pb2_grpc

log = get_logger("zoo.node.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_LOCKED = 3


class StartupError(ZooError):
    """The node cannot start; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def serve(cfg: NodeConfig, data_dir: DataDir, wiring: Wiring, started: float) -> int:
    """Run the node until SIGINT/SIGTERM; returns the process exit code."""
    node = NodeRun(cfg, data_dir, wiring)  # its signal handlers go in first
    await node.resolve_model()
    node.serve_metrics()
    node.build_components()
    node.build_servicers()
    await node.serve_http()
    node.join_p2p()
    await node.listen(started)
    await node.wait()
    await node.drain()
    return EXIT_OK


class NodeRun:
    """One run of the node, its steps in the order serve takes them: each sets up what the next ones use."""

    model_path: Path | None
    weight_hashes: WeightHashes
    model_sha256: str  # the served weights' SHA-256 (zoo.inference.provenance.weights); "" when unknown
    metrics: NodeMetrics
    metrics_url: str
    meter: UsageMeter
    parts: Parts
    supervisor: Supervisor
    health: HealthBridge
    host: str
    admission: Admission
    servicer: NodeServicer
    rules: ServingRules
    server: Any  # the gRPC server
    http: HttpServer | None
    http_url: str

    def __init__(self, cfg: NodeConfig, data_dir: DataDir, wiring: Wiring) -> None:
        # The handlers go in before anything can see the node: a signal that arrives while it starts (a
        # client that read node.json, say) is a stop request, honoured with the same drain as any other.
        # Installed later, such a signal met asyncio.run's own handler, which cancelled this task mid-start
        # and left the servers undrained (or the process stuck on a thread it never stopped).
        self.cfg, self.data_dir, self.wiring = cfg, data_dir, wiring
        self.webapp: WebApp | None = None  # the governance web app beside the HTTP API (serve_http)
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self.stop.set)
        self.admin_token = (
            cfg.server.admin_token.get_secret_value() if cfg.server.admin_token else data_dir.admin_token()
        )
        self.bound_port = 0

    async def resolve_model(self) -> None:
        from zoo.inference.bundled_models import ModelUnavailable

        try:
            self.model_path = await asyncio.to_thread(resolve_model_path, self.cfg)
        except ModelUnavailable as e:
            raise StartupError(str(e)) from None
        self.weight_hashes = WeightHashes(self.cfg.cache_dir / WEIGHT_HASHES_FILE)
        self.model_sha256 = ""  # a remote (openai) backend's weights, or a light node's none: unknown here
        if self.model_path is not None:
            started = time.monotonic()
            try:
                self.model_sha256 = await asyncio.to_thread(self.weight_hashes.of, self.model_path)
            except (OSError, ZooError) as e:
                raise StartupError(f"cannot hash the model's weights: {e}") from None
            log.info("model identity", path=str(self.model_path), sha256=self.model_sha256,
                     seconds=round(time.monotonic() - started, 2))  # fmt: skip

    def serve_metrics(self) -> None:
        cfg = self.cfg
        self.metrics = NodeMetrics(__version__)
        self.metrics_url = ""
        if cfg.metrics.enabled:
            host, port = parse_listen(cfg.metrics.listen)
            try:
                bound = self.metrics.serve(host.strip("[]"), port)
            except OSError as e:
                raise StartupError(f"cannot serve metrics on {cfg.metrics.listen}: {e}") from None
            self.metrics_url = f"http://{host}:{bound}/metrics"

    def build_components(self) -> None:
        cfg, metrics = self.cfg, self.metrics
        self.meter = UsageMeter(
            self.data_dir.path / "usage.sqlite", self.wiring.epoch_s or cfg.credits.epoch_s
        )
        self.parts = build_components(
            cfg, self.data_dir, self.model_path, self.wiring, metrics, self.meter, self.model_sha256
        )
        self.model_id = model_id(cfg, self.model_path)
        self.supervisor = Supervisor(self.parts.all())
        self.supervisor.on_change(metrics.component_changed)
        self.health = HealthBridge(self.supervisor)

    def build_servicers(self) -> None:
        """The gRPC servicers, the serving rules the HTTP API shares with them, and the gRPC server (bound,
        not yet started)."""
        cfg, wiring, parts, meter, metrics = self.cfg, self.wiring, self.parts, self.meter, self.metrics
        self.host, _ = parse_listen(cfg.server.listen)
        credits = credit_book(cfg, wiring, meter)
        node_address = self.data_dir.node_address()
        admission = self._admit(credits, node_address)
        model = parts.model
        self.servicer = NodeServicer(
            self.supervisor,
            str(cfg.data_dir),
            lambda: f"{self.host}:{self.bound_port}",
            self.model_id,
            usage=meter,
            node_address=node_address,
            allows_anonymous=cfg.credits.allow_anonymous,
            ledger_address=str(wiring.ledger_address) if credits is not None else "",
            credit_epoch_s=meter.epoch_s if credits is not None else 0,
            serving=lambda: serving_stats(admission, lambda: getattr(model, "backend", None)),
            min_similarity=cfg.inference.min_similarity,
            role="light" if cfg.light else "full",
            model_sha256=self.model_sha256,
        )
        metrics.watch_serving(self.servicer.serving)
        notary = Notary(self.data_dir.node_key(), node_address, self.model_sha256, self._adapter_sha256)
        metering = answer_metering(meter, credits, metrics, notary)
        engine = (
            engine_provider(cfg, model, parts.library, parts.retrieval, metering)
            if isinstance(model, ModelComponent) and isinstance(parts.retrieval, RetrievalComponent)
            else lambda: None  # a light node: no engine, ever
        )
        # Placement, readiness and priority: one set of rules for gRPC and the HTTP API.
        self.rules = ServingRules(
            engine,
            self.model_id,
            adapters=AdapterDirectory(cfg.adapters_dir).names,
            router=router(cfg, parts.p2p, engine, self.model_sha256),
            credits=credits,
            model_sha256=self.model_sha256,
        )
        servicers: list[Any] = [
            (node_pb2_grpc.add_NodeServiceServicer_to_server, self.servicer),
            (
                library_pb2_grpc.add_LibraryServiceServicer_to_server,
                LibraryServicer(parts.library, onchain_roots(wiring)),
            ),
            (
                inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                InferenceServicer(
                    self.rules,
                    cfg.inference,
                    admission,
                    peer_id=lambda: parts.p2p.peer_id if parts.p2p is not None else "",
                ),
            ),
        ]
        servicers.append((jobs_pb2_grpc.add_JobServiceServicer_to_server, JobServicer(parts.jobs)))
        try:
            self.server, self.bound_port = build_server(
                cfg, metrics, self.admin_token, self.health, servicers, self.identify
            )
        except BindError as e:
            metrics.shutdown()
            raise StartupError(str(e)) from None

    def _adapter_sha256(self, name: str) -> str:
        """The SHA-256 of adapter `name`'s files (hashed once per file: zoo.inference.provenance.weights)."""
        return self.weight_hashes.of(AdapterDirectory(self.cfg.adapters_dir).root / name)

    def _admit(self, credits: CreditBook | None, node_address: str) -> Admission:
        """Who a request is (signed, with credits, or anonymous) and when it may run (admission)."""
        cfg = self.cfg
        self.identify = Identify(
            RequestVerifier(
                node_address,
                max_skew_s=cfg.credits.max_clock_skew_s,
                max_remembered=cfg.credits.max_remembered_nonces,
            ),
            self.metrics,
            cfg.credits.allow_anonymous,
            spend_check(self.wiring, node_address, self.parts.chain, self.meter)
            if credits is not None
            else None,
        )
        inf = cfg.inference
        reserved = min(cfg.credits.reserved_slots, inf.max_batch_size - 1) if credits is not None else 0
        self.admission = Admission(
            inf.max_batch_size,
            inf.max_queued,
            inf.max_wait_s,
            self.metrics.queue_wait.observe,
            reserved=reserved,
        )
        return self.admission

    async def serve_http(self) -> None:
        """The OpenAI-compatible HTTP API, serving at once (none when http.enabled is false), and the web
        app beside it (http.app)."""
        cfg = self.cfg
        self.webapp = (
            web_app(
                cfg, self.wiring, self.parts, self._status_document, lambda: self.admin_token, self.model_id
            )
            if cfg.http.app
            else None
        )
        deps = ApiDeps(
            self.rules,
            self.admission,
            cfg.inference,
            self.metrics,
            self.model_id,
            embedder(self.parts.retrieval),
            "" if cfg.light else embedder_model_id(cfg.embedder.path),
            api_key=cfg.server.api_key.get_secret_value() if cfg.server.api_key else None,
            identify=self.identify,
            model_sha256=self.model_sha256,
            adapter_sha256=self._adapter_sha256,
            webapp=self.webapp,
        )
        self.http = None
        if cfg.http.enabled:
            try:
                self.http = await start_http_api(cfg.http, deps, cfg.server.grace_period_s)
            except OSError as e:
                self.metrics.shutdown()
                raise StartupError(f"cannot serve the HTTP API on {cfg.http.listen}: {e}") from None
        self.http_url = http_url = self.http.address if self.http is not None else ""
        if self.http is not None:
            self.servicer.http_address = lambda: http_url + "/v1"

    async def _status_document(self) -> dict[str, Any]:
        """GetStatus as JSON (the web app's operator page): what `zoo-node status` shows, but the data dir."""
        from google.protobuf.json_format import MessageToDict

        from zoo.v1 import node_pb2

        status = await self.servicer.GetStatus(node_pb2.GetStatusRequest(), None)  # type: ignore[arg-type]
        document = MessageToDict(
            status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        document.pop("data_dir")  # a path on the operator's machine: nothing a page needs to show
        return document

    def join_p2p(self) -> None:
        """What the p2p component advertises to peers (it joins the network once the supervisor starts it)."""
        p2p, cfg = self.parts.p2p, self.cfg
        if p2p is None:
            return
        p2p.capabilities = capabilities(
            cfg,
            self.model_id,
            self.model_sha256,
            self.parts.library,
            self.admission,
            lambda: advertised_grpc(cfg, self.host, self.bound_port),
            self.http_url,
            lambda: self.supervisor.statuses["model"].state.usable,
        )
        # Peers reach this node's gRPC over libp2p only when it has a model to answer for (a light node has
        # nothing to route to), and not with TLS on (the tunnel's far end speaks plain gRPC).
        over_p2p = cfg.p2p.grpc_over_p2p if cfg.p2p.grpc_over_p2p is not None else bool(cfg.p2p.relays)
        if over_p2p and not cfg.light and not cfg.server.tls_cert:
            own = "127.0.0.1" if self.host.strip("[]") in ("0.0.0.0", "::", "") else self.host
            p2p.grpc_target = lambda: f"{own}:{self.bound_port}" if self.bound_port else None
        self.servicer.p2p = p2p

    async def listen(self, started: float) -> None:
        """Start the gRPC server and the components; say where the node listens (node.json, log, banner)."""
        cfg, health, supervisor = self.cfg, self.health, self.supervisor
        supervisor.on_change(lambda _s: self.loop.create_task(health.update()))
        await health.update()
        await self.server.start()
        supervisor.start()
        address = f"{self.host}:{self.bound_port}"
        tls = bool(cfg.server.tls_cert)
        self.data_dir.write_node_info(
            {
                "pid": os.getpid(),
                "listen": address,
                "tls": tls,
                "metrics": self.metrics_url,
                "http": self.http_url,
                "version": __version__,
            }
        )
        log.info(
            "zoo-node listening",
            grpc=address,
            tls=tls,
            metrics=self.metrics_url or "off",
            http=self.http_url or "off",
            data_dir=str(cfg.data_dir),
            startup_s=round(time.monotonic() - started, 2),
        )
        _print_banner(address, self.metrics_url, self.http_url, cfg, tls)

    async def wait(self) -> None:
        """Until SIGINT or SIGTERM."""
        await self.stop.wait()

    async def drain(self) -> None:
        log.info("shutting down", grace_period_s=self.cfg.server.grace_period_s)
        await self.health.shutdown()
        # New RPCs and HTTP requests are refused at once; in-flight ones get the grace period to finish.
        grace = self.cfg.server.grace_period_s
        http = self.http
        await asyncio.gather(self.server.stop(grace), *([http.stop(grace)] if http is not None else []))
        if self.webapp is not None:
            await self.webapp.close()
        if self.rules.router is not None:
            await self.rules.router.close()
        await self.supervisor.stop()
        self.meter.close()
        self.metrics.shutdown()


def _print_banner(address: str, metrics_url: str, http_url: str, cfg: NodeConfig, tls: bool) -> None:
    if not sys.stdout.isatty() and os.environ.get("ZOO_NODE_BANNER", "1") == "0":
        return
    data_flag = f" --data-dir {cfg.data_dir}"
    lines = [
        f"zoo-node {__version__} is up: gRPC {address}{' (TLS)' if tls else ''}",
        f"  metrics:  {metrics_url or 'off'}",
        f"  openai:   {http_url + '/v1' if http_url else 'off'}",
        f"  web app:  {http_url + '/' if http_url and cfg.http.app else 'off'}",
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
    started = time.monotonic()
    data_dir = DataDir(cfg.data_dir)
    wiring = Wiring()
    try:
        try:
            data_dir.lock()
        except DataDirLocked as e:
            raise StartupError(str(e), EXIT_LOCKED) from None
        except OSError as e:
            raise StartupError(f"cannot use data directory {cfg.data_dir}: {e}") from None
        try:
            try:
                wiring = wire(cfg)
            except EndpointsUnavailable as e:  # the devnet failed to start
                raise StartupError(str(e)) from None
            return asyncio.run(serve(cfg, data_dir, wiring, started))
        finally:
            if wiring.devnet is not None:
                log.info("stopping the devnet this node started", stopped=wiring.devnet.down())
            data_dir.clear_node_info()
            data_dir.unlock()
            log.info("stopped")
    except StartupError as e:
        log.error("cannot start", reason=str(e))
        print(f"zoo-node: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_OK
