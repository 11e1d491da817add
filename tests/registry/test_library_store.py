"""LibraryStore on real files: round trips, refusals, drafts, and crash safety under SIGKILL.

The crash test runs this module as a worker process (`python -m tests.registry.test_library_store
DATA_DIR`) that saves drafts and puts + activates versions in a loop, and kills it at seeded random moments.
"""

from __future__ import annotations

import hashlib
import random
import re
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from zoo.registry.canonical import encode_library
from zoo.registry.errors import IntegrityError, NotFound
from zoo.registry.experience import Experience
from zoo.registry.ipfs import local_cid
from zoo.registry.library import Library
from zoo.registry.library_store import CACHED_VERSIONS, LibraryStore, root_hex
from zoo.registry.merkle import library_root, library_tree

REPO = Path(__file__).resolve().parents[2]
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CREATED = "2026-01-01T00:00:00Z"
# What a library directory may hold once a store has opened it (temp files are gone by then).
ALLOWED = re.compile(r"versions/v\d+-0x[0-9a-f]{64}\.(json|meta)|current\.json|draft\.json")


def experience(i: int | str, confidence: float = 0.5, domain: str = "test.case") -> Experience:
    return Experience.create(
        text=f"When handling case {i}, check the boundary values first.",
        domain=domain,
        confidence=confidence,
        author="job:store-test",
        base_model=BASE_MODEL,
        created_at=CREATED,
    )


@cache
def _pool(n: int) -> tuple[Experience, ...]:
    return tuple(experience(f"shared-{i}") for i in range(n))


def make_lib(version: int, shared: int = 3) -> Library:
    """A deterministic library per version number: `shared` common experiences plus one of its own."""
    parent = "" if version == 1 else "0x" + hashlib.sha256(f"parent-{version}".encode()).hexdigest()
    return Library.create(
        version=version,
        parent_root=parent,
        base_model=BASE_MODEL,
        description=f"store test library, version {version}",
        experiences=[*_pool(shared), experience(f"version-{version}", confidence=0.75)],
    )


def cid_of(lib: Library) -> str:
    return local_cid(encode_library(lib)) if len(encode_library(lib)) <= 262_144 else f"cid-v{lib.version}"


def files_under(store: LibraryStore) -> list[str]:
    return sorted(p.relative_to(store.dir).as_posix() for p in store.dir.rglob("*") if p.is_file())


# -- round trips ------------------------------------------------------------------------------------


def test_put_get_activate_current_round_trip(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    assert store.current() is None
    assert store.list() == []
    lib1, lib2 = make_lib(1), make_lib(2)
    root1 = root_hex(library_root(lib1))
    s1 = store.put(lib1, cid_of(lib1), expected_root=root1)
    assert (s1.version, s1.root, s1.cid, s1.library) == (1, root1, cid_of(lib1), lib1)
    assert s1.path.read_bytes() == encode_library(lib1)
    assert store.current() is None  # stored is not active
    store.activate(s1)
    s2 = store.put(lib2, cid_of(lib2), expected_root=root_hex(library_root(lib2)).upper().replace("0X", "0x"))
    store.activate(s2)

    fresh = LibraryStore(tmp_path)  # nothing cached: everything comes from disk and is re-verified
    cur = fresh.current()
    assert cur is not None
    assert (cur.version, cur.root, cur.cid, cur.library) == (2, s2.root, cid_of(lib2), lib2)
    assert fresh.list() == [(1, root1), (2, s2.root)]
    old = fresh.get(version=1)
    assert (old.root, old.cid, old.library) == (root1, cid_of(lib1), lib1)
    assert fresh.get(root=s2.root.upper().replace("0X", "0x")).library == lib2
    with pytest.raises(NotFound):
        fresh.get(version=3)
    with pytest.raises(NotFound):
        fresh.get(version=1, root=s2.root)

    # Putting the same version again is idempotent; a new CID for it is recorded.
    again = fresh.put(lib1, "bafk-other-cid")
    assert again.root == root1 and LibraryStore(tmp_path).get(version=1).cid == "bafk-other-cid"
    assert files_under(fresh) == sorted(
        [
            f"versions/v1-{root1}.json",
            f"versions/v1-{root1}.meta",
            f"versions/v2-{s2.root}.json",
            f"versions/v2-{s2.root}.meta",
            "current.json",
        ]
    )


def test_memory_holds_a_few_recent_versions_and_older_ones_are_read_again(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    libs = [make_lib(v, shared=20) for v in range(1, CACHED_VERSIONS + 3)]
    stored = [store.put(lib, cid_of(lib)) for lib in libs]
    store.activate(stored[-1])
    assert len(store._cache) == CACHED_VERSIONS  # not one per version ever accepted
    assert store.get(version=libs[-1].version) is stored[-1]  # recent: the very object, no disk read
    old = store.get(version=1)  # evicted: read from disk and verified again
    assert old is not stored[0] and old.library == libs[0] and old.root == stored[0].root
    # The re-read reuses the experiences a recent version holds rather than validating them again.
    shared = {e.id: e for e in stored[-1].library.experiences}
    assert all(e is shared[e.id] for e in old.library.experiences if e.id in shared)
    assert sum(e.id in shared for e in old.library.experiences) == 20
    # Versions carry their leaf hashes, by which the next one finds what it may reuse: put and a re-read
    # record the same ones, the tree's.
    for version, lib in ((stored[0], libs[0]), (old, libs[0]), (stored[-1], libs[-1])):
        assert version.known_leaves() == dict(zip(library_tree(lib).leaf_level, lib.experiences, strict=True))


def test_put_with_wrong_expected_root_raises_and_writes_nothing(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    lib = make_lib(1)
    wrong = root_hex(library_root(make_lib(2)))
    with pytest.raises(IntegrityError) as err:
        store.put(lib, cid_of(lib), expected_root=wrong)
    assert err.value.values["computed"] == root_hex(library_root(lib))
    assert files_under(store) == []
    assert store.list() == []
    with pytest.raises(NotFound):
        store.get(version=1)
    assert LibraryStore(tmp_path).current() is None


# -- corruption ---------------------------------------------------------------------------------------


def _stored(tmp_path: Path, version: int = 2) -> tuple[LibraryStore, Path]:
    store = LibraryStore(tmp_path)
    lib = make_lib(version)
    store.activate(store.put(lib, cid_of(lib)))
    return store, store.get(version=version).path


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


# Each marker locates a byte in one region of the canonical document; the byte after the marker is flipped.
CORRUPTIONS = {
    "experience text": b'"text":"When handling case shared-1, che',
    "experience confidence": b'"confidence":"0.5',
    "experience id": b'"id":"exp-',
    "json structure": b'"experiences":',
    "version number": b'"version":',
    "description": b'"description":"store test lib',
    "base model": b'"base_model":"HuggingFaceTB/Smol',
    "parent root": b'"parent_root":"0x',
}


@pytest.mark.parametrize("region", list(CORRUPTIONS))
def test_corrupted_version_file_is_refused_on_load(tmp_path: Path, region: str) -> None:
    """One flipped bit anywhere in a stored version file must be refused, never served."""
    _, path = _stored(tmp_path)
    original = path.read_bytes()
    marker = CORRUPTIONS[region]
    offset = original.index(marker) + len(marker) - (1 if region == "json structure" else 0)
    _flip(path, offset)
    assert path.read_bytes() != original

    fresh = LibraryStore(tmp_path)
    with pytest.raises(IntegrityError):
        fresh.current()
    with pytest.raises(IntegrityError):
        fresh.get(version=2)


def test_every_single_byte_flip_of_a_version_file_is_refused(tmp_path: Path) -> None:
    _, path = _stored(tmp_path)
    original = path.read_bytes()
    accepted: list[str] = []
    for offset in range(len(original)):
        path.write_bytes(original[:offset] + bytes([original[offset] ^ 0x01]) + original[offset + 1 :])
        try:
            LibraryStore(tmp_path).current()
        except IntegrityError:
            continue
        accepted.append(f"{offset} ({original[max(0, offset - 20) : offset + 5].decode(errors='replace')!r})")
    assert not accepted, f"{len(accepted)} corrupted versions were served, e.g. at bytes {accepted[:5]}"


def test_truncated_or_corrupt_pointer_and_missing_file_are_refused(tmp_path: Path) -> None:
    store, path = _stored(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(IntegrityError):
        LibraryStore(tmp_path).current()
    (store.dir / "current.json").write_text('{"version": 2, "ro')
    with pytest.raises(IntegrityError):
        LibraryStore(tmp_path).current()


def test_activate_rechecks_the_file_on_disk(tmp_path: Path) -> None:
    """activate() promises the version is on disk and intact before it becomes current."""
    store = LibraryStore(tmp_path)
    lib1, lib2 = make_lib(1), make_lib(2)
    store.activate(store.put(lib1, cid_of(lib1)))
    s2 = store.put(lib2, cid_of(lib2))
    _flip(s2.path, s2.path.read_bytes().index(b'"confidence":"0.5') + 17)
    with pytest.raises(IntegrityError):
        store.activate(s2)
    cur = LibraryStore(tmp_path).current()
    assert cur is not None and cur.version == 1


# -- drafts -------------------------------------------------------------------------------------------


def test_drafts_save_load_discard(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    assert store.draft() is None
    store.discard_draft()  # nothing to discard is fine
    lib = make_lib(1)
    store.activate(store.put(lib, cid_of(lib)))
    draft = make_lib(7)
    store.save_draft(draft)
    assert LibraryStore(tmp_path).draft() == draft
    assert (store.dir / "draft.json").read_bytes() == encode_library(draft)
    newer = Library.create(
        version=8, base_model=BASE_MODEL, experiences=[*draft.experiences, experience("draft-extra")]
    )
    store.save_draft(newer)
    assert LibraryStore(tmp_path).draft() == newer
    # The draft is independent of the stored versions and the current pointer.
    cur = store.current()
    assert cur is not None and cur.library == lib and store.list() == [(1, root_hex(library_root(lib)))]
    store.discard_draft()
    assert store.draft() is None and LibraryStore(tmp_path).draft() is None
    assert not (store.dir / "draft.json").exists()
    assert LibraryStore(tmp_path).current() == cur


def test_opening_removes_temp_files_left_by_a_crash(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    lib = make_lib(1)
    stored = store.put(lib, cid_of(lib))
    store.activate(stored)
    leftovers = [
        store.dir / ".current.json.4242.tmp",
        store.dir / ".draft.json.4242.tmp",
        store.versions_dir / f".{stored.path.name}.4242.tmp",
    ]
    for p in leftovers:
        p.write_bytes(b'{"half": ')
    LibraryStore(tmp_path)
    assert not any(p.exists() for p in leftovers)
    assert all(ALLOWED.fullmatch(f) for f in files_under(store))
    cur = LibraryStore(tmp_path).current()
    assert cur is not None and cur.library == lib


def test_a_crash_between_the_meta_and_the_version_file_lists_nothing_half_written(tmp_path: Path) -> None:
    store = LibraryStore(tmp_path)
    lib1, lib2 = make_lib(1), make_lib(2)
    store.put(lib1, cid_of(lib1))
    s2 = store.put(lib2, cid_of(lib2))
    # A version file whose .meta is missing (what the old write order could leave) is not listed ...
    s2.path.with_suffix(".meta").unlink()
    assert LibraryStore(tmp_path).list() == [(1, root_hex(library_root(lib1)))]
    with pytest.raises(NotFound):
        LibraryStore(tmp_path).get(version=2)
    # ... and an orphan .meta (a crash after it, before the version file) is ignored, then overwritten.
    s2.path.unlink()
    s2.path.with_suffix(".meta").write_text('{"cid": "stale", "sha256": "00"}')
    fresh = LibraryStore(tmp_path)
    assert [v for v, _ in fresh.list()] == [1]
    fresh.put(lib2, cid_of(lib2))
    assert LibraryStore(tmp_path).get(version=2).cid == cid_of(lib2)


# -- crash safety -----------------------------------------------------------------------------------

WORKER_SHARED = 120  # experiences per worker library: ~40 kB, so the writes are not instantaneous
KILLS = 10


def _worker(data_dir: Path) -> None:
    """Loop forever: save a draft, put a version, activate it; resumes after the current version."""
    store = LibraryStore(data_dir)
    cur = store.current()
    start = cur.version + 1 if cur else 1
    libs = {v: make_lib(v, WORKER_SHARED) for v in range(start, start + 24)}
    print("ready", flush=True)
    v = start
    while True:
        draft = libs.get(v + 1) or make_lib(v + 1, WORKER_SHARED)
        store.save_draft(draft)
        lib = libs.pop(v, None) or make_lib(v, WORKER_SHARED)
        store.activate(store.put(lib, cid_of(lib)))
        v += 1


def test_sigkill_at_random_moments_leaves_a_consistent_store(tmp_path: Path) -> None:
    rng = random.Random(20260101)
    data_dir = tmp_path / "data"
    last_version = 0
    leftovers_seen = 0
    for kill in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.registry.test_library_store", str(data_dir)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == b"ready\n", f"worker failed: {line!r} {proc.stderr.read() if proc.stderr else ''}"
            time.sleep(rng.uniform(0.0, 0.3))
            assert proc.poll() is None, f"worker died on its own: {proc.stderr.read() if proc.stderr else ''}"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL

        lib_dir = data_dir / "library"
        leftovers_seen += sum(1 for _ in lib_dir.rglob(".*.tmp"))
        store = LibraryStore(data_dir)  # a fresh process opening the store after the crash
        assert list(lib_dir.rglob(".*.tmp")) == [], f"temp files remain after kill {kill}"
        stray = [f for f in files_under(store) if not ALLOWED.fullmatch(f)]
        assert stray == [], f"unexpected files after kill {kill}: {stray}"

        cur = store.current()  # raises IntegrityError if the pointer names a corrupt or partial version
        if cur is not None:
            expected = make_lib(cur.version, WORKER_SHARED)
            assert cur.library == expected
            assert cur.root == root_hex(library_root(expected))
            assert cur.cid == cid_of(expected)
            assert cur.path.read_bytes() == encode_library(expected)
            assert cur.version >= last_version, "the current pointer went backwards"
            last_version = cur.version
        draft = store.draft()  # raises ValidationError if a half-written draft were visible
        if draft is not None:
            assert draft == make_lib(draft.version, WORKER_SHARED)
        for version, _root in store.list():
            # Every stored version (active or not) is whole: it loads and matches its root.
            assert store.get(version=version).library == make_lib(version, WORKER_SHARED)

    assert last_version > KILLS, f"the worker activated only {last_version} versions in {KILLS} runs"
    print(
        f"crash test: {KILLS} kills, {last_version} versions activated, {leftovers_seen} temp files removed"
    )


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))


def test_a_version_whose_cid_is_not_a_cid_is_refused_without_touching_ipfs(tmp_path: Path) -> None:
    """An old deployment's history may hold any bytes as a CID (decoded surrogate-escaped): the syncer
    refuses the version with the reason and never hands those bytes to IPFS; nothing is stored."""
    from dataclasses import dataclass

    from zoo.registry.sync import LibrarySyncer, Refused

    @dataclass
    class Hostile:
        version: int = 1
        root: bytes = b"\x11" * 32
        cid: str = "Qm\udcff\udcfe"

    class NoIpfs:
        def fetch_verified(self, cid: str, **kwargs: object) -> bytes:
            raise AssertionError(f"IPFS was asked for {cid!r}")

    store = LibraryStore(tmp_path)
    refusals: list[tuple[int, str, str]] = []
    syncer = LibrarySyncer(None, NoIpfs(), store, on_refused=lambda *a: refusals.append(a))  # type: ignore[arg-type]
    with pytest.raises(Refused) as e:
        syncer.apply(Hostile())
    assert "cid: the chain's CID for this version is unusable" in str(e.value)
    assert "<invalid CID Qm\\udcff\\udcfe>" in str(e.value)
    assert refusals and store.current() is None and store.list() == []
