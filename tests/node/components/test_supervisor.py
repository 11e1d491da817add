"""The component supervisor: crashes are reported and retried, never silent."""

from __future__ import annotations

import asyncio

from zoo.node.components.supervisor import Supervisor
from zoo.node.lifecycle import Component, DisabledComponent, State


class Flaky(Component):
    name = "flaky"
    probe_interval_s = 0.02
    has_background_task = True

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.runs = 0

    async def run_forever(self) -> None:
        self.runs += 1
        if self.runs <= self.crashes:
            raise RuntimeError(f"boom {self.runs}")
        await asyncio.Event().wait()


class BadProbe(Component):
    name = "badprobe"
    probe_interval_s = 0.02

    async def probe(self) -> tuple[State, str]:
        raise ConnectionError("refused")


class FailingSetup(Component):
    name = "setup"
    probe_interval_s = 0.02

    def __init__(self) -> None:
        self.attempts = 0

    async def setup(self) -> None:
        self.attempts += 1
        if self.attempts == 1:
            raise OSError("disk gone")


def test_crash_is_reported_then_recovers() -> None:
    async def scenario() -> list[tuple[str, State, str]]:
        flaky = Flaky(crashes=1)
        sup = Supervisor(
            [flaky, BadProbe(), DisabledComponent("chain", "off"), FailingSetup()], max_backoff_s=0.05
        )
        seen: list[tuple[str, State, str]] = []
        sup.on_change(lambda s: seen.append((s.name, s.state, s.detail)))
        # Backoff starts at 1 s; shrink it so the test stays quick.
        sup.start()
        await asyncio.sleep(2.5)
        assert flaky.runs == 2
        assert sup.statuses["flaky"].state == State.SERVING
        assert sup.statuses["badprobe"].state == State.FAILED
        assert "ConnectionError: refused" in sup.statuses["badprobe"].detail
        assert sup.statuses["chain"].state == State.DISABLED
        assert sup.statuses["setup"].state == State.SERVING
        await sup.stop()
        return seen

    seen = asyncio.run(scenario())
    assert ("flaky", State.FAILED, "task crashed: RuntimeError: boom 1") in seen
    assert any(n == "setup" and s == State.FAILED and "disk gone" in d for n, s, d in seen)
