"""Tool calls in chat text: describe tools to a model, parse its calls, render the results back.

What the bundled model's chat template does (smollm2-135m-instruct, `chat_template.jinja` next to its
`tokenizer_config.json`): it is plain ChatML and nothing else,

    {{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}

for every message (plus a default system turn when the first message is not one). It never reads a
`tools` variable or a message's `tool_calls`, so `apply_chat_template(..., tools=[...])` silently drops
the tools, and any role string, "tool" included, is printed verbatim (`<|im_start|>tool`). The vocabulary
has no tool special tokens: `<tool_call>` is ordinary text. The tool convention therefore lives in the
messages themselves, and we use the one SmolLM2's function-calling data and the Hermes/Qwen family share:

- the tools are listed as JSON schemas inside `<tools>...</tools>` in the system message (`tools_prompt`);
- the model calls a tool with `<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>`;
  several tags per message are allowed, and one tag may hold a JSON list of such objects (SmolLM2's
  own examples write `<tool_call>[{...}, {...}]</tool_call>`);
- results go back in one "user" turn holding a `<tool_response>...</tool_response>` block per call, in
  call order (SmolLM2's convention; a "tool" role would render as a role the model never saw).

Parsing never raises on model text: each call comes back as a `ToolCall` or a `ToolCallError` whose
message is written for the model (bad JSON, unknown tool, missing, extra or mistyped arguments, an
unclosed tag), so the episode can show the mistake and go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
TOOL_RESULT_ROLE = "user"

# JSON schema type -> check of a decoded JSON value (bool is an int in Python, so it is excluded by hand)
_JSON_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}
_TAG_RE = re.compile(re.escape(CALL_OPEN) + "|" + re.escape(CALL_CLOSE))


@dataclass(frozen=True)
class ToolParameter:
    """One required argument of a tool."""

    name: str
    type: str  # a key of _JSON_TYPES
    description: str

    def __post_init__(self) -> None:
        if self.type not in _JSON_TYPES:
            raise ValueError(f"unsupported parameter type {self.type!r} (use one of {sorted(_JSON_TYPES)})")


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, and its (all required) arguments."""

    name: str
    description: str
    parameters: tuple[ToolParameter, ...] = ()

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        p.name: {"type": p.type, "description": p.description} for p in self.parameters
                    },
                    "required": [p.name for p in self.parameters],
                },
            },
        }


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a known tool with exactly its arguments, correctly typed."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A call that could not be understood; `message` tells the model what was wrong."""

    message: str


ParsedCall = ToolCall | ToolCallError


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The part of a system message that lists the tools and shows the call format."""
    schemas = "\n".join(json.dumps(t.json_schema(), ensure_ascii=False) for t in tools)
    example = json.dumps({"name": tools[0].name, "arguments": {p.name: "..." for p in tools[0].parameters}})
    return (
        f"You have access to the following tools:\n<tools>\n{schemas}\n</tools>\n"
        f"To call a tool, write a JSON object with its name and arguments inside tags, for example:\n"
        f"{CALL_OPEN}{example}{CALL_CLOSE}\n"
        "You may call several tools in one message; their results come back in order, each inside "
        f"{RESPONSE_OPEN}...{RESPONSE_CLOSE}."
    )


def parse_tool_calls(text: str, tools: Sequence[ToolSpec]) -> list[ParsedCall]:
    """The calls in an assistant message, in order; malformed ones as ToolCallError.

    [] means the message does not try to call a tool (a stray closing tag counts as a broken call).
    """
    specs = {t.name: t for t in tools}
    calls: list[ParsedCall] = []
    position = 0
    while (match := _TAG_RE.search(text, position)) is not None:
        if match.group() == CALL_CLOSE:
            calls.append(ToolCallError(f"found {CALL_CLOSE} without a {CALL_OPEN} before it"))
            position = match.end()
            continue
        body_start = match.end()
        end = _TAG_RE.search(text, body_start)
        if end is None or end.group() == CALL_OPEN:
            calls.append(ToolCallError(f"{CALL_OPEN} is not closed with {CALL_CLOSE}"))
            position = body_start
            continue
        calls.extend(_parse_call_body(text[body_start : end.start()], specs))
        position = end.end()
    return calls


def _parse_call_body(body: str, specs: Mapping[str, ToolSpec]) -> list[ParsedCall]:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return [ToolCallError(f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")]
    if isinstance(data, list):
        if not data:
            return [ToolCallError("the tool call holds an empty list")]
        return [_check_call(item, specs) for item in data]
    return [_check_call(data, specs)]


def _check_call(data: Any, specs: Mapping[str, ToolSpec]) -> ParsedCall:
    if not isinstance(data, dict):
        return ToolCallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    extra_keys = sorted(set(data) - {"name", "arguments"})
    if extra_keys:
        return ToolCallError(f"unexpected key(s) in the tool call: {', '.join(extra_keys)}")
    name = data.get("name")
    if not isinstance(name, str):
        return ToolCallError('the tool call needs a "name" string')
    spec = specs.get(name)
    if spec is None:
        return ToolCallError(f"unknown tool {name!r}; available tools: {', '.join(sorted(specs))}")
    arguments = data.get("arguments")
    if not isinstance(arguments, dict):
        return ToolCallError(f'{name}: "arguments" must be a JSON object')
    expected = {p.name: p for p in spec.parameters}
    missing = [p for p in expected if p not in arguments]
    if missing:
        return ToolCallError(f"{name}: missing argument(s): {', '.join(missing)}")
    extra = sorted(set(arguments) - set(expected))
    if extra:
        return ToolCallError(f"{name}: unexpected argument(s): {', '.join(extra)}")
    for parameter in spec.parameters:
        value = arguments[parameter.name]
        if not _JSON_TYPES[parameter.type](value):
            return ToolCallError(
                f"{name}: argument {parameter.name!r} must be a {parameter.type}, got {type(value).__name__}"
            )
    return ToolCall(name, dict(arguments))


def tool_results_message(results: Sequence[str], notes: Sequence[str] = ()) -> dict[str, str]:
    """One chat message carrying the results of a turn's calls, in call order, then any notes."""
    blocks = [f"{RESPONSE_OPEN}\n{result}\n{RESPONSE_CLOSE}" for result in results]
    return {"role": TOOL_RESULT_ROLE, "content": "\n".join([*blocks, *notes])}
