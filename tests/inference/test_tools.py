"""Tool calling below the API: reading calls out of answers (and refusing the ones that do not validate),
describing tools to a template without them, and a template that renders tools itself getting them in
its own place, through the engine, on the bundled GGUF."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams
from zoo.inference.tools import Tool, ToolSpec, parse_answer, render_turns
from zoo.node.config import llamacpp_installed

ADD = Tool(
    "add",
    "Add two numbers.",
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)
SPEC = ToolSpec((ADD,))


def call(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_calls_are_read_and_checked_against_their_schema() -> None:
    parsed = parse_answer("Let me add.\n" + call("add", {"a": 1, "b": 2}) + "\nDone!", SPEC)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("add", {"a": 1, "b": 2})]
    assert parsed.content == "Let me add." and not parsed.invalid  # what follows the calls is dropped
    two = parse_answer(call("add", {"a": 1, "b": 2}) + call("add", {"a": 3, "b": 4}), SPEC)
    assert len(two.calls) == 2 and two.content is None and two.calls[0].id != two.calls[1].id
    one = parse_answer(
        call("add", {"a": 1, "b": 2}) + call("add", {"a": 3, "b": 4}), ToolSpec((ADD,), parallel=False)
    )
    assert len(one.calls) == 1
    assert (
        parse_answer("just text", SPEC).calls == [] and parse_answer("just text", SPEC).content == "just text"
    )
    for bad, why in (
        (call("add", {"a": 1}), "do not validate"),
        (call("add", {"a": "x", "b": 2}), "do not validate"),
        (call("mul", {"a": 1, "b": 2}), "not one of the tools"),
        ("<tool_call>\n{not json}\n</tool_call>", "not JSON"),
        ("<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}), "unfinished"),
    ):
        parsed = parse_answer(bad, SPEC)
        assert parsed.calls == [] and why in parsed.invalid and parsed.content == bad


def test_a_template_without_tools_gets_them_described_and_the_history_written_out() -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2 + 3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}],
        },
        {"role": "tool", "content": "5", "tool_call_id": "c1"},
    ]
    turns = render_turns(history, SPEC)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Be brief.") and '"name": "add"' in turns[0]["content"]
    assert turns[2]["content"] == call("add", {"a": 2, "b": 3})
    assert turns[3]["content"] == "<tool_response>\n5\n</tool_response>"
    # tool_choice none: the history, but no tools offered.
    assert "# Tools" not in render_turns(history, ToolSpec((ADD,), "none"))[0]["content"]


# A chat template that knows tools in the syntax the node reads (written for this test, ChatML markup).
HERMES_STYLE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}TEMPLATE TOOLS:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call with <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role == 'system' %}{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{{ {"name": c.function.name,
  "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


class NoLibrary:
    def resolve(self, root: str) -> tuple:
        return None, "", 0, None


@pytest.mark.skipif(not llamacpp_installed(), reason="llama-cpp-python is built by ./zoo setup")
def test_a_template_that_knows_tools_renders_them_itself() -> None:
    from zoo.inference.bundled_models import bundled_gguf
    from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

    backend = LlamaCppBackend.load(bundled_gguf(), "m", max_batch_size=2, context_length=1024, threads=2)
    prompts: list[str] = []
    encode = backend.gguf.encode_chat

    def spy(messages: list, tools: list | None = None) -> list[int]:
        prompts.append(backend.gguf.render(messages, tools))
        return encode(messages, tools)

    async def ask(params: InferParams) -> InferOutcome:
        engine = InferenceEngine(backend, NoLibrary())
        outcome = None
        async for item in engine.stream(params):
            outcome = item if isinstance(item, InferOutcome) else outcome
        assert outcome is not None
        return outcome

    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}],
        },
        {"role": "tool", "content": "5", "tool_call_id": "c1"},
        {"role": "user", "content": "And 4 + 4?"},
    ]
    try:
        assert not backend.renders_tools  # SmolLM2's own template has no tools
        plain = asyncio.run(ask(InferParams(history, tools=ToolSpec((ADD,), "required"), max_tokens=40)))
        backend.gguf.chat_template = HERMES_STYLE
        backend.gguf.__dict__.pop("_template", None)  # recompiled from the new source
        backend.gguf.encode_chat = spy  # type: ignore[method-assign]
        assert backend.renders_tools
        native = asyncio.run(ask(InferParams(history, tools=ToolSpec((ADD,), "required"), max_tokens=40)))
    finally:
        asyncio.run(backend.close())
    prompt = next(p for p in prompts if "TEMPLATE TOOLS" in p)
    assert json.dumps(ADD.openai()) in prompt and "# Tools" not in prompt  # the template's, not ours
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in prompt
    assert "<tool_response>5</tool_response>" in prompt
    for outcome in (plain, native):  # either way, required: a call that validates
        assert outcome.finish_reason == "tool_calls" and outcome.choices[0].tool_calls[0].name == "add"
