"""How the daemon builds the web app's data sources (site.WebApp) from its parts: the chain it follows,
library bytes by CID, its status, publishing to IPFS, and the effects its model measures."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

from zoo.node.components.probes import ModelComponent
from zoo.node.components.wiring import Parts, embedder
from zoo.node.config import NodeConfig
from zoo.node.endpoints import Wiring
from zoo.node.webapp.effect import Effects
from zoo.node.webapp.site import WebApp
from zoo.registry.errors import NotFound, ValidationError


def web_app(
    cfg: NodeConfig,
    wiring: Wiring,
    parts: Parts,
    status: Callable[[], Any],
    admin_token: Callable[[], str],
    model_id: str,
) -> WebApp:
    """The governance web app's data (zoo.node.webapp): the chain the node follows, library bytes by CID
    (this node's store first, then IPFS, each checked against the CID), unless http.app_status is off
    `status()` (an awaitable of the status as a dict), publishing to IPFS what a proposal names, and,
    on a node that serves a model, proposals' measured effects through it."""
    store, ipfs_api, limit = parts.library.store, wiring.ipfs_api, cfg.ipfs.max_library_bytes

    def ipfs() -> Any:
        from zoo.registry.ipfs import IpfsClient

        return IpfsClient(str(ipfs_api), timeout=cfg.ipfs.timeout_s)

    def fetch(cid: str) -> bytes:
        stored = store.bytes_for_cid(cid)
        if stored is not None:
            return stored
        if not ipfs_api:
            raise NotFound(f"this node holds no content for {cid} and reaches no IPFS")
        with ipfs() as client:
            return client.fetch_verified(cid, max_size=limit)

    def abis() -> dict[str, Any]:
        from zoo.contracts.build import build

        artifacts = build()
        return {
            name: artifacts.get(name).abi for name in ("ExperienceRegistry", "KeeperToken", "UsageLedger")
        }

    async def fetch_cid(cid: str) -> bytes:
        return await asyncio.to_thread(fetch, cid)

    @functools.cache
    def registry() -> Any:
        from web3 import Web3

        from zoo.registry.chain import RegistryClient

        w3 = Web3(Web3.HTTPProvider(wiring.rpc_url, request_kwargs={"timeout": 15}))
        return RegistryClient(w3, str(wiring.registry_address))

    def named() -> set[str]:
        from zoo.registry.ipfs import normalise_cid

        events = registry().proposal_created_events(wiring.from_block)
        found = set()
        for e in events:
            with contextlib.suppress(ValueError):  # a CID the node cannot read names nothing it publishes
                found.add(normalise_cid(e.cid))
        return found

    def pin(data: bytes) -> str:
        with ipfs() as client:
            return client.add(data, pin=True)

    async def proposed_cids() -> set[str]:
        return await asyncio.to_thread(named)

    def cids_of(proposal_id: int) -> tuple[str, str]:
        found = registry().proposal(proposal_id)
        if found is None:
            raise NotFound(f"no proposal {proposal_id:#066x} on this chain")
        if found.is_call:
            raise ValidationError("proposal", "is a call proposal: it changes no library")
        parent = registry().version_at(found.parent_version).cid if found.parent_version > 0 else ""
        return parent, found.cid

    async def library_cids(proposal_id: int) -> tuple[str, str]:
        return await asyncio.to_thread(cids_of, proposal_id)

    async def current_cid() -> str:
        return await asyncio.to_thread(registry().current_cid)

    async def publish(data: bytes) -> str:
        return await asyncio.to_thread(pin, data)

    effects = None
    if isinstance(parts.model, ModelComponent):
        model = parts.model
        effects = Effects(
            lambda: model.backend,
            embedder(parts.retrieval),
            cfg.inference.serving_defaults(),
            model_id,
            fetch_cid,
            library_cids,
            current_cid,
        )
    return WebApp(
        rpc_url=wiring.rpc_url,
        registry_address=wiring.registry_address,
        ledger_address=wiring.ledger_address,
        abis=abis,
        fetch_cid=fetch_cid,
        status=status if cfg.http.app_status else None,
        proposed_cids=proposed_cids if wiring.rpc_url and wiring.registry_address else None,
        held=lambda cid: store.bytes_for_cid(cid) is not None,
        publish=publish if ipfs_api else None,
        admin_token=admin_token,
        max_library_bytes=limit,
        effects=effects,
        jobs=parts.jobs,
        api_key=cfg.server.api_key.get_secret_value() if cfg.server.api_key else None,
        from_block=wiring.from_block,
    )
