"""Where the node's chain, registry and IPFS are: the devnet of its data dir, or configured endpoints. For
CLI commands found without starting anything (`resolve_endpoints`); for the daemon resolved at start-up,
the devnet brought up when none is running and the node registered on its UsageLedger (`wire`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zoo.node.config import NodeConfig
from zoo.node.datadir import DataDir
from zoo.node.logs import get_logger
from zoo.registry.errors import ZooError

log = get_logger(__name__)


class EndpointsUnavailable(ZooError):
    """The configured chain/IPFS endpoints cannot be determined (e.g. the devnet is not running)."""


@dataclass(frozen=True)
class Endpoints:
    rpc_url: str
    registry_address: str
    ipfs_api: str | None
    devnet: bool
    ledger_address: str | None = None  # the UsageLedger (credits), where one is deployed or configured


def resolve_endpoints(cfg: NodeConfig) -> Endpoints:
    """Endpoints for CLI commands: never starts anything (the daemon and `devnet up` do that)."""
    if cfg.chain.mode == "off":
        raise EndpointsUnavailable("chain.mode is 'off': set it to 'devnet' or 'external' to use the chain")
    if cfg.chain.mode == "external":
        assert cfg.chain.rpc_url and cfg.chain.registry_address  # ChainConfig's validator guarantees both
        return Endpoints(
            cfg.chain.rpc_url,
            cfg.chain.registry_address,
            cfg.ipfs.api_url,
            devnet=False,
            ledger_address=cfg.chain.ledger_address,
        )
    from zoo.devnet.manager import Devnet, DevnetError

    try:
        info = Devnet(cfg.data_dir).running()
    except DevnetError as e:
        raise EndpointsUnavailable(str(e)) from None
    if info is None:
        raise EndpointsUnavailable(
            f"no devnet is running for data dir {cfg.data_dir}: start one with `zoo-node devnet up` "
            "(or `zoo-node start`, which starts it)"
        )
    return Endpoints(
        info.rpc_url,
        info.registry_address,
        cfg.ipfs.api_url or info.ipfs_api,
        devnet=True,
        ledger_address=cfg.chain.ledger_address or info.ledger_address or None,
    )


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
        base_models=bundled_model_sha256(cfg),
    )


def bundled_model_sha256(cfg: NodeConfig) -> tuple[str, ...]:
    """The bundled GGUF's hash, which a new devnet's DAO approves as a base model (so a library a job drafts
    on the default node can be proposed there at once); none when the model package is not installed."""
    from zoo.inference.bundled_models import ModelUnavailable, bundled_gguf
    from zoo.inference.provenance.weights import WEIGHT_HASHES_FILE, WeightHashes

    try:
        return (WeightHashes(cfg.cache_dir / WEIGHT_HASHES_FILE).of(bundled_gguf()),)
    except ModelUnavailable:
        return ()


def wire(cfg: NodeConfig) -> Wiring:
    """Resolve chain and IPFS endpoints; in devnet mode start the devnet if none is running (when it cannot:
    EndpointsUnavailable, which the daemon reports as a failed start).

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
            raise EndpointsUnavailable(f"the devnet failed to start: {e}") from None
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
