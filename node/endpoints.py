"""Where the node's chain, registry and IPFS are: the devnet of its data dir, or configured endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from zoo.node.config import NodeConfig
from zoo.registry.errors import ZooError


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
