"""The daemon's lifecycle: validate, lock the data dir, start metrics, components and gRPC, serve,
drain on SIGINT/SIGTERM, exit 0. Start-up failures exit non-zero with one clear line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.inference.adapters import AdapterDirectory
from zoo.node import __version__
from zoo.node.api.admission import Admission
from zoo.node.api.grpc_server import BindError, HealthBridge, build_server
from zoo.node.api.http.routes import ApiDeps, embedder_model_id
from zoo.node.api.http.server import HttpServer, start_http_api
from zoo.node.api.inference_service import InferenceServicer, serving_stats
from zoo.node.api.jobs import JobServicer
from zoo.node.api.library import LibraryServicer
from zoo.node.api.node import NodeServicer
from zoo.node.api.serving import ServingRules
from zoo.node.components.inference import RetrievalComponent, answer_metering, engine_provider
from zoo.node.components.library import LibraryComponent
from zoo.node.components.probes import ChainComponent, IpfsComponent, ModelComponent
from zoo.node.components.served_model import model_id, resolve_model_path, training_weights, trains_lora
from zoo.node.components.supervisor import Supervisor
from zoo.node.config import NodeConfig, parse_listen
from zoo.node.credits.book import CreditBook
from zoo.node.credits.consent import SpendCheck
from zoo.node.credits.identity import Identify
from zoo.node.credits.meter import UsageMeter
from zoo.node.credits.verifier import RequestVerifier
from zoo.node.datadir import DataDir, DataDirLocked
from zoo.node.jobs.runner import JobRunner, Resources
from zoo.node.lifecycle import Component, DisabledComponent
from zoo.node.logs import configure_logging, get_logger
from zoo.node.metrics import NodeMetrics
from zoo.registry.errors import ZooError
from zoo.registry.library_store import LibraryStore
from zoo.v1 import inference_pb2_grpc, jobs_pb2_grpc, library_pb2_grpc, node_pb2_grpc

if TYPE_CHECKING:  # imported where p2p is enabled: py-libp2p is heavy at start-up
    from zoo.node.p2p.component import P2PComponent

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


@dataclass
class Wiring:
    """What start-up resolved before the event loop runs: endpoints and whether this node owns a devnet."""

    rpc_url: str | None = None
    registry_address: str | None = None
    ledger_address: str | None = None  # the UsageLedger, when the chain has one
    epoch_s: int | None = None  # the ledger's epoch length, when known without asking the chain
    ipfs_api: str | None = None
    from_block: int = 0
    devnet: Any = None  # the Devnet this node started (and stops on exit), if any


def devnet_settings(cfg: NodeConfig) -> Any:
    from zoo.devnet.manager import DevnetSettings

    d = cfg.devnet
    return DevnetSettings(
        voting_period_s=d.voting_period_s,
        execution_delay_s=d.execution_delay_s,
        grace_period_s=d.grace_period_s,
        voter_registry=d.voter_registry,
        epoch_s=cfg.credits.epoch_s,
        challenge_window_s=d.challenge_window_s,
        anvil_port=d.anvil_port,
        ipfs_api_port=d.ipfs_api_port,
    )


def wire(cfg: NodeConfig) -> Wiring:
    """Resolve chain and IPFS endpoints; in devnet mode start the devnet if none is running.

    Runs on the main thread: a devnet started here dies with this process (PR_SET_PDEATHSIG is tied to
    the starting thread), so even kill -9 of the node leaves no orphaned anvil or IPFS daemon.
    """
    w = Wiring(ipfs_api=cfg.ipfs.api_url)
    if cfg.chain.mode == "external":
        w.rpc_url, w.registry_address, w.from_block = (
            cfg.chain.rpc_url,
            cfg.chain.registry_address,
            cfg.chain.from_block,
        )
        w.ledger_address = cfg.chain.ledger_address
    elif cfg.chain.mode == "devnet":
        from zoo.devnet.manager import Devnet, DevnetError

        devnet = Devnet(cfg.data_dir, devnet_settings(cfg), cfg.cache_dir)
        log.info("bringing up the devnet", dir=str(devnet.dir))
        try:
            info, reused = devnet.up(progress=lambda msg: log.info("devnet", step=msg), die_with_parent=True)
        except (DevnetError, RuntimeError, OSError) as e:
            raise StartupError(f"the devnet failed to start: {e}") from None
        log.info(
            "devnet ready",
            reused=reused,
            rpc=info.rpc_url,
            registry=info.registry_address,
            ipfs=info.ipfs_api,
        )
        w.rpc_url, w.registry_address, w.from_block = info.rpc_url, info.registry_address, info.deploy_block
        w.ledger_address = info.ledger_address or None
        w.epoch_s = int(info.settings.get("epoch_s", cfg.credits.epoch_s))
        w.ipfs_api = cfg.ipfs.api_url or info.ipfs_api
        w.devnet = None if reused else devnet
        if w.ledger_address and cfg.credits.settle:
            register_on_devnet(devnet, DataDir(cfg.data_dir))
    return w


def register_on_devnet(devnet: Any, data_dir: DataDir) -> bool:
    """Have the node's own devnet register the node's account (DATA_DIR/node.key) on its UsageLedger, through
    a DAO call proposal (Devnet.register_node), so that settlement serves from the first start. Nothing is
    proposed when it is registered already; a new key gets its own registration. Never fails the start: on
    any failure the node starts unregistered and settlement says so (DEGRADED), as on an external chain.
    Returns whether the node is registered."""
    address = ""
    try:
        address = data_dir.node_address()
        proposed = devnet.register_node(address, progress=lambda msg: log.info("devnet", step=msg))
    except Exception as e:  # the chain, the DAO or the key: the node serves anyway
        log.warning(
            "the devnet could not register this node on its UsageLedger; settlement stays degraded",
            node=address,
            error=f"{type(e).__name__}: {e}"[:500],
        )
        return False
    if proposed:
        log.info("node registered on the devnet's UsageLedger by a DAO call proposal", node=address)
    return True


@dataclass
class Parts:
    """The daemon's components, typed; `all()` is what the supervisor runs, in start order."""

    chain: ChainComponent | DisabledComponent
    ipfs: Component
    model: ModelComponent
    p2p: P2PComponent | None  # None: p2p.enabled = false
    library: LibraryComponent
    retrieval: RetrievalComponent
    jobs: JobRunner
    settlement: Component

    def all(self) -> list[Component]:
        p2p = self.p2p or DisabledComponent("p2p", "p2p.enabled = false")
        return [
            self.chain,
            self.ipfs,
            self.model,
            p2p,
            self.library,
            self.retrieval,
            self.jobs,
            self.settlement,
        ]


def build_components(
    cfg: NodeConfig,
    data_dir: DataDir,
    model_path: Path,
    wiring: Wiring,
    metrics: NodeMetrics,
    meter: UsageMeter,
) -> Parts:
    chain: ChainComponent | DisabledComponent = (
        ChainComponent(wiring.rpc_url, wiring.registry_address, cfg.chain.probe_interval_s)
        if wiring.rpc_url
        else DisabledComponent("chain", "chain.mode = 'off'")
    )
    ipfs: Component = (
        IpfsComponent(wiring.ipfs_api, cfg.ipfs.probe_interval_s)
        if wiring.ipfs_api
        else DisabledComponent("ipfs", "ipfs.api_url is not set")
    )
    model = ModelComponent(
        cfg.model, model_path, model_id(cfg, model_path), cfg.inference.max_batch_size, cfg.cache_dir
    )
    store = LibraryStore(data_dir.path)
    p2p = _p2p_component(cfg, data_dir, wiring, store, metrics) if cfg.p2p.enabled else None
    factory = None
    if wiring.rpc_url and wiring.registry_address and (wiring.ipfs_api or p2p is not None):
        factory = _follower_factory(cfg, data_dir, wiring, store, p2p)

    def activated(stored: Any) -> None:
        metrics.library_version.set(stored.version)
        metrics.library_experiences.set(len(stored.library.experiences))
        if p2p is not None:
            p2p.announce(stored.version, stored.root, stored.cid)

    library = LibraryComponent(
        store,
        factory,
        cfg.chain.poll_interval_s,
        on_activate=activated,
        on_refused=lambda reason: metrics.library_refused.labels(reason).inc(),
    )
    retrieval = RetrievalComponent(
        library,
        cfg.embedder.path,
        data_dir.path / "embeddings.sqlite",
        cfg.inference.ann_threshold,
        index_dir=data_dir.path / "retrieval",
        defer=cfg.model.backend == "llamacpp",
    )
    library.on_change = retrieval.library_changed
    if p2p is not None:
        p2p.on_newer_version = lambda _version: library.wake()
    return Parts(
        chain, ipfs, model, p2p, library, retrieval,
        _job_runner(cfg, data_dir, model, library, retrieval, metrics),
        _settlement(cfg, data_dir, wiring, metrics, meter),
    )  # fmt: skip


def _settlement(
    cfg: NodeConfig, data_dir: DataDir, wiring: Wiring, metrics: NodeMetrics, meter: UsageMeter
) -> Component:
    if not (wiring.rpc_url and wiring.ledger_address):
        return DisabledComponent("settlement", "no UsageLedger (chain.ledger_address)")
    if not cfg.credits.settle:
        return DisabledComponent("settlement", "credits.settle = false")
    from zoo.node.credits.settlement import Settlement  # web3 and eth_account load in its setup thread

    data_dir.node_address()  # the key exists before settlement reads it
    return Settlement(
        meter,
        rpc_url=wiring.rpc_url,
        ledger_address=wiring.ledger_address,
        ipfs_api=wiring.ipfs_api,
        key_file=data_dir.key_file,
        reports_dir=data_dir.path / "reports",
        poll_s=cfg.credits.settle_interval_s,
        devnet=cfg.chain.mode == "devnet",
        on_failure=metrics.settlement_failures.inc,
    )


def _job_runner(
    cfg: NodeConfig,
    data_dir: DataDir,
    model: ModelComponent,
    library: LibraryComponent,
    retrieval: RetrievalComponent,
    metrics: NodeMetrics,
) -> JobRunner:
    from zoo.inference.bundled_models import ModelUnavailable, is_prepared
    from zoo.node.jobs.store import JobState, JobStore

    lora_jobs = trains_lora(cfg)

    def trained_weights() -> Path | None:
        """What LoRA jobs train on, without blocking the loop: the served directory (transformers), or the
        bundled model's converted one once `./zoo setup` (zoo-node models prepare) has made it."""
        if not lora_jobs:
            return None
        if cfg.model.backend == "transformers":
            return model.path
        with contextlib.suppress(ModelUnavailable):
            if is_prepared(cfg.cache_dir):
                return training_weights(cfg)
        return None

    def resources() -> Resources | None:
        # A job waits (queued) until the model and the embedder have loaded.
        if retrieval.retriever is None and store.list(limit=1, states=[JobState.QUEUED]):
            retrieval.want()  # a deferred embedder loads for the job that waits on it
        if model.backend is None or retrieval.retriever is None:
            return None
        local = trained_weights()
        return Resources(
            model.backend, retrieval.retriever.embedder, lambda: library.active, local, cfg.model.device
        )

    store = JobStore(data_dir.path / "jobs.sqlite")
    return JobRunner(
        store,
        data_dir.path / "jobs",
        resources,
        max_queued=cfg.jobs.max_queued,
        metrics=metrics,
        serving=cfg.inference.serving_defaults(),
        adapters=AdapterDirectory(cfg.adapters_dir),
        gspo_refusal=None
        if lora_jobs
        else "LoRA jobs (gspo, sft, rft, distill) train on local Hugging Face weights: model.backend is "
        f"{cfg.model.backend!r}"
        + (f" with model.path {cfg.model.path}" if cfg.model.path is not None else "")
        + "; it must be 'transformers' (or 'llamacpp' serving the bundled model)",
    )


def _p2p_component(
    cfg: NodeConfig, data_dir: DataDir, wiring: Wiring, store: LibraryStore, metrics: NodeMetrics
) -> Any:
    from zoo.node.p2p.chain import RegistryChainView
    from zoo.node.p2p.component import P2PComponent

    chain = None
    if wiring.rpc_url and wiring.registry_address:
        view = RegistryChainView(wiring.rpc_url, wiring.registry_address)
        chain = lambda: view  # noqa: E731
    return P2PComponent(
        cfg.p2p,
        data_dir.path,
        content=store.bytes_for_cid,
        chain=chain,
        metrics=metrics,
        max_content_bytes=cfg.ipfs.max_library_bytes,
    )


def _follower_factory(
    cfg: NodeConfig, data_dir: DataDir, wiring: Wiring, store: LibraryStore, p2p: Any = None
) -> Any:
    def make() -> Any:
        from web3 import Web3

        from zoo.node.components.library import ChainEvents
        from zoo.registry.chain import RegistryClient
        from zoo.registry.ipfs import IpfsClient
        from zoo.registry.sync import LibraryFollower, LibrarySyncer

        w3 = Web3(Web3.HTTPProvider(wiring.rpc_url, request_kwargs={"timeout": 15}))
        registry = RegistryClient(w3, str(wiring.registry_address))
        ipfs = IpfsClient(str(wiring.ipfs_api), timeout=cfg.ipfs.timeout_s) if wiring.ipfs_api else None
        source: Any = ipfs
        if p2p is not None:
            # IPFS first when there is one; peers when it is down, lacks the content, or is not configured.
            from zoo.node.p2p.content import FirstThatServes, PeerContent, content_verifier

            peers = PeerContent(
                lambda: p2p.host, p2p.book, content_verifier(ipfs), timeout_s=cfg.p2p.fetch_timeout_s
            )
            source = FirstThatServes([ipfs, peers] if ipfs is not None else [peers])
        syncer = LibrarySyncer(
            registry, source, store, fetch_timeout_s=cfg.ipfs.timeout_s, max_bytes=cfg.ipfs.max_library_bytes
        )
        cursor = data_dir.path / "library" / "sync-cursor.json"
        return LibraryFollower(
            syncer, ChainEvents(registry, wiring.from_block), cursor, cfg.chain.confirmations
        )

    return make


def _onchain_roots(wiring: Wiring) -> Any:
    """version -> the root the registry holds for it, or None without a chain."""
    if not (wiring.rpc_url and wiring.registry_address):
        return None
    client: list[Any] = []

    def root_of(version: int) -> str:
        if not client:
            from web3 import Web3

            from zoo.registry.chain import RegistryClient

            w3 = Web3(Web3.HTTPProvider(wiring.rpc_url, request_kwargs={"timeout": 5}))
            client.append(RegistryClient(w3, str(wiring.registry_address)))
        return "0x" + client[0].version_at(version).root.hex()

    return root_of


async def serve(cfg: NodeConfig, data_dir: DataDir, wiring: Wiring, started: float) -> int:
    """Run the node until SIGINT/SIGTERM; returns the process exit code."""
    # The handlers go in before anything can see the node: a signal that arrives while it starts (a
    # client that read node.json, say) is a stop request, honoured with the same drain as any other.
    # Installed later, such a signal met asyncio.run's own handler, which cancelled this task mid-start
    # and left the servers undrained (or the process stuck on a thread it never stopped).
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    admin_token = (
        cfg.server.admin_token.get_secret_value() if cfg.server.admin_token else data_dir.admin_token()
    )
    from zoo.inference.bundled_models import ModelUnavailable

    try:
        model_path = await asyncio.to_thread(resolve_model_path, cfg)
    except ModelUnavailable as e:
        raise StartupError(str(e)) from None

    metrics = NodeMetrics(__version__)
    metrics_url = ""
    if cfg.metrics.enabled:
        host, port = parse_listen(cfg.metrics.listen)
        try:
            bound = metrics.serve(host.strip("[]"), port)
        except OSError as e:
            raise StartupError(f"cannot serve metrics on {cfg.metrics.listen}: {e}") from None
        metrics_url = f"http://{host}:{bound}/metrics"

    meter = UsageMeter(data_dir.path / "usage.sqlite", wiring.epoch_s or cfg.credits.epoch_s)
    parts = build_components(cfg, data_dir, model_path, wiring, metrics, meter)
    supervisor = Supervisor(parts.all())
    supervisor.on_change(metrics.component_changed)
    health = HealthBridge(supervisor)
    host, _ = parse_listen(cfg.server.listen)
    bound_port = 0
    credits = _credit_book(cfg, wiring, meter)
    node_address = data_dir.node_address()
    identify = Identify(
        RequestVerifier(
            node_address,
            max_skew_s=cfg.credits.max_clock_skew_s,
            max_remembered=cfg.credits.max_remembered_nonces,
        ),
        metrics,
        cfg.credits.allow_anonymous,
        _spend_check(wiring, node_address, parts.chain, meter) if credits is not None else None,
    )
    inf = cfg.inference
    reserved = min(cfg.credits.reserved_slots, inf.max_batch_size - 1) if credits is not None else 0
    admission = Admission(
        inf.max_batch_size, inf.max_queued, inf.max_wait_s, metrics.queue_wait.observe, reserved=reserved
    )
    model = parts.model
    servicer = NodeServicer(
        supervisor,
        str(cfg.data_dir),
        lambda: f"{host}:{bound_port}",
        model_id(cfg, model_path),
        usage=meter,
        node_address=node_address,
        allows_anonymous=cfg.credits.allow_anonymous,
        ledger_address=str(wiring.ledger_address) if credits is not None else "",
        credit_epoch_s=meter.epoch_s if credits is not None else 0,
        serving=lambda: serving_stats(admission, lambda: model.backend),
        min_similarity=inf.min_similarity,
    )
    metrics.watch_serving(servicer.serving)
    engine = engine_provider(
        cfg, model, parts.library, parts.retrieval, answer_metering(meter, credits, metrics)
    )
    # Placement, readiness and priority: one set of rules for gRPC and the HTTP API.
    rules = ServingRules(
        engine,
        model_id(cfg, model_path),
        adapters=AdapterDirectory(cfg.adapters_dir).names,
        router=_router(cfg, parts.p2p),
        credits=credits,
    )
    library = parts.library
    servicers: list[Any] = [
        (node_pb2_grpc.add_NodeServiceServicer_to_server, servicer),
        (
            library_pb2_grpc.add_LibraryServiceServicer_to_server,
            LibraryServicer(library, _onchain_roots(wiring)),
        ),
        (
            inference_pb2_grpc.add_InferenceServiceServicer_to_server,
            InferenceServicer(
                rules,
                cfg.inference,
                admission,
                peer_id=lambda: parts.p2p.peer_id if parts.p2p is not None else "",
            ),
        ),
    ]
    servicers.append((jobs_pb2_grpc.add_JobServiceServicer_to_server, JobServicer(parts.jobs)))
    try:
        server, bound_port = build_server(cfg, metrics, admin_token, health, servicers, identify)
    except BindError as e:
        metrics.shutdown()
        raise StartupError(str(e)) from None

    deps = ApiDeps(
        rules,
        admission,
        cfg.inference,
        metrics,
        model_id(cfg, model_path),
        _embedder(parts.retrieval),
        embedder_model_id(cfg.embedder.path),
        api_key=cfg.server.api_key.get_secret_value() if cfg.server.api_key else None,
        identify=identify,
    )
    http = await _start_http(cfg, metrics, deps)
    http_url = http.address if http is not None else ""
    if http is not None:
        servicer.http_address = lambda: http_url + "/v1"

    p2p = parts.p2p
    if p2p is not None:
        p2p.capabilities = _capabilities(
            cfg,
            model_id(cfg, model_path),
            library,
            admission,
            lambda: _advertised(cfg, host, bound_port),
            http_url,
        )
        servicer.p2p = p2p

    supervisor.on_change(lambda _s: loop.create_task(health.update()))
    await health.update()
    await server.start()
    supervisor.start()
    address = f"{host}:{bound_port}"
    tls = bool(cfg.server.tls_cert)
    data_dir.write_node_info(
        {
            "pid": os.getpid(),
            "listen": address,
            "tls": tls,
            "metrics": metrics_url,
            "http": http_url,
            "version": __version__,
        }
    )
    log.info(
        "zoo-node listening",
        grpc=address,
        tls=tls,
        metrics=metrics_url or "off",
        http=http_url or "off",
        data_dir=str(cfg.data_dir),
        startup_s=round(time.monotonic() - started, 2),
    )
    _print_banner(address, metrics_url, http_url, cfg, tls)

    await stop.wait()

    log.info("shutting down", grace_period_s=cfg.server.grace_period_s)
    await health.shutdown()
    # New RPCs and HTTP requests are refused at once; in-flight ones get the grace period to finish.
    grace = cfg.server.grace_period_s
    await asyncio.gather(server.stop(grace), *([http.stop(grace)] if http is not None else []))
    if rules.router is not None:
        await rules.router.close()
    await supervisor.stop()
    meter.close()
    metrics.shutdown()
    return EXIT_OK


async def _start_http(cfg: NodeConfig, metrics: NodeMetrics, deps: ApiDeps) -> HttpServer | None:
    """Serve the OpenAI-compatible HTTP API (None when http.enabled is false)."""
    if not cfg.http.enabled:
        return None
    try:
        return await start_http_api(cfg.http, deps, cfg.server.grace_period_s)
    except OSError as e:
        metrics.shutdown()
        raise StartupError(f"cannot serve the HTTP API on {cfg.http.listen}: {e}") from None


def _advertised(cfg: NodeConfig, host: str, port: int) -> str:
    """The gRPC address peers are told to route to ("" when only a wildcard is known)."""
    if cfg.p2p.advertise_grpc:
        return cfg.p2p.advertise_grpc
    return "" if host.strip("[]") in ("0.0.0.0", "::", "") else f"{host}:{port}"


def _credit_book(cfg: NodeConfig, wiring: Wiring, meter: UsageMeter) -> CreditBook | None:
    """Credit balances from the UsageLedger, when the chain has one (read in worker threads: web3 is
    imported at the first signed request, not before the port opens)."""
    if not (wiring.rpc_url and wiring.ledger_address):
        return None
    rpc_url, address = wiring.rpc_url, wiring.ledger_address
    ledger: list[Any] = []

    def balance_of(client: str) -> int:
        if not ledger:
            from web3 import Web3

            from zoo.registry.chain import LedgerClient

            ledger.append(
                LedgerClient(Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 5})), address)
            )
        return ledger[0].balance(client)

    return CreditBook(
        balance_of,
        spent_unsettled=meter.spent_unsettled,
        spent_in=meter.spent_in,
        price_per_token=cfg.credits.price_per_token,
        ttl_s=cfg.credits.balance_ttl_s,
    )


def _spend_check(wiring: Wiring, node_address: str, chain: Component, meter: UsageMeter) -> SpendCheck:
    """Checks clients' spend authorizations against the ledger's domain: the chain's id is the chain
    component's (0, so refused for now, until it has reached the chain)."""
    return SpendCheck(
        node_address,
        str(wiring.ledger_address),
        lambda: int(getattr(chain, "chain_id", 0) or 0),
        meter.epoch_of,
    )


def _router(cfg: NodeConfig, p2p: P2PComponent | None) -> Any:
    """Where requests for models this node does not serve go: a p2p Router, or None (routing off)."""
    if p2p is None or not cfg.p2p.routing:
        return None
    from zoo.node.p2p.routing import Router

    return Router(p2p.book, cfg.p2p.route_timeout_s)


def _capabilities(
    cfg: NodeConfig,
    base_model: str,
    library: LibraryComponent,
    admission: Admission,
    grpc_address: Any,
    http_url: str,
) -> Any:
    """What this node advertises to peers: the models it answers for, its library, its load, addresses."""
    from zoo.node.p2p.messages import Capabilities

    adapters = AdapterDirectory(cfg.adapters_dir)
    gspo = trains_lora(cfg)

    def now() -> Capabilities:
        stats = admission.stats()
        return Capabilities(
            models=[base_model, *adapters.names()][:64],
            backend=cfg.model.backend,
            gpu=cfg.model.device.startswith("cuda"),
            library_version=library.version,
            library_root=library.root,
            job_types=["tf-grpo", "gspo"] if gspo else ["tf-grpo"],
            grpc=grpc_address(),
            http=http_url + "/v1" if http_url else "",
            load=(stats.running + stats.waiting) / max(1, stats.slots),
        )

    return now


def _embedder(retrieval: RetrievalComponent) -> Any:
    """A provider of the loaded embedder: None until the retrieval component has loaded it (and asking
    for it starts a deferred load)."""

    def provide() -> Any:
        if retrieval.retriever is None:
            retrieval.want()
            return None
        return retrieval.retriever.embedder

    return provide


def _print_banner(address: str, metrics_url: str, http_url: str, cfg: NodeConfig, tls: bool) -> None:
    if not sys.stdout.isatty() and os.environ.get("ZOO_NODE_BANNER", "1") == "0":
        return
    data_flag = f" --data-dir {cfg.data_dir}"
    lines = [
        f"zoo-node {__version__} is up: gRPC {address}{' (TLS)' if tls else ''}",
        f"  metrics:  {metrics_url or 'off'}",
        f"  openai:   {http_url + '/v1' if http_url else 'off'}",
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
            wiring = wire(cfg)
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
