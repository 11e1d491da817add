"""Request bodies of the HTTP API and the parsing of their fields into what the engine takes: chat
messages, the completion prompt, response_format, embedding inputs, the OpenAI parameters this node
refuses, and the body itself, read within its size limit.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict

from zoo.inference.backend_protocol import MAX_TOP_LOGPROBS, ResponseFormat
from zoo.inference.structured import parse_response_format
from zoo.inference.tools import Tool, ToolSpec
from zoo.node.api.http.error_bodies import ApiError, api_error_for, invalid, unsupported
from zoo.node.api.serving import FieldNames, check_tool_history, tool_spec_of
from zoo.registry import untrusted_json
from zoo.registry.errors import ValidationError

MAX_EMBED_INPUTS = 256
MAX_EMBED_CHARS = 32_768
DRAIN_FACTOR = 4  # an oversized body is read (and dropped) up to this many times the limit, then cut off

CHAT_FIELDS = FieldNames(
    messages="messages",
    prompt="prompt",
    k="zoo.k",
    max_tokens="max_tokens",
    temperature="temperature",
    top_p="top_p",
    seed="seed",
    stop="stop",
    domain="zoo.domain",
    library_root="zoo.library_root",
    adapter="model",
)
COMPLETION_FIELDS = dataclasses.replace(CHAT_FIELDS, messages="prompt")


def chat_field(field: str) -> str:
    return "response_format.json_schema.schema" if field == "response_format.json_schema" else field


def completion_field(field: str) -> str:
    return "prompt" if field.startswith("messages") else field


# ---------------------------------------------------------------------------------------------- bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send vendor fields; ignore what we do not know


class ZooOptions(BaseModel):
    """The zoo extension of a generation request: what to retrieve and how to use it."""

    model_config = ConfigDict(extra="forbid")
    domain: str = ""
    k: int | None = None
    library_root: str = ""
    disable_experiences: bool = False
    use_expert_factors: bool = False
    receipt: bool = False  # the node's signed receipt of the answer, in the answer's zoo extension
    proof: bool = False  # the answer's proof of inference (zoo.answer-proof/1), in its zoo extension


class StreamOptions(_Body):
    include_usage: bool = False


class Generation(_Body):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored
    zoo: ZooOptions | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[Any] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    function_call: Any = None  # the legacy single call of an assistant turn


class ChatRequest(Generation):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None  # the legacy form of tools
    function_call: Any = None  # the legacy form of tool_choice


class CompletionRequest(Generation):
    prompt: Any = None  # a string, or a list of exactly one string
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None


class EmbeddingRequest(_Body):
    model: str
    input: Any = None  # a string or a list of strings
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


# ---------------------------------------------------------------------------------------------- parsing


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """{"role", "content"} turns (text parts joined, "developer" as the system role); an assistant turn's
    calls as "tool_calls" [{id, name, arguments}], a tool turn's call id as "tool_call_id", checked by
    the rules gRPC shares (serving.check_tool_history)."""
    if not messages:
        raise invalid("messages", "must contain at least one message")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        turn: dict[str, Any] = {"role": role, "content": _text_of(m.content, f"messages[{i}].content")}
        if role == "assistant" and (m.tool_calls or m.function_call):
            turn["tool_calls"] = _calls_of(m, i)
        elif role == "tool":
            turn["tool_call_id"] = m.tool_call_id or ""
        elif role == "function":
            raise invalid(f"messages[{i}].role", "function messages are not supported; send tool messages")
        out.append(turn)
    check_tool_history(out)
    return out


def _calls_of(m: ChatMessage, i: int) -> list[dict[str, str]]:
    raw = m.tool_calls or [{"id": f"legacy-{i}", "type": "function", "function": m.function_call}]
    calls = []
    for j, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(
                f"messages[{i}].tool_calls[{j}].function",
                "must be an object with the function's name and arguments",
            )
        arguments = function.get("arguments", "{}")
        call_id = call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) and call_id else f"call-{i}-{j}",
                "name": function["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            }
        )
    return calls


def tool_spec(body: ChatRequest) -> ToolSpec | None:
    """The request's tools and tool choice (or the legacy functions and function_call); None without
    tools (serving.tool_spec_of's rules, which gRPC shares)."""
    if body.tools and body.functions:
        raise invalid("functions", "send tools or functions, not both")
    legacy = not body.tools and bool(body.functions)
    entries = body.functions if legacy else body.tools
    choice_field = (
        "function_call" if legacy or (body.function_call and not body.tool_choice) else "tool_choice"
    )
    choice = body.function_call if choice_field == "function_call" else body.tool_choice
    tools = []
    for i, entry in enumerate(entries or []):
        if not legacy and (not isinstance(entry, dict) or entry.get("type") != "function"):
            raise invalid(f"tools[{i}].type", "only function tools are supported")
        spec = entry if legacy else entry.get("function")
        where = f"functions[{i}]" if legacy else f"tools[{i}].function"
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise invalid(where, "must carry the function's name")
        parameters = spec.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise invalid(f"{where}.parameters", "must be a JSON Schema object")
        tools.append(Tool(spec["name"], str(spec.get("description") or ""), parameters))
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}, or legacy {"name": ...}
        named = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        choice = named.get("name", named)  # no name: the dict stays, refused below as any non-string
    if choice is not None and not isinstance(choice, str):
        raise invalid(
            choice_field,
            "must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        )
    path = "functions[{i}].{key}" if legacy else "tools[{i}].function.{key}"
    return tool_spec_of(tools, choice, body.parallel_tool_calls, choice_field, path)


def _text_of(content: str | list[dict[str, Any]] | None, field: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(
                f"{field}[{j}]",
                f"only text parts are supported (got type {str(part.get('type'))[:40]!r})",
                code="unsupported_content",
            )
        texts.append(part["text"])
    return "\n".join(texts)


MAX_PROMPT_TOKEN_IDS = 100_000


def completion_prompt(prompt: Any) -> str | list[int]:
    """A completion's prompt: a string, or token ids (what harnesses that tokenize themselves send), alone
    or as a list of exactly one."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        if len(prompt) > MAX_PROMPT_TOKEN_IDS:
            raise invalid("prompt", f"at most {MAX_PROMPT_TOKEN_IDS} token ids")
        return [int(t) for t in prompt]
    if not isinstance(prompt, str):
        raise invalid(
            "prompt",
            "must be a string or a list of token ids (or a list of exactly one of either); "
            "several prompts in one request are not supported",
        )
    if not prompt:
        raise invalid("prompt", "must not be empty")
    return prompt


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def response_format(rf: dict[str, Any] | None) -> ResponseFormat | None:
    """OpenAI's response_format, checked by the same rules as gRPC's (`parse_response_format`)."""
    if rf is None:
        return None
    kind = rf.get("type")
    if not isinstance(kind, str):
        raise invalid("response_format.type", "must be one of 'text', 'json_object', 'json_schema'")
    schema = ""
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise invalid("response_format.json_schema.schema", "must be a JSON Schema object")
        schema = json.dumps(spec["schema"])
    try:
        return parse_response_format(kind, schema)
    except ValidationError as e:  # gRPC's json_schema is the schema text; here it sits in json_schema.schema
        raise api_error_for(e, chat_field) from None


def _check_generation(body: Generation) -> None:
    """Refuse the OpenAI parameters this node cannot honour instead of silently ignoring them."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0):
            raise unsupported(name, "is not supported by this node (only 0)")
    if body.logit_bias:
        raise unsupported("logit_bias")


def check_chat(body: ChatRequest) -> int | None:
    """The checks of a chat request's generation fields; returns the alternatives each token's
    log-probability lists (None: no log-probabilities)."""
    _check_generation(body)
    if body.top_logprobs is not None:
        _check_top(body.top_logprobs, "top_logprobs")
        if not body.logprobs:
            raise invalid("top_logprobs", "needs logprobs = true")
    return (body.top_logprobs or 0) if body.logprobs else None


def _check_top(value: int, name: str) -> None:
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise invalid(name, f"must be in [0, {MAX_TOP_LOGPROBS}] (got {value})")


def check_completion(body: CompletionRequest) -> None:
    _check_generation(body)
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "only best_of = 1 is supported")
    if body.logprobs is not None:
        _check_top(body.logprobs, "logprobs")
    if body.suffix:
        raise unsupported("suffix")


def embedding_inputs(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise invalid("input", "must be a non-empty string or a non-empty list of strings")
    if len(texts) > MAX_EMBED_INPUTS:
        raise invalid("input", f"at most {MAX_EMBED_INPUTS} inputs per request")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise invalid(f"input[{i}]", "must be a string (token-id arrays are not supported)")
        if not 0 < len(t) <= MAX_EMBED_CHARS:
            raise invalid(f"input[{i}]", f"must have 1 to {MAX_EMBED_CHARS} characters")
    return texts


def _read_limit(content_length: str | None, limit: int) -> None:
    if content_length and content_length.isdigit() and int(content_length) > limit * DRAIN_FACTOR:
        raise _too_large(limit)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limit} bytes (http.max_body_bytes)",
        code="request_too_large",
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes as sent: 413 beyond `limit` bytes."""
    _read_limit(request.headers.get("content-length"), limit)
    body = bytearray()
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit * DRAIN_FACTOR:
            raise _too_large(limit)
        if size <= limit:
            body += piece
    if size > limit:  # read to the end, so the client gets the answer instead of a reset connection
        raise _too_large(limit)
    return bytes(body)


def parse_json(body: bytes) -> dict[str, Any]:
    """A body as a JSON object; 400 when it is not one."""
    try:
        data = untrusted_json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return data
