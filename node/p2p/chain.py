"""The chain as the p2p component checks it: chain id, registry address, a version's on-chain root."""

from __future__ import annotations

import threading
from typing import Any


class RegistryChainView:
    """A lazily connected RegistryClient; calls block (the component runs them in a thread)."""

    def __init__(self, rpc_url: str, registry: str, timeout_s: float = 5.0) -> None:
        self.rpc_url = rpc_url
        self.registry = registry
        self.timeout_s = timeout_s
        self._client: Any = None
        self._chain_id = 0
        self._lock = threading.Lock()

    def _registry(self) -> Any:
        with self._lock:
            if self._client is None:
                from web3 import Web3

                from zoo.registry.chain import RegistryClient

                w3 = Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": self.timeout_s}))
                client = RegistryClient(w3, self.registry)
                self._chain_id = int(w3.eth.chain_id)
                self._client = client
            return self._client

    @property
    def chain_id(self) -> int:
        """0 until `connect` (or any call) has reached the chain once; never blocks."""
        return self._chain_id

    def connect(self) -> None:
        """Reach the chain once (blocking); raises when it is unreachable."""
        self._registry()

    def root_of(self, version: int) -> str | None:
        """One eth_call; None when the registry has no such version (it reverts with UnknownVersion)."""
        from zoo.registry.chain.chain_errors import ContractRevert

        if version < 1:
            return None
        try:
            return "0x" + bytes(self._registry().version_at(version).root).hex()
        except ContractRevert as e:
            if e.error == "UnknownVersion":
                return None
            raise
