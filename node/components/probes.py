"""The node's built-in components: real health probes of the chain, IPFS, the model and the library."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx

from zoo.node.components.backend_loading import load_backend
from zoo.node.lifecycle import Component, State, in_background_thread
from zoo.node.logs import get_logger

log = get_logger(__name__)


class ChainComponent(Component):
    """Probes an EVM JSON-RPC endpoint (eth_chainId) and checks that the registry contract has code."""

    name = "chain"

    def __init__(self, rpc_url: str, registry_address: str | None, probe_interval_s: float = 5.0) -> None:
        self.rpc_url = rpc_url
        self.registry_address = registry_address
        self.probe_interval_s = probe_interval_s
        self.chain_id = 0
        self._http = httpx.AsyncClient(timeout=5.0)

    async def _rpc(self, method: str, params: list[Any]) -> Any:
        resp = await self._http.post(
            self.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        )
        resp.raise_for_status()
        body = resp.json()
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error'].get('message', body['error'])}")
        return body["result"]

    async def probe(self) -> tuple[State, str]:
        try:
            self.chain_id = int(await self._rpc("eth_chainId", []), 16)
        except (httpx.HTTPError, RuntimeError, ValueError) as e:
            return State.FAILED, f"chain RPC {self.rpc_url} unreachable: {type(e).__name__}: {e}"
        if self.registry_address:
            code = await self._rpc("eth_getCode", [self.registry_address, "latest"])
            if code in ("0x", "0x0", None):
                return (
                    State.FAILED,
                    f"no contract at registry address {self.registry_address} on chain {self.chain_id}",
                )
        return State.SERVING, f"chain {self.chain_id} at {self.rpc_url}"

    async def stop(self) -> None:
        await self._http.aclose()


class IpfsComponent(Component):
    """Probes a Kubo-compatible RPC API (POST /api/v0/version)."""

    name = "ipfs"

    def __init__(self, api_url: str, probe_interval_s: float = 5.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.probe_interval_s = probe_interval_s
        self._http = httpx.AsyncClient(timeout=5.0)

    async def probe(self) -> tuple[State, str]:
        try:
            resp = await self._http.post(f"{self.api_url}/api/v0/version")
            resp.raise_for_status()
            version = resp.json().get("Version", "?")
        except (httpx.HTTPError, ValueError) as e:
            return State.FAILED, f"IPFS API {self.api_url} unreachable: {type(e).__name__}: {e}"
        return State.SERVING, f"IPFS {version} at {self.api_url}"

    async def stop(self) -> None:
        await self._http.aclose()


class ModelComponent(Component):
    """Loads the generation backend (in a worker thread, so the server answers meanwhile) and proves it
    generates before reporting SERVING."""

    name = "model"
    probe_interval_s = 30.0

    def __init__(
        self,
        cfg: Any,
        path: Path | None,
        model_id: str,
        max_batch_size: int = 16,
        cache_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg  # ModelConfig
        self.path = path
        self.cache_dir = cache_dir
        self.model_id = model_id
        self.max_batch_size = max_batch_size
        self.backend: Any = None  # set once it has generated: what the node answers with
        self.load_seconds = 0.0
        # A load runs in a daemon thread so that the server answers meanwhile; stop() calls it off and
        # waits for it, and closes what it made even if readiness never came: native code (llama.cpp's
        # loader and scheduler) left running while the interpreter exits can crash the process.
        self._loaded: Any = None
        self._cancel = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    async def setup(self) -> None:
        import time

        from zoo.inference.backend_protocol import GenerationRequest, generate

        start = time.perf_counter()
        self._idle.clear()
        backend = await in_background_thread(self._load, "load-model")
        # Readiness is "it generates", not "the files loaded": one greedy token through the real backend.
        await generate(backend, GenerationRequest([{"role": "user", "content": "ok"}], max_tokens=1))
        self.backend = backend
        self.load_seconds = time.perf_counter() - start
        log.info(
            "model ready", model=self.model_id, backend=self.cfg.backend, seconds=round(self.load_seconds, 1)
        )

    def _load(self) -> Any:
        try:
            self._loaded = load_backend(
                self.cfg, self.path, self.model_id, self.max_batch_size, self.cache_dir, self._cancel
            )
            return self._loaded
        finally:
            self._idle.set()

    async def probe(self) -> tuple[State, str]:
        if self.backend is None:
            return State.STARTING, "loading"
        where = self.cfg.base_url if self.cfg.backend == "openai" else self.cfg.device
        return State.SERVING, f"{self.model_id} ({self.cfg.backend} on {where})"

    async def stop(self) -> None:
        self._cancel.set()
        if not self._idle.is_set():
            log.info("waiting for the model load to stop", model=self.model_id)
            if not await asyncio.to_thread(self._idle.wait, LOAD_STOP_WAIT_S):
                log.warning("the model load did not stop in time", seconds=LOAD_STOP_WAIT_S)
        backend, self.backend, self._loaded = self.backend or self._loaded, None, None
        if backend is not None:
            await backend.close()


LOAD_STOP_WAIT_S = 30.0  # llama.cpp stops at its next progress report; transformers finishes its load
