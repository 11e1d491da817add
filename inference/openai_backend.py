"""OpenAI-compatible backend: any server speaking /v1/chat/completions with SSE streaming (a vLLM
server, a hosted API). Token counts come from the server's usage report when it sends one. At most
`max_concurrency` requests are in flight to the server; further callers wait their turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from zoo.inference.backend_protocol import (
    BackendError,
    BackendUnavailable,
    Chunk,
    GenerationRequest,
    GenerationResult,
    TokenLogprob,
)
from zoo.inference.tools import written_call


class OpenAIBackend:
    # Remote servers apply their own sampling; decode-time expert factors need local logits.
    supports_logits_processors = False
    # response_format is forwarded, but whether the server enforces it is the server's business.
    constrains_json = False
    # Chat logprobs are forwarded and read back; a scored plain-text prompt (completions' echo) is not,
    # since this backend speaks only the server's chat endpoint.
    supports_logprobs = True
    supports_echo = False
    # Tools, the conversation's calls and results, tool_choice and parallel_tool_calls go to the server as
    # OpenAI's fields; the calls it answers with come back written into the text (inference.tools'
    # syntax), where the engine reads and validates every backend's calls alike.
    supports_tools = True
    renders_tools = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        context_length: int = 8192,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrency: int = 16,
    ) -> None:
        self.max_batch_size = max_concurrency
        self._slots = asyncio.Semaphore(max_concurrency)
        self.model_id = model
        self.context_length = context_length
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    def count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> int:
        # No tokenizer here: a conservative estimate (about 4 characters a token, plus per-message framing)
        # that the server's own limit still backs up.
        calls = sum(len(json.dumps(m.get("tool_calls") or [])) // 3 for m in messages)
        return sum(len(m["content"]) // 3 + 4 for m in messages) + calls + len(json.dumps(tools or [])) // 3

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        async with self._slots:
            async for chunk in self._stream(request):
                yield chunk

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        body: dict[str, Any] = {
            "model": self.model_id,
            "messages": [_wire(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "seed": request.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.stop:
            body["stop"] = request.stop
        if request.tools:
            body["tools"] = request.tools
            body["tool_choice"] = request.tool_choice or "auto"
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.logprobs is not None:
            body["logprobs"] = True
            if request.logprobs:
                body["top_logprobs"] = request.logprobs
        fmt = request.response_format
        if fmt is not None:
            # The server constrains decoding itself (OpenAI, vLLM and SGLang all accept this shape).
            body["response_format"] = (
                {"type": "json_schema", "json_schema": {"name": "response", "schema": json.loads(fmt.schema)}}
                if fmt.type == "json_schema"
                else {"type": "json_object"}
            )
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}  # the server's streamed calls, by index
        logprobs: list[TokenLogprob] = []
        finish = "stop"
        usage: dict[str, int] = {}
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as resp:
                if resp.status_code >= 400:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    raise BackendError(f"OpenAI-compatible server answered {resp.status_code}: {detail}")
                async for line in resp.aiter_lines():
                    if request.cancel.is_set():
                        finish = "cancelled"
                        break
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    usage = event.get("usage") or usage
                    for choice in event.get("choices", []):
                        for part in (choice.get("delta") or {}).get("tool_calls") or []:
                            call = calls.setdefault(
                                int(part.get("index", len(calls))), {"name": "", "arguments": ""}
                            )
                            function = part.get("function") or {}
                            call["name"] += function.get("name") or ""
                            call["arguments"] += function.get("arguments") or ""
                        delta = (choice.get("delta") or {}).get("content") or ""
                        entries = _logprobs_of(choice) if request.logprobs is not None else []
                        if delta or entries:
                            text.append(delta)
                            logprobs.extend(entries)
                            yield Chunk(delta, logprobs=entries)
                        finish = choice.get("finish_reason") or finish
        except httpx.TransportError as e:
            raise BackendUnavailable(f"OpenAI-compatible server unreachable: {type(e).__name__}: {e}") from e
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise BackendError(f"OpenAI-compatible server sent a malformed event: {e}") from e
        finally:
            request.cancel.set()
        if calls:  # written into the text, where the engine reads every backend's calls
            written = "\n".join(written_call(c["name"], c["arguments"]) for _, c in sorted(calls.items()))
            text.append(("\n" if text else "") + written)
            yield Chunk(text[-1])
            finish = "length" if finish == "length" else "stop"  # the engine reads valid calls as tool_calls
        result = GenerationResult(
            "".join(text),
            int(usage.get("prompt_tokens", self.count_prompt_tokens(request.messages))),
            int(usage.get("completion_tokens", len(text))),
            finish,
            logprobs if request.logprobs is not None else None,
        )
        yield Chunk("", result)

    async def close(self) -> None:
        await self._http.aclose()


def _logprobs_of(choice: dict[str, Any]) -> list[TokenLogprob]:
    """A streamed choice's token log-probabilities (OpenAI's chat shape), as this node's entries."""
    content = (choice.get("logprobs") or {}).get("content") or []

    def data(entry: dict[str, Any]) -> bytes:
        raw = entry.get("bytes")
        return bytes(raw) if raw is not None else str(entry["token"]).encode()

    return [
        TokenLogprob(
            str(e["token"]),
            data(e),
            float(e["logprob"]),
            tuple((str(t["token"]), data(t), float(t["logprob"])) for t in e.get("top_logprobs") or []),
        )
        for e in content
    ]


def _wire(m: dict[str, Any]) -> dict[str, Any]:
    """A turn as OpenAI's API takes it: calls' arguments as JSON text."""
    if not m.get("tool_calls"):
        return m
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        if not isinstance(c["function"]["arguments"], str)
        else c
        for c in m["tool_calls"]
    ]
    return {**m, "content": m.get("content") or None, "tool_calls": calls}
