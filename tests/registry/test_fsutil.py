"""Crash-safe writes: a reader sees the old file or the new one, never part of one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zoo.registry import fsutil


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full or slow device makes os.write return fewer bytes than asked; the rest must follow."""
    real_write = os.write
    monkeypatch.setattr(fsutil.os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    target = tmp_path / "state.json"
    fsutil.write_atomic(target, b"0123456789" * 10)
    assert target.read_bytes() == b"0123456789" * 10


def test_a_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old and complete")
    real_write = os.write
    calls = []

    def failing(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, bytes(data[:4]))

    monkeypatch.setattr(fsutil.os, "write", failing)
    with pytest.raises(OSError, match="No space left"):
        fsutil.write_atomic(target, b"new content that does not fit")
    assert target.read_bytes() == b"old and complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
