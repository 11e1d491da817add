"""The garbage-collector pause around bulk library work: it nests, overlaps across threads, survives
errors, and leaves the collector as it found it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.errors import ValidationError
from zoo.registry.gc_pause import gc_paused
from zoo.registry.library import Library
from zoo.registry.merkle import library_root


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_nested_pauses_restore_the_collector_only_at_the_outermost_exit() -> None:
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_an_error_inside_still_restores_the_collector() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_overlapping_pauses_in_two_threads_end_with_the_last_one() -> None:
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def a() -> None:
        with gc_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b() -> None:
        a_in.wait(5)
        with gc_paused():
            b_in.set()
            a_out.wait(5)
            seen["after a left"] = gc.isenabled()
        seen["after b left"] = gc.isenabled()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after a left": False, "after b left": True}


def test_library_codecs_leave_the_collector_on_even_when_they_refuse(library: Library) -> None:
    data = encode_library(library)
    assert gc.isenabled()
    assert decode_library(data) == library
    assert gc.isenabled()
    library_root(library)
    assert gc.isenabled()
    with pytest.raises(ValidationError):
        decode_library(b'{"schema": 1}')
    assert gc.isenabled()
