"""A scripted LLM for trainer tests: deterministic replies chosen by a Python policy.

It stands in for a remote model whose answers a test must control (malformed JSON on purpose, a lesson
that hurts validation); the real bundled model runs the same code paths in the end-to-end tests. It is
served two ways: `ScriptedBackend` (the Backend protocol, in process) and `ScriptedServer`, a real
HTTP server speaking the OpenAI /v1/chat/completions SSE protocol, which a daemon's openai backend uses.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from zoo.inference.backend_protocol import Chunk, GenerationRequest, GenerationResult
from zoo.trainer.tfgrpo import critic

Policy = Callable[["Call"], str]


@dataclass
class Call:
    messages: list[dict[str, str]]
    seed: int
    temperature: float
    logits_processor: Any = None  # decode-time expert factors the caller asked for (ScriptedBackend)

    @property
    def system(self) -> str:
        return self.messages[0]["content"] if self.messages and self.messages[0]["role"] == "system" else ""

    @property
    def user(self) -> str:
        """The last user turn: the real question (worked examples come as earlier user turns)."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")

    @property
    def last(self) -> str:
        return self.messages[-1]["content"]

    @property
    def stage(self) -> str:
        s = self.system
        if s.startswith(critic.SUMMARISE_SYSTEM[:40]):
            return "summarise"
        if s.startswith(critic.COMPARE_SYSTEM[:40]):
            return "compare"
        if s.startswith(critic.MERGE_SYSTEM[:40]):
            return "merge"
        return "rollout"

    @property
    def retry(self) -> bool:
        return critic.STRICT_MARK in self.last


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def stages(self) -> list[str]:
        with self.lock:
            return [c.stage for c in self.calls]


class ScriptedBackend:
    supports_logits_processors = False

    def __init__(self, policy: Policy, model_id: str = "scripted", delay_s: float = 0.0) -> None:
        self.policy = policy
        self.model_id = model_id
        self.context_length = 32_768
        self.delay_s = delay_s
        self.recorder = Recorder()

    def count_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) + 4 for m in messages)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        import asyncio

        call = Call(request.messages, request.seed, request.temperature, request.logits_processor)
        self.recorder.add(call)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = self.policy(call)
        yield Chunk(text)
        yield Chunk(
            "", GenerationResult(text, self.count_prompt_tokens(request.messages), len(text.split()), "stop")
        )

    async def close(self) -> None:
        return None


class ScriptedServer:
    """The policy behind a real OpenAI-compatible HTTP endpoint on 127.0.0.1 (a thread of this process)."""

    def __init__(self, policy: Policy, delay_s: float = 0.0) -> None:
        self.policy = policy
        self.delay_s = delay_s
        self.recorder = Recorder()
        self.in_flight = 0
        self.max_in_flight = 0
        self._gauge = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                call = Call(body["messages"], int(body.get("seed", 0)), float(body.get("temperature", 0)))
                outer.recorder.add(call)
                with outer._gauge:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    text = outer.policy(call)
                finally:
                    with outer._gauge:
                        outer.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                event = {"choices": [{"delta": {"content": text}, "finish_reason": "stop"}]}
                usage = {
                    "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split())},
                }
                self.wfile.write(
                    f"data: {json.dumps(event)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
                )

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- a policy kit ------------------------------------------------------------------------------------

QUESTION_RE = re.compile(r"What is (\d+) plus (\d+)\?")


def boxed(value: object) -> str:
    return f"Adding the numbers step by step. The answer is \\boxed{{{value}}}."


def ops_json(*ops: dict[str, Any]) -> str:
    return json.dumps({"operations": list(ops)})


def carries_experience(call: Call) -> bool:
    """Whether the prompt holds an experience: a lesson in the system turn, or a worked example's turns."""
    return "[" in call.system or len(call.messages) > 2


def one_wrong_in(n: int) -> Callable[[Call], bool]:
    """Greedy (validation) rollouts are right once the prompt carries an experience (a library helps this
    model, so what a step adds earns a better validation score) and wrong without; of the sampled rollouts
    of each question, every n-th is wrong, so a group of n or more always has mixed rewards whatever the
    seeds are."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def correct(call: Call) -> bool:
        if call.temperature == 0:
            return carries_experience(call)
        with lock:
            k = seen[call.user] = seen.get(call.user, -1) + 1
        return k % n != n - 1

    return correct


def arithmetic_policy(
    *,
    correct: Callable[[Call], bool],
    compare: Callable[[Call], str],
    merge: Callable[[Call], str] | None = None,
) -> Policy:
    """Rollouts answer "What is A plus B?" right when `correct(call)`, else off by one; critic stages
    reply with `compare` (stage 2) and `merge` (stage 3) or a fixed summary (stage 1)."""

    def policy(call: Call) -> str:
        stage = call.stage
        if stage == "summarise":
            return "Step 1 added the numbers; the final answer was checked against the reference."
        if stage == "compare":
            return compare(call)
        if stage == "merge":
            return merge(call) if merge else json.dumps({"text": "When adding numbers, add them carefully."})
        m = QUESTION_RE.search(call.user)
        total = int(m.group(1)) + int(m.group(2)) if m else 0
        return boxed(total if correct(call) else total + 1)

    return policy
