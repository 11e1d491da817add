"""Fixtures for the experience-library tests: sample experiences and one real js-ipfs daemon per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from zoo.devnet.ipfs_daemon import IpfsDaemon
from zoo.registry.experience import Experience
from zoo.registry.ipfs import IpfsClient
from zoo.registry.library import Library

AUTHOR = "0x" + "ab" * 20
BASE_MODEL = "smollm2-135m-instruct"
LESSONS = [
    (
        "math.geometry",
        "When solving geometry problems with intersections, validate solutions lie within segments.",
    ),
    (
        "math.combinatorics",
        "For expected extreme statistics in combinatorial problems, use direct enumeration.",
    ),
    (
        "math.proofs",
        "When using invariants to prove impossibility, validate them against small achievable cases.",
    ),
    (
        "math.algebra",
        "For complex polynomials with real parameters, separate real and imaginary parts first.",
    ),
    (
        "math.geometry",
        "In geometry problems with points on triangle sides, first determine all side lengths.",
    ),
]


def _make_experience(i: int = 0, **changes: object) -> Experience:
    domain, text = LESSONS[i % len(LESSONS)]
    fields: dict[str, object] = {
        "text": text,
        "domain": domain,
        "confidence": 0.5 + i / 100,
        "author": AUTHOR,
        "base_model": BASE_MODEL,
        "created_at": "2025-10-17T12:00:00Z",
    }
    fields.update(changes)
    return Experience.create(**fields)  # type: ignore[arg-type]


@pytest.fixture
def make_experience() -> Callable[..., Experience]:
    """Factory: make_experience(i, **changes) gives the i-th sample lesson with fields changed."""
    return _make_experience


@pytest.fixture
def experiences() -> list[Experience]:
    return [_make_experience(i) for i in range(len(LESSONS))]


@pytest.fixture
def library(experiences: list[Experience]) -> Library:
    return Library.create(
        version=0, base_model=BASE_MODEL, experiences=experiences, description="test library"
    )


@pytest.fixture(scope="session")
def ipfs_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpfsDaemon]:
    with IpfsDaemon(tmp_path_factory.mktemp("ipfs") / "repo", die_with_parent=True) as daemon:
        yield daemon


@pytest.fixture
def ipfs(ipfs_daemon: IpfsDaemon) -> Iterator[IpfsClient]:
    with IpfsClient(ipfs_daemon.api_url, timeout=20.0) as client:
        yield client
