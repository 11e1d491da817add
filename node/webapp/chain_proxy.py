"""Chain reads for the web app: JSON-RPC requests from a page, forwarded to the node's chain endpoint when
they only read, and only the node's own contracts.

A page reaches the chain through the node (same origin, so its Content-Security-Policy allows nothing but
'self', and a browser far from the node's RPC endpoint still reads the chain). Only the methods below pass:
nothing that sends, signs or changes the endpoint's state (a wallet sends through its own RPC). `eth_call`,
`eth_estimateGas` and `eth_getLogs` must name the registry, its KEEPER token or the ledger, so the
operator's RPC endpoint (perhaps a paid one) is not an open one. A request that is not JSON-RPC 2.0, names
another method or contract, or exceeds the limits is answered with a JSON-RPC error and never forwarded;
the answers of one request (a batch included) share one byte budget, and at most MAX_UPSTREAM reads are in
flight at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from zoo.registry import untrusted_json

READ_METHODS = frozenset(
    {
        "eth_blockNumber",
        "eth_call",
        "eth_chainId",
        "eth_estimateGas",
        "eth_getBalance",
        "eth_getBlockByNumber",
        "eth_getCode",
        "eth_getLogs",
        "eth_getTransactionByHash",
        "eth_getTransactionReceipt",
        "net_version",
    }
)
ON_CONTRACTS = frozenset({"eth_call", "eth_estimateGas", "eth_getLogs"})  # must name a node's contract
MAX_BATCH = 64  # requests in one JSON-RPC batch (a page's proposal list batches its reads)
MAX_REQUEST_BYTES = 256 * 1024
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # all the answers to one request (a batch's together)
MAX_UPSTREAM = 8  # reads in flight to the endpoint, all pages together
TOKEN_SELECTOR = "0xfc0c546a"  # token(): the registry's KEEPER token (keccak("token()")[:4])
INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, UPSTREAM = -32600, -32601, -32700, -32603


class ChainProxy:
    """Forwards a page's read-only JSON-RPC requests on `contracts` (and the registry's token) to
    `rpc_url`."""

    def __init__(self, rpc_url: str, registry: str, others: set[str], timeout_s: float = 15.0) -> None:
        self.rpc_url = rpc_url
        self.registry = registry.lower()
        self._contracts: set[str] | None = None
        self._others = {a.lower() for a in others}
        self._http = httpx.AsyncClient(timeout=timeout_s)
        self._upstream = asyncio.Semaphore(MAX_UPSTREAM)

    async def answer(self, body: bytes) -> Any:
        """The JSON-RPC answer to `body` (a request or a batch): refusals in place, reads forwarded."""
        if len(body) > MAX_REQUEST_BYTES:
            return too_large()
        try:
            parsed = untrusted_json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return _error(None, PARSE_ERROR, f"not JSON: {e}")
        budget = [MAX_ANSWER_BYTES]
        if isinstance(parsed, list):
            if not 0 < len(parsed) <= MAX_BATCH:
                return _error(None, INVALID_REQUEST, f"a batch holds 1 to {MAX_BATCH} requests")
            # Each read forwarded on its own: answers keep the batch's order whatever its ids.
            return list(await asyncio.gather(*(self._answer_one(r, budget) for r in parsed)))
        return await self._answer_one(parsed, budget)

    async def _answer_one(self, request: Any, budget: list[int]) -> Any:
        refused = _refusal(request) or await self._off_contract(request)
        if refused is not None:
            return refused
        answer = await self._forward(request, budget)
        if "error" in answer and answer.get("id") is None:
            answer["id"] = request.get("id")
        return answer

    async def _off_contract(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The refusal of an eth_call or eth_getLogs that names no contract of the node's."""
        if request["method"] not in ON_CONTRACTS:
            return None
        params = request.get("params", [])
        query = params[0] if params and isinstance(params[0], dict) else {}
        named = query.get("address") if request["method"] == "eth_getLogs" else query.get("to")
        addresses = named if isinstance(named, list) else [named]
        contracts = await self.contracts()
        if addresses and all(isinstance(a, str) and a.lower() in contracts for a in addresses):
            return None
        return _error(
            request.get("id"),
            INVALID_REQUEST,
            f"{request['method']} relays reads of this node's contracts only",
        )

    async def contracts(self) -> set[str]:
        """The registry, the ledger and the registry's token (asked of the chain once)."""
        if self._contracts is None:
            call = {"jsonrpc": "2.0", "id": 1, "method": "eth_call",
                    "params": [{"to": self.registry, "data": TOKEN_SELECTOR}, "latest"]}  # fmt: skip
            answer = await self._forward(call, [4096])
            result = answer.get("result")
            found = {self.registry, *self._others}
            if isinstance(result, str) and len(result) == 66:
                self._contracts = {*found, "0x" + result[-40:].lower()}
            else:
                return found  # asked again next time: the chain may be coming up
        return self._contracts

    async def _forward(self, request: Any, budget: list[int]) -> dict[str, Any]:
        try:
            async with self._upstream, self._http.stream("POST", self.rpc_url, json=request) as response:
                data = bytearray()
                async for piece in response.aiter_bytes():
                    data += piece
                    budget[0] -= len(piece)
                    if budget[0] < 0:
                        return _error(
                            None, UPSTREAM, f"the chain's answers are over {MAX_ANSWER_BYTES} bytes"
                        )
            answer = untrusted_json.loads(bytes(data))
        except (httpx.HTTPError, ValueError, UnicodeDecodeError) as e:
            return _error(None, UPSTREAM, f"the chain endpoint did not answer: {type(e).__name__}")
        if not isinstance(answer, dict):
            return _error(None, UPSTREAM, "the chain endpoint's answer is not a JSON-RPC answer")
        return answer

    async def close(self) -> None:
        await self._http.aclose()


def too_large() -> dict[str, Any]:
    return _error(None, INVALID_REQUEST, f"request over {MAX_REQUEST_BYTES} bytes")


def _refusal(request: Any) -> dict[str, Any] | None:
    """The JSON-RPC error for a request that may not pass; None for one that may."""
    if not isinstance(request, dict):
        return _error(None, INVALID_REQUEST, "a request is a JSON object")
    rid = request.get("id")
    if not (rid is None or isinstance(rid, (int, str))):
        return _error(None, INVALID_REQUEST, "id must be a number or a string")
    if request.get("jsonrpc") != "2.0":
        return _error(rid, INVALID_REQUEST, 'jsonrpc must be "2.0"')
    method = request.get("method")
    if not isinstance(method, str):
        return _error(rid, INVALID_REQUEST, "method must be a string")
    if method not in READ_METHODS:
        return _error(
            rid, METHOD_NOT_FOUND, f"{method[:64]} is not a read this node relays (send it from a wallet)"
        )
    if not isinstance(request.get("params", []), list):
        return _error(rid, INVALID_REQUEST, "params must be an array")
    return None


def _error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
