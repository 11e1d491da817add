"""Admission: slots, two queues (credit holders first), limits, timeouts and cancellation that never leak a
slot. The node-level figure (a holder's latency under a flood) is benchmarks/credits_flood.py."""

from __future__ import annotations

import asyncio

import pytest

from zoo.node.api.admission import Admission
from zoo.registry.errors import Overloaded


async def hold(
    admission: Admission, name: str, order: list[str], release: asyncio.Event, priority: bool = False
) -> None:
    async with admission.slot(priority=priority):
        order.append(name)
        await release.wait()


def test_a_freed_slot_goes_to_credit_holders_first_each_queue_in_arrival_order() -> None:
    async def main() -> list[str]:
        admission = Admission(slots=1, max_queued=10, max_wait_s=10)
        order: list[str] = []
        release = asyncio.Event()
        first = asyncio.create_task(hold(admission, "running", order, release))
        await asyncio.sleep(0)
        tasks = [
            asyncio.create_task(hold(admission, name, order, release, priority=name.startswith("holder")))
            for name in ("anon-1", "holder-1", "anon-2", "holder-2")
        ]
        await asyncio.sleep(0.01)
        assert admission.waiting == 4 and admission.running == 1
        release.set()
        await asyncio.gather(first, *tasks)
        stats = admission.stats()
        assert stats.admitted == 5 and stats.priority_admitted == 2 and stats.queued_then_admitted == 4
        assert admission.running == 0 and admission.waiting == 0
        return order

    assert asyncio.run(main()) == ["running", "holder-1", "holder-2", "anon-1", "anon-2"]


def test_a_full_anonymous_queue_never_keeps_a_holder_out() -> None:
    async def main() -> None:
        admission = Admission(slots=1, max_queued=2, max_wait_s=10)
        order: list[str] = []
        release = asyncio.Event()
        tasks = [asyncio.create_task(hold(admission, f"anon-{i}", order, release)) for i in range(3)]
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="inference queue is full"):
            async with admission.slot():
                pass
        holder = asyncio.create_task(hold(admission, "holder", order, release, priority=True))
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks, holder)
        assert order == ["anon-0", "holder", "anon-1", "anon-2"] and admission.refused_full == 1

    asyncio.run(main())


def test_timeouts_and_cancellations_give_back_what_they_held() -> None:
    async def main() -> None:
        admission = Admission(slots=1, max_queued=5, max_wait_s=0.05)
        release = asyncio.Event()
        order: list[str] = []
        running = asyncio.create_task(hold(admission, "running", order, release))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match=r"within 0.05 s"):
            async with admission.slot(priority=True):
                pass
        cancelled = asyncio.create_task(hold(admission, "cancelled", order, release))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert admission.waiting == 0 and admission.refused_timeout == 1
        release.set()
        await running
        # Every slot is back: as many requests as slots run at once without waiting.
        async with admission.slot() as waited:
            assert waited < 50 and admission.running == 1
        assert admission.running == 0 and order == ["running"]

    asyncio.run(main())


def test_a_slot_handed_to_a_waiter_that_just_gave_up_is_passed_on() -> None:
    async def main() -> None:
        admission = Admission(slots=1, max_queued=5, max_wait_s=10)
        release = asyncio.Event()
        order: list[str] = []
        leaving: asyncio.Task[None] | None = None

        async def run_then_cancel_the_next() -> None:
            async with admission.slot():
                await release.wait()
            # The slot was just handed to `leaving`, which has not resumed yet: it gives up now.
            assert leaving is not None
            leaving.cancel()

        running = asyncio.create_task(run_then_cancel_the_next())
        await asyncio.sleep(0)
        leaving = asyncio.create_task(hold(admission, "leaving", order, release))
        staying = asyncio.create_task(hold(admission, "staying", order, release))
        await asyncio.sleep(0.01)
        release.set()
        await running
        await asyncio.gather(leaving, return_exceptions=True)
        await asyncio.wait_for(staying, 1)
        assert order == ["staying"] and admission.running == 0 and admission.waiting == 0

    asyncio.run(main())


def test_reserved_slots_run_only_credit_holders() -> None:
    async def main() -> None:
        admission = Admission(slots=2, max_queued=5, max_wait_s=10, reserved=1)
        release = asyncio.Event()
        order: list[str] = []
        anonymous = [asyncio.create_task(hold(admission, f"anon-{i}", order, release)) for i in range(2)]
        await asyncio.sleep(0.01)
        assert admission.running == 1 and admission.waiting == 1  # the second slot is the holders'
        holder = asyncio.create_task(hold(admission, "holder", order, release, priority=True))
        await asyncio.sleep(0.01)
        assert order == ["anon-0", "holder"] and admission.running == 2
        release.set()
        await asyncio.gather(*anonymous, holder)
        assert order == ["anon-0", "holder", "anon-1"] and admission.running == 0

    asyncio.run(main())
    with pytest.raises(ValueError, match="from 0 to slots - 1"):
        Admission(slots=2, max_queued=1, max_wait_s=1, reserved=2)
