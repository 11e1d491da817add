"""The daemon's wiring: its components built from the configuration and what start-up resolved (`Parts`,
`build_components`: chain, IPFS, model, p2p, library, retrieval, jobs, settlement), and the pieces the front
doors are given that read them (the credit book, spend checks, the p2p router and capabilities, the
on-chain roots, the embedder). Nothing here starts anything: the daemon (zoo.node.daemon) runs what it
builds, in the order of its lifecycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.inference.adapters import AdapterDirectory
from zoo.node.components.inference import RetrievalComponent
from zoo.node.components.library import LibraryComponent
from zoo.node.components.probes import ChainComponent, IpfsComponent, ModelComponent
from zoo.node.components.served_model import model_id, training_weights, trains_lora
from zoo.node.config import NodeConfig
from zoo.node.credits.book import CreditBook
from zoo.node.credits.consent import SpendCheck
from zoo.node.credits.meter import UsageMeter
from zoo.node.datadir import DataDir
from zoo.node.endpoints import Wiring
from zoo.node.jobs.runner import JobRunner, Resources
from zoo.node.jobs.store import JobState, JobStore
from zoo.node.lifecycle import Component, DisabledComponent
from zoo.node.logs import get_logger
from zoo.node.metrics import NodeMetrics
from zoo.node.provenance.binding import binding_problem
from zoo.registry.library_store import LibraryStore

log = get_logger(__name__)

LIGHT = "a light node (model.backend = 'none') serves no model"

if TYPE_CHECKING:  # imported where p2p is enabled: py-libp2p is heavy at start-up
    from zoo.node.p2p.component import P2PComponent


@dataclass
class Parts:
    """The daemon's components, typed; `all()` is what the supervisor runs, in start order."""

    chain: ChainComponent | DisabledComponent
    ipfs: Component
    model: ModelComponent | DisabledComponent  # disabled: a light node
    p2p: P2PComponent | None  # None: p2p.enabled = false
    library: LibraryComponent
    retrieval: RetrievalComponent | DisabledComponent  # disabled: a light node
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
    model_path: Path | None,
    wiring: Wiring,
    metrics: NodeMetrics,
    meter: UsageMeter,
    model_sha256: str = "",
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
    store = LibraryStore(data_dir.path)
    p2p = _p2p_component(cfg, data_dir, wiring, store, metrics) if cfg.p2p.enabled else None
    factory = None
    if wiring.rpc_url and wiring.registry_address and (wiring.ipfs_api or p2p is not None):
        factory = _follower_factory(cfg, data_dir, wiring, store, p2p)

    def activated(stored: Any) -> None:
        metrics.library_version.set(stored.version)
        metrics.library_experiences.set(len(stored.library.experiences))
        problem = None if cfg.light else binding_problem(stored.library, model_sha256)
        metrics.library_model_mismatch.set(problem is not None)
        if problem is not None:
            wanted = stored.library.base_model_sha256
            log.warning("library made for other model weights", problem=problem, library_model=wanted,
                        served_model=model_sha256)  # fmt: skip
        if p2p is not None:
            p2p.announce(stored.version, stored.root, stored.cid)

    library = LibraryComponent(
        store,
        factory,
        cfg.chain.poll_interval_s,
        on_activate=activated,
        on_refused=lambda reason: metrics.library_refused.labels(reason).inc(),
    )
    if p2p is not None:
        p2p.on_newer_version = lambda _version: library.wake()
    settlement = _settlement(cfg, data_dir, wiring, metrics, meter)
    if cfg.light:
        jobs = JobRunner(
            JobStore(data_dir.path / "jobs.sqlite"), data_dir.path / "jobs", lambda: None,
            refusal=f"{LIGHT}: it runs no jobs",
        )  # fmt: skip
        no_model, no_retrieval = DisabledComponent("model", LIGHT), DisabledComponent("retrieval", LIGHT)
        return Parts(chain, ipfs, no_model, p2p, library, no_retrieval, jobs, settlement)
    model = ModelComponent(
        cfg.model, model_path, model_id(cfg, model_path), cfg.inference.max_batch_size, cfg.cache_dir
    )
    retrieval = RetrievalComponent(
        library,
        cfg.embedder.path,
        data_dir.path / "embeddings.sqlite",
        cfg.inference.ann_threshold,
        index_dir=data_dir.path / "retrieval",
        defer=cfg.model.backend == "llamacpp",
        model_sha256=model_sha256,
    )
    library.on_change = retrieval.library_changed
    return Parts(
        chain, ipfs, model, p2p, library, retrieval,
        _job_runner(cfg, data_dir, model, library, retrieval, metrics, model_sha256), settlement,
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
    model_sha256: str,
) -> JobRunner:
    from zoo.inference.bundled_models import ModelUnavailable, is_prepared

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
            model.backend, retrieval.retriever.embedder, lambda: library.active, local, cfg.model.device,
            model_sha256,
        )  # fmt: skip

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


def onchain_roots(wiring: Wiring) -> Any:
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


def credit_book(cfg: NodeConfig, wiring: Wiring, meter: UsageMeter) -> CreditBook | None:
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


def spend_check(wiring: Wiring, node_address: str, chain: Component, meter: UsageMeter) -> SpendCheck:
    """Checks clients' spend authorizations against the ledger's domain: the chain's id is the chain
    component's (0, so refused for now, until it has reached the chain)."""
    return SpendCheck(
        node_address,
        str(wiring.ledger_address),
        lambda: int(getattr(chain, "chain_id", 0) or 0),
        meter.epoch_of,
    )


def router(cfg: NodeConfig, p2p: P2PComponent | None, engine: Callable[[], Any], model_sha256: str) -> Any:
    """Where requests for models this node does not serve go: a p2p Router, or None (routing off). It checks
    a peer's proofs of the weights this node serves with this node's engine (`engine()`, once loaded)."""
    if p2p is None or not cfg.p2p.routing:
        return None
    from zoo.node.p2p.routing import Router, engine_check

    return Router(
        p2p.book,
        cfg.p2p.route_timeout_s,
        tunnel=p2p.tunnel,
        check_proof=engine_check(engine) if model_sha256 else None,
        model_sha256=model_sha256,
    )


def capabilities(
    cfg: NodeConfig,
    base_model: str,
    model_sha256: str,
    library: LibraryComponent,
    admission: Any,
    grpc_address: Any,
    http_url: str,
    answering: Callable[[], bool],
) -> Any:
    """What this node advertises to peers: the models it answers for (none while its model component cannot
    answer: a node still loading, or whose upstream is down, is no routing target), its library, its load
    (from the front doors' admission: zoo.node.api.admission), addresses."""
    from zoo.node.p2p.messages import Capabilities

    adapters = AdapterDirectory(cfg.adapters_dir)
    gspo = trains_lora(cfg)

    def now() -> Capabilities:
        stats = admission.stats()
        return Capabilities(
            models=[m for m in [base_model, *adapters.names()] if m][:64] if answering() else [],
            model_sha256=model_sha256,
            backend=cfg.model.backend,
            gpu=cfg.model.device.startswith("cuda"),
            library_version=library.version,
            library_root=library.root,
            job_types=[] if cfg.light else ["tf-grpo", "gspo"] if gspo else ["tf-grpo"],
            grpc=grpc_address(),
            http=http_url + "/v1" if http_url else "",
            load=(stats.running + stats.waiting) / max(1, stats.slots),
        )

    return now


def advertised_grpc(cfg: NodeConfig, host: str, port: int) -> str:
    """The gRPC address peers are told to route to: "" when only a wildcard is known, or the node is
    behind NAT (it lists relays), where peers reach its gRPC API over libp2p instead (p2p/tunnel.py)."""
    if cfg.p2p.advertise_grpc:
        return cfg.p2p.advertise_grpc
    if cfg.p2p.relays:
        return ""
    return "" if host.strip("[]") in ("0.0.0.0", "::", "") else f"{host}:{port}"


def embedder(retrieval: RetrievalComponent | DisabledComponent) -> Any:
    """A provider of the loaded embedder: None until the retrieval component has loaded it (and asking
    for it starts a deferred load); None for good on a light node."""

    def provide() -> Any:
        if isinstance(retrieval, DisabledComponent):
            return None
        if retrieval.retriever is None:
            retrieval.want()
            return None
        return retrieval.retriever.embedder

    return provide
