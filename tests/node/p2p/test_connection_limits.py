"""The connection limit on real libp2p hosts: a P2PComponent (its dial rounds running) that more peers dial
than its `p2p.max_peers` keeps its bootstrap peer, spares new connections for their grace period, and then
closes the excess."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zoo.node.config import P2PConfig
from zoo.node.p2p.component import P2PComponent
from zoo.node.p2p.host import P2PHost, load_identity

pytestmark = pytest.mark.slow


class Running:
    """A component set up and running on an asyncio loop of its own thread."""

    def __init__(self, component: P2PComponent) -> None:
        self.component = component
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the component did not set up"

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        await self.component.setup()
        task = asyncio.create_task(self.component.run_forever())
        self._ready.set()
        await self._stop.wait()
        task.cancel()
        await self.component.stop()

    def stop(self) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[P2PHost]]:
    made = []
    for name in "abcd":  # subscribed to nothing: never in anyone's gossip mesh
        host = P2PHost(load_identity(tmp_path / name / "identity.key"), "/ip4/127.0.0.1/tcp/0", [],
                       validator=lambda *_: True, on_message=lambda *_: None, content=lambda _cid: None,
                       max_content_bytes=1024)  # fmt: skip
        host.start()
        made.append(host)
    yield made
    for host in made:
        host.stop()


def test_surplus_connections_are_closed_after_their_grace_keeping_the_bootstrap(
    tmp_path: Path, hosts: list[P2PHost]
) -> None:
    a, *others = hosts
    settings = P2PConfig(bootstrap=[a.addrs[0]], target_peers=1, max_peers=2, redial_interval_s=0.2,
                         discovery=False)  # fmt: skip
    hub = P2PComponent(settings, tmp_path / "hub", content=lambda _cid: None)
    hub.grace_s = 3.0
    running = Running(hub)
    try:
        assert hub.host is not None
        hub_id, connected = hub.host.peer_id, hub.host.connected
        wait_until(lambda: a.peer_id in connected(), 10, "the hub dialled its bootstrap peer")
        for host in others:
            host.connect(hub.host.addrs[0])
        t0 = time.monotonic()
        assert set(connected()) == {h.peer_id for h in hosts}  # four, above max_peers
        time.sleep(1.5)
        assert len(connected()) == 4, "a connection was closed within its grace period"
        # Closed down to max_peers: two of the three that are neither the bootstrap peer nor young any more.
        wait_until(lambda: len(connected()) <= settings.max_peers, 15, "the excess closed")
        assert time.monotonic() - t0 >= 2.5 and a.peer_id in connected()
        closed = [host for host in others if host.peer_id not in connected()]
        assert len(closed) == 2
        # The far side learns of the close when its read ends: not at once on a loaded machine.
        wait_until(lambda: all(hub_id not in host.connected() for host in closed), 10, "both ends closed")
        time.sleep(1.0)  # and nothing more goes: at max_peers the node keeps what it has
        assert len(connected()) == 2
    finally:
        running.stop()
