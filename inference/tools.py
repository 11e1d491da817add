"""Tool calling for models served here: what the model is told of the tools, how a conversation's earlier
calls and results are written into its turns, the grammar that keeps its calls well-formed, and the
reading of calls out of its answer.

The call syntax is the one Hermes and Qwen models are trained on: each call a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines, results between
`<tool_response>` tags. A chat template that knows tools natively in that syntax gets them as its own
`tools` variable; any other template (the bundled SmolLM2's has no tools) gets the description below in
its system turn. xgrammar builds the grammar for this syntax (its `qwen_3` structural tag): under `auto`
the model writes free text until it opens a call, and from there the call must be valid; under
`required` or a named function it must call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from zoo.registry import untrusted_json
from zoo.registry.errors import ValidationError

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN = "<tool_call>"
MAX_TOOLS = 128


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        spec = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": spec}


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools and how it may use them: `choice` is "auto", "none", "required" or a tool's
    name; `parallel`: more than one call in an answer."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    @property
    def calls(self) -> bool:
        """Whether the model may call tools at all."""
        return self.choice != "none" and bool(self.tools)

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def openai_choice(self) -> Any:
        """tool_choice as OpenAI writes it."""
        if self.choice in ("auto", "none", "required"):
            return self.choice
        return {"type": "function", "function": {"name": self.choice}}

    def structural_tag(self) -> str:
        """The grammar of this spec's answers, as xgrammar's structural tag (JSON)."""
        import xgrammar as xgr

        tag = xgr.get_model_structural_tag(
            "qwen_3",
            tools=[t.openai() for t in self.tools],
            tool_choice=self.openai_choice(),
            reasoning="disabled",
            parallel_tool_calls=self.parallel,
        )
        return str(tag.model_dump_json())


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


def native_tool_syntax(template: str) -> bool:
    """Whether a chat template renders tools itself, and in the syntax this module reads (its calls
    between <tool_call> tags); other templates get the tools described (render_turns)."""
    return "tools" in template and OPEN in template


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation in the shape chat templates that know tools take: an assistant turn's calls as
    OpenAI tool calls with their arguments as objects, tool turns as they are."""
    out = []
    for m in messages:
        turn = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            turn["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.loads(c["arguments"] or "{}")},
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            turn["tool_call_id"] = m.get("tool_call_id", "")
        out.append(turn)
    return out


def written_call(name: str, arguments: str) -> str:
    """A call in the syntax this module reads (how a backend whose server returns calls reports them)."""
    try:
        parsed: Any = untrusted_json.loads(arguments or "{}")
    except json.JSONDecodeError:
        parsed = arguments  # kept as sent: parse_answer then refuses it with the reason
    return (
        f"{OPEN}\n" + json.dumps({"name": name, "arguments": parsed}, ensure_ascii=False) + "\n</tool_call>"
    )


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def check_tools(tools: list[Tool], path: str = "tools[{i}].function.{key}") -> None:
    """Refuse tools a model cannot be asked to call: a bad name, a duplicate, a schema that is not one.
    `path` names a tool's field in errors (the HTTP API's JSON by default)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if len(tools) > MAX_TOOLS:
        raise ValidationError("tools", f"at most {MAX_TOOLS} tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool.name):
            raise ValidationError(path.format(i=i, key="name"), "must be 1 to 64 letters, digits, _ or -")
        if tool.name in seen:
            raise ValidationError(path.format(i=i, key="name"), f"{tool.name!r} is given twice")
        seen.add(tool.name)
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as e:
            raise ValidationError(
                path.format(i=i, key="parameters"), f"is not a valid JSON Schema: {e.message}"
            ) from None
        if tool.parameters.get("type", "object") != "object":
            raise ValidationError(
                path.format(i=i, key="parameters"), "must describe an object (type: object)"
            )


def describe(spec: ToolSpec) -> str:
    """The system-turn text that tells a model without native tool support what it may call and how."""
    listed = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in spec.tools)
    if spec.choice == "required":
        rule = "You must call at least one of them."
    elif spec.choice not in ("auto", "none"):
        rule = f"You must call {spec.choice}."
    else:
        rule = "Call one when it helps answer; otherwise answer directly."
    many = "one or more calls" if spec.parallel else "one call"
    return (
        "# Tools\n\n"
        f"These functions are available. {rule}\n<tools>\n{listed}\n</tools>\n\n"
        f"To call, answer with {many}, each a JSON object with the function's name and its arguments "
        "between tags, like this:\n"
        '<tool_call>\n{"name": "function_name", "arguments": {"argument": "value"}}\n</tool_call>\n'
        "A call's result comes back in the next turn between <tool_response> tags."
    )


def render_turns(messages: list[dict[str, Any]], spec: ToolSpec | None) -> list[dict[str, str]]:
    """Plain {role, content} turns for a template without tools: the tools' description in the system
    turn, each earlier call written as the model writes one, results (role `tool`) as a user turn."""
    turns: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}, ensure_ascii=False
                )
                + "\n</tool_call>"
                for c in m["tool_calls"]
            ]
            turns.append({"role": "assistant", "content": "\n".join(filter(None, [content, *calls]))})
        elif role == "tool":
            result = f"<tool_response>\n{content}\n</tool_response>"
            if turns and turns[-1]["role"] == "user" and turns[-1]["content"].startswith("<tool_response>"):
                turns[-1] = {"role": "user", "content": turns[-1]["content"] + "\n" + result}
            else:
                turns.append({"role": "user", "content": result})
        else:
            turns.append({"role": role, "content": content})
    if spec is not None and spec.calls:
        text = describe(spec)
        if turns and turns[0]["role"] == "system":
            turns[0] = {"role": "system", "content": turns[0]["content"] + "\n\n" + text}
        else:
            turns.insert(0, {"role": "system", "content": text})
    return turns


@dataclass
class ParsedAnswer:
    content: str | None  # the text outside the calls (None when there is none)
    calls: list[ToolCall]
    invalid: str = ""  # why the answer's calls were not taken (then `content` is the whole text)


def parse_answer(text: str, spec: ToolSpec) -> ParsedAnswer:
    """The calls in a model's answer, each checked against its tool's schema. An answer with a call that
    does not parse or validate is returned as text, with the reason."""
    from jsonschema import Draft202012Validator

    blocks = list(CALL.finditer(text))
    unclosed = OPEN in CALL.sub("", text)
    if not blocks and not unclosed:
        return ParsedAnswer(text, [])
    calls: list[ToolCall] = []
    for block in blocks:
        try:
            call = untrusted_json.loads(block.group(1))
        except json.JSONDecodeError as e:
            return ParsedAnswer(text, [], f"a call is not JSON: {e}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedAnswer(text, [], "a call has no name")
        tool = spec.tool(call["name"])
        if tool is None:
            return ParsedAnswer(text, [], f"{call['name']!r} is not one of the tools")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = untrusted_json.loads(arguments)
            except json.JSONDecodeError:
                return ParsedAnswer(text, [], f"the arguments of {tool.name} are not JSON")
        errors = sorted(Draft202012Validator(tool.parameters).iter_errors(arguments), key=str)
        if errors:
            return ParsedAnswer(
                text, [], f"the arguments of {tool.name} do not validate: {errors[0].message}"
            )
        calls.append(ToolCall(new_call_id(), tool.name, json.dumps(arguments, ensure_ascii=False)))
    if unclosed:
        return ParsedAnswer(text, [], "a call was left unfinished")
    if not spec.parallel:
        calls = calls[:1]
    # The text before the first call is the answer's content; what a model writes after its calls (it
    # should wait for their results) is dropped, as vLLM's parser for this syntax does.
    content = text[: blocks[0].start()].rstrip()
    return ParsedAnswer(content or None, calls)
