"""Chain reads for the web app: JSON-RPC requests from a page, forwarded to the node's chain endpoint when
they only read.

A page reaches the chain through the node (same origin, so its Content-Security-Policy allows nothing but
'self', and a browser far from the node's RPC endpoint still reads the chain). Only the methods below pass:
nothing that sends, signs or changes the endpoint's state (a wallet sends through its own RPC). A request
that is not JSON-RPC 2.0, names another method, or exceeds the limits is answered with a JSON-RPC error and
never forwarded.
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
        "eth_getBalance",
        "eth_getBlockByNumber",
        "eth_getCode",
        "eth_getLogs",
        "eth_getTransactionByHash",
        "eth_getTransactionReceipt",
        "net_version",
    }
)
MAX_BATCH = 64  # requests in one JSON-RPC batch (a page's proposal list batches its reads)
MAX_REQUEST_BYTES = 256 * 1024
MAX_ANSWER_BYTES = 16 * 1024 * 1024
INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, UPSTREAM = -32600, -32601, -32700, -32603


class ChainProxy:
    """Forwards a page's read-only JSON-RPC requests to `rpc_url`."""

    def __init__(self, rpc_url: str, timeout_s: float = 15.0) -> None:
        self.rpc_url = rpc_url
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def answer(self, body: bytes) -> Any:
        """The JSON-RPC answer to `body` (a request or a batch): refusals in place, reads forwarded."""
        if len(body) > MAX_REQUEST_BYTES:
            return too_large()
        try:
            parsed = untrusted_json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return _error(None, PARSE_ERROR, f"not JSON: {e}")
        if isinstance(parsed, list):
            if not 0 < len(parsed) <= MAX_BATCH:
                return _error(None, INVALID_REQUEST, f"a batch holds 1 to {MAX_BATCH} requests")
            # Each read forwarded on its own, at once: answers keep the batch's order whatever its ids.
            return list(await asyncio.gather(*(self._answer_one(r) for r in parsed)))
        return await self._answer_one(parsed)

    async def _answer_one(self, request: Any) -> Any:
        refused = _refusal(request)
        if refused is not None:
            return refused
        answer = await self._forward(request)
        if isinstance(answer, dict) and "error" in answer and answer.get("id") is None:
            answer["id"] = request.get("id")
        return answer

    async def _forward(self, request: Any) -> Any:
        try:
            async with self._http.stream("POST", self.rpc_url, json=request) as response:
                data = bytearray()
                async for piece in response.aiter_bytes():
                    data += piece
                    if len(data) > MAX_ANSWER_BYTES:
                        return _error(None, UPSTREAM, f"the chain's answer is over {MAX_ANSWER_BYTES} bytes")
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
