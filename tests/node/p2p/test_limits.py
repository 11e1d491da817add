"""The connection limit's choice of peers to close (node/p2p/limits.py); on real hosts: test_host.py."""

from __future__ import annotations

import random

import pytest

from zoo.node.p2p.limits import ConnectionAges, surplus

PEERS = [f"peer{i:02d}" for i in range(20)]


def test_nothing_is_closed_up_to_the_high_water_mark() -> None:
    assert surplus(PEERS[:12], [], high=12, rng=random.Random(0)) == []


def test_above_it_the_excess_is_closed_sparing_the_protected() -> None:
    protected = PEERS[:5]
    closing = surplus(PEERS[:15], protected, high=12, rng=random.Random(0))
    assert len(closing) == 3 and not set(closing) & set(protected) and set(closing) <= set(PEERS[:15])


def test_with_too_many_protected_only_the_unprotected_go() -> None:
    closing = surplus(PEERS[:14], PEERS[:13], high=12, rng=random.Random(0))
    assert closing == [PEERS[13]]


@pytest.mark.parametrize("seed", range(5))
def test_nodes_close_different_peers(seed: int) -> None:
    """The choice is random per node: nodes with the same excess do not all close the same peers."""
    picks = {tuple(sorted(surplus(PEERS, [], 12, random.Random(seed * 10 + j)))) for j in range(10)}
    assert len(picks) > 1


def test_young_connections_are_those_within_the_grace_period() -> None:
    ages = ConnectionAges()
    ages.update(["a", "b"], now=100.0)
    ages.update(["a", "b", "c"], now=150.0)
    assert ages.young(now=170.0, grace_s=60) == {"c"}
    ages.update(["c"], now=171.0)  # a and b gone; if they come back they are young again
    ages.update(["a", "c"], now=200.0)
    assert ages.young(now=205.0, grace_s=60) == {"a", "c"}
