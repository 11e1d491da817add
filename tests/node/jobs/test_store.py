"""Tests of the persistent job store (node/jobs/store.py) on real SQLite files, including SIGKILL crashes."""

from __future__ import annotations

import itertools
import math
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zoo.node.jobs import store as js
from zoo.node.jobs.store import (
    TERMINAL,
    JobEvent,
    JobRecord,
    JobState,
    JobStateError,
    JobStore,
    JobStoreVersionError,
)
from zoo.registry.errors import NotFound, ValidationError, ZooError


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite"


@pytest.fixture
def store(db: Path) -> Iterator[JobStore]:
    s = JobStore(db)
    yield s
    s.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A store clock that advances one second per reading, so creation order is unambiguous."""
    counter = itertools.count(1_000_000)
    monkeypatch.setattr(js, "_now", lambda: float(next(counter)))
    yield


def raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db, isolation_level=None)


# -- create / get / list ------------------------------------------------------------------------


def test_create_and_get(store: JobStore) -> None:
    job = store.create("train", {"lr": 0.1, "epochs": 3, "name": "x"})
    assert isinstance(job, JobRecord)
    assert job.id.startswith("job-") and len(job.id) == 16
    assert job.kind == "train"
    assert job.state is JobState.QUEUED
    assert job.spec == {"lr": 0.1, "epochs": 3, "name": "x"}
    assert job.step == 0 and job.error == "" and job.result is None and not job.cancel_requested
    assert job.created_at == job.updated_at
    assert store.get(job.id) == job
    [ev] = store.events(job.id)
    assert (ev.seq, ev.type, ev.data) == (1, "submitted", {"kind": "train"})


def test_ids_unique(store: JobStore) -> None:
    ids = {store.create("train", {}).id for _ in range(50)}
    assert len(ids) == 50


def test_list_newest_first_limit_and_states(store: JobStore, clock: None) -> None:
    jobs = [store.create("train", {"i": i}) for i in range(5)]
    assert [j.id for j in store.list()] == [j.id for j in reversed(jobs)]
    assert [j.id for j in store.list(limit=2)] == [jobs[4].id, jobs[3].id]
    store.start(jobs[1].id)
    store.finish(jobs[2].id, JobState.FAILED, error="boom")
    assert [j.id for j in store.list(states=[JobState.RUNNING])] == [jobs[1].id]
    assert [j.id for j in store.list(states={JobState.QUEUED, "failed"})] == [  # type: ignore[arg-type]
        jobs[4].id,
        jobs[3].id,
        jobs[2].id,
        jobs[0].id,
    ]
    assert store.list(states=[]) == []


def test_list_ties_broken_by_id(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(js, "_now", lambda: 5.0)
    ids = [store.create("train", {}).id for _ in range(6)]
    assert [j.id for j in store.list()] == sorted(ids, reverse=True)
    assert store.claim_next().id == min(ids)  # type: ignore[union-attr]


@pytest.mark.parametrize("limit", [0, -1, 1001, True, 2.5, "10"])
def test_list_limit_validated(store: JobStore, limit: object) -> None:
    with pytest.raises(ValidationError) as e:
        store.list(limit=limit)  # type: ignore[arg-type]
    assert e.value.field == "limit"


def test_list_unknown_state(store: JobStore) -> None:
    with pytest.raises(ValidationError) as e:
        store.list(states=["paused"])  # type: ignore[list-item]
    assert e.value.field == "states"


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("", {}, "kind"),
        ("   ", {}, "kind"),
        (3, {}, "kind"),
        ("train", [1, 2], "spec"),
        ("train", {"lr": math.nan}, "spec"),
        ("train", {"lr": math.inf}, "spec"),
        ("train", {"x": object()}, "spec"),
    ],
)
def test_create_validates(store: JobStore, kind: object, spec: object, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        store.create(kind, spec)  # type: ignore[arg-type]
    assert e.value.field == field
    assert store.list() == []


# -- ids ----------------------------------------------------------------------------------------


def test_unknown_id_not_found(store: JobStore) -> None:
    missing = "job-0123456789ab"
    for call in (
        lambda: store.get(missing),
        lambda: store.start(missing),
        lambda: store.finish(missing, JobState.FAILED),
        lambda: store.append_event(missing, "log", {}),
        lambda: store.checkpoint(missing, 1, {}),
        lambda: store.load_checkpoint(missing),
        lambda: store.events(missing),
        lambda: store.last_seq(missing),
        lambda: store.request_cancel(missing),
    ):
        with pytest.raises(NotFound, match=f"job {missing} does not exist"):
            call()


@pytest.mark.parametrize(
    "bad", ["", "job-", "job-0123456789AB", "job-0123456789abc", "JOB-0123456789ab", "x' OR 1=1 --", None, 7]
)
def test_bad_id_syntax(store: JobStore, bad: object) -> None:
    for method in (store.get, store.start, store.request_cancel, store.load_checkpoint, store.events):
        with pytest.raises(ValidationError) as e:
            method(bad)  # type: ignore[operator]
        assert e.value.field == "id"


# -- state transitions --------------------------------------------------------------------------


def test_start_and_finish(store: JobStore) -> None:
    job = store.create("train", {})
    running = store.start(job.id)
    assert running.state is JobState.RUNNING and running.updated_at >= job.updated_at
    with pytest.raises(JobStateError):
        store.start(job.id)
    done = store.finish(job.id, JobState.SUCCEEDED, result={"loss": 0.5}, event=("finished", {"loss": 0.5}))
    assert done.state is JobState.SUCCEEDED and done.result == {"loss": 0.5} and done.error == ""
    assert store.events(job.id)[-1].type == "finished"
    assert store.get(job.id) == done
    with pytest.raises(JobStateError, match="already succeeded"):
        store.finish(job.id, JobState.FAILED)
    with pytest.raises(JobStateError):
        store.start(job.id)


def test_finish_from_queued_and_error(store: JobStore) -> None:
    job = store.create("train", {})
    failed = store.finish(job.id, JobState.FAILED, error="bad spec")
    assert failed.state is JobState.FAILED and failed.error == "bad spec"
    assert [e.type for e in store.events(job.id)] == ["submitted"]


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING, "bogus"])
def test_finish_needs_terminal_state(store: JobStore, state: object) -> None:
    job = store.create("train", {})
    with pytest.raises(ValidationError) as e:
        store.finish(job.id, state)  # type: ignore[arg-type]
    assert e.value.field == "state"
    assert store.get(job.id).state is JobState.QUEUED


def test_finish_is_atomic_with_its_event(store: JobStore) -> None:
    job = store.start(store.create("train", {}).id)
    with pytest.raises(ValidationError) as e:
        store.finish(job.id, JobState.SUCCEEDED, result={"ok": 1}, event=("finished", {"loss": math.nan}))
    assert e.value.field == "event.data"
    assert store.get(job.id) == job
    assert store.last_seq(job.id) == 1


def test_terminal_set() -> None:
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == TERMINAL
    assert JobState("running") is JobState.RUNNING and str(JobState.RUNNING) == "running"


def test_job_state_error_is_zoo_error() -> None:
    assert issubclass(JobStateError, ZooError)


# -- events -------------------------------------------------------------------------------------


def test_events_seq_and_filtering(store: JobStore) -> None:
    a = store.create("train", {})
    b = store.create("train", {})
    for i in range(5):
        ev = store.append_event(a.id, "log", {"i": i})
        assert isinstance(ev, JobEvent) and ev.seq == i + 2 and ev.job_id == a.id
    store.append_event(b.id, "log", {"i": 99})
    assert [e.seq for e in store.events(a.id)] == [1, 2, 3, 4, 5, 6]
    assert [e.seq for e in store.events(b.id)] == [1, 2]
    assert [e.data["i"] for e in store.events(a.id, after_seq=3)] == [2, 3, 4]
    assert [e.seq for e in store.events(a.id, after_seq=1, limit=2)] == [2, 3]
    assert store.events(a.id, after_seq=6) == []
    assert store.last_seq(a.id) == 6 and store.last_seq(b.id) == 2
    times = [e.at for e in store.events(a.id)]
    assert times == sorted(times)


def test_events_validation(store: JobStore) -> None:
    job = store.create("train", {})
    with pytest.raises(ValidationError) as e:
        store.events(job.id, after_seq=-1)
    assert e.value.field == "after_seq"
    with pytest.raises(ValidationError) as e:
        store.events(job.id, limit=0)
    assert e.value.field == "limit"
    with pytest.raises(ValidationError) as e:
        store.append_event(job.id, "", {})
    assert e.value.field == "type"
    with pytest.raises(ValidationError) as e:
        store.append_event(job.id, "log", {"x": math.nan})
    assert e.value.field == "data"
    assert store.last_seq(job.id) == 1


def test_concurrent_appends_get_distinct_seqs(db: Path) -> None:
    stores = [JobStore(db), JobStore(db)]
    job = stores[0].create("train", {})

    def work(s: JobStore, t: int) -> None:
        for i in range(25):
            s.append_event(job.id, "log", {"t": t, "i": i})

    threads = [threading.Thread(target=work, args=(stores[t % 2], t)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.seq for e in stores[1].events(job.id)] == list(range(1, 102))
    for s in stores:
        s.close()


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_roundtrip(store: JobStore) -> None:
    job = store.start(store.create("train", {}).id)
    assert store.load_checkpoint(job.id) is None
    assert store.checkpoint(job.id, 1, {"w": [1.0, 2.0]}) is None
    ev = store.checkpoint(job.id, 2, {"w": [3.0]}, event=("step_completed", {"step": 2}))
    assert ev is not None and (ev.seq, ev.type, ev.data) == (2, "step_completed", {"step": 2})
    assert store.load_checkpoint(job.id) == {"w": [3.0]}
    assert store.get(job.id).step == 2
    assert store.checkpoint(job.id, 2, {"w": [4.0]}) is None  # the same step again is allowed
    assert store.load_checkpoint(job.id) == {"w": [4.0]}


def test_checkpoint_step_cannot_go_backwards(store: JobStore) -> None:
    job = store.start(store.create("train", {}).id)
    store.checkpoint(job.id, 5, {"at": 5})
    with pytest.raises(ValidationError) as e:
        store.checkpoint(job.id, 4, {"at": 4}, event=("step_completed", {"step": 4}))
    assert e.value.field == "step"
    assert store.load_checkpoint(job.id) == {"at": 5} and store.get(job.id).step == 5
    assert store.last_seq(job.id) == 1
    for bad in (-1, True, 1.5):
        with pytest.raises(ValidationError):
            store.checkpoint(job.id, bad, {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "event",
    [
        ("step_completed", {"step": 2, "loss": math.nan}),
        ("step_completed", {"step": 2, "blob": object()}),
        ("step_completed", {"step": 2, "s": {1, 2}}),
    ],
)
def test_checkpoint_and_event_all_or_nothing(store: JobStore, event: tuple[str, dict]) -> None:
    job = store.start(store.create("train", {}).id)
    store.checkpoint(job.id, 1, {"w": 1}, event=("step_completed", {"step": 1}))
    before = store.get(job.id)
    with pytest.raises(ValidationError) as e:
        store.checkpoint(job.id, 2, {"w": 2}, event=event)
    assert e.value.field == "event.data"
    assert store.load_checkpoint(job.id) == {"w": 1}
    assert store.get(job.id) == before
    assert [e.type for e in store.events(job.id)] == ["submitted", "step_completed"]
    # The store is still usable: no transaction was left open.
    assert store.checkpoint(job.id, 2, {"w": 2}, event=("step_completed", {"step": 2})) is not None


def test_checkpoint_rolled_back_when_sqlite_fails_mid_transaction(store: JobStore, db: Path) -> None:
    job = store.start(store.create("train", {}).id)
    store.checkpoint(job.id, 1, {"w": 1})
    conn = raw(db)
    conn.execute(
        "CREATE TRIGGER boom BEFORE INSERT ON events WHEN NEW.type = 'boom' "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    conn.close()
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        store.checkpoint(job.id, 7, {"w": 7}, event=("boom", {"step": 7}))
    assert store.load_checkpoint(job.id) == {"w": 1}
    assert store.get(job.id).step == 1
    assert store.last_seq(job.id) == 1
    with JobStore(db) as other:  # another connection sees no half-written state either
        assert other.load_checkpoint(job.id) == {"w": 1}
    store.checkpoint(job.id, 7, {"w": 7}, event=("step_completed", {"step": 7}))
    assert store.get(job.id).step == 7


def test_checkpoint_state_validated(store: JobStore) -> None:
    job = store.start(store.create("train", {}).id)
    with pytest.raises(ValidationError) as e:
        store.checkpoint(job.id, 1, {"w": math.nan})
    assert e.value.field == "state"
    with pytest.raises(ValidationError):
        store.checkpoint(job.id, 1, {}, event=("step_completed",))  # type: ignore[arg-type]
    assert store.load_checkpoint(job.id) is None


def test_checkpoint_of_finished_job_refused(store: JobStore) -> None:
    job = store.create("train", {})
    store.finish(job.id, JobState.CANCELLED)
    with pytest.raises(JobStateError):
        store.checkpoint(job.id, 1, {})


# -- recovery, claiming, cancelling -------------------------------------------------------------


def test_recover_and_claim_next(store: JobStore, clock: None) -> None:
    a, b, c, d = (store.create("train", {"i": i}) for i in range(4))
    assert store.claim_next().id == a.id  # type: ignore[union-attr]
    assert store.claim_next().id == b.id  # type: ignore[union-attr]
    store.checkpoint(b.id, 3, {"w": 3})
    store.finish(c.id, JobState.SUCCEEDED)
    store.request_cancel(a.id)
    assert sorted(store.recover()) == sorted([a.id, b.id])
    ra, rb = store.get(a.id), store.get(b.id)
    assert ra.state is rb.state is JobState.QUEUED
    assert ra.cancel_requested  # recover clears nothing else
    assert rb.step == 3 and store.load_checkpoint(b.id) == {"w": 3}
    assert store.events(b.id)[-1].type == "interrupted" and store.events(b.id)[-1].data == {"step": 3}
    assert store.get(c.id).state is JobState.SUCCEEDED
    assert store.recover() == []
    claimed = [store.claim_next() for _ in range(4)]
    assert [j.id if j else None for j in claimed] == [a.id, b.id, d.id, None]
    assert all(j is None or j.state is JobState.RUNNING for j in claimed)


def test_claim_next_is_exclusive_across_stores(db: Path) -> None:
    stores = [JobStore(db) for _ in range(3)]
    ids = {stores[0].create("train", {}).id for _ in range(30)}
    claimed: list[str] = []
    lock = threading.Lock()

    def work(s: JobStore) -> None:
        while (job := s.claim_next()) is not None:
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)
    for s in stores:
        s.close()


def test_request_cancel(store: JobStore) -> None:
    queued = store.create("train", {})
    cancelled = store.request_cancel(queued.id)
    assert cancelled.state is JobState.CANCELLED
    assert store.events(queued.id)[-1].type == "cancelled"

    running = store.start(store.create("train", {}).id)
    flagged = store.request_cancel(running.id)
    assert flagged.state is JobState.RUNNING and flagged.cancel_requested
    assert store.request_cancel(running.id).cancel_requested  # idempotent
    store.finish(running.id, JobState.CANCELLED, event=("cancelled", {"step": 0}))

    done = store.create("train", {})
    store.finish(done.id, JobState.SUCCEEDED)
    with pytest.raises(JobStateError, match=f"job {done.id} already succeeded"):
        store.request_cancel(done.id)
    with pytest.raises(JobStateError, match="already cancelled"):
        store.request_cancel(queued.id)


# -- persistence and the file -------------------------------------------------------------------


def test_reopen_sees_everything(db: Path) -> None:
    s = JobStore(db)
    a = s.create("train", {"lr": 0.01})
    b = s.start(s.create("eval", {"n": 2}).id)
    s.checkpoint(b.id, 4, {"w": [1, 2]}, event=("step_completed", {"step": 4}))
    s.request_cancel(b.id)
    c = s.finish(s.create("train", {}).id, JobState.FAILED, error="oops", result={"partial": True})
    snapshot = {j.id: j for j in s.list()}
    events = {j: s.events(j) for j in snapshot}
    s.close()

    s2 = JobStore(db)
    assert {j.id: j for j in s2.list()} == snapshot
    assert {j: s2.events(j) for j in snapshot} == events
    assert s2.load_checkpoint(b.id) == {"w": [1, 2]}
    assert s2.get(c.id).error == "oops" and s2.get(c.id).result == {"partial": True}
    assert s2.get(a.id).state is JobState.QUEUED
    assert s2.get(b.id).cancel_requested
    s2.close()


def test_two_stores_share_a_file(db: Path) -> None:
    daemon, cli = JobStore(db), JobStore(db)
    job = daemon.create("train", {})
    assert cli.get(job.id) == job
    daemon.start(job.id)
    cli.request_cancel(job.id)
    assert daemon.get(job.id).cancel_requested
    daemon.close()
    cli.close()


def test_file_settings(store: JobStore, db: Path) -> None:
    conn = raw(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == js.SCHEMA_VERSION == 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert store._conn is not None
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


def test_newer_schema_refused(db: Path) -> None:
    JobStore(db).close()
    conn = raw(db)
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    with pytest.raises(JobStoreVersionError, match="schema version 2") as e:
        JobStore(db)
    assert isinstance(e.value, ZooError)


def test_newer_schema_refused_on_foreign_file(db: Path) -> None:
    conn = raw(db)
    conn.execute("CREATE TABLE something_else (x)")
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    with pytest.raises(JobStoreVersionError):
        JobStore(db)
    conn = raw(db)  # left untouched
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 9
    conn.close()


def test_closed_store(db: Path) -> None:
    s = JobStore(db)
    s.close()
    s.close()
    with pytest.raises(ZooError, match="closed"):
        s.list()


def test_in_data_dir(tmp_path: Path) -> None:
    with JobStore.in_data_dir(tmp_path / "data") as s:
        s.create("train", {})
    assert (tmp_path / "data" / "jobs.sqlite").is_file()


# -- crash safety -------------------------------------------------------------------------------

_WORKER = """
import sys
from pathlib import Path
from zoo.node.jobs.store import JobStore

store = JobStore(Path(sys.argv[1]))
job_id = sys.argv[2]
store.recover()
job = store.claim_next()
assert job is not None and job.id == job_id, job
ckpt = store.load_checkpoint(job_id)
step = ckpt["step"] if ckpt else 0
print("ready", step, flush=True)
while True:
    step += 1
    store.append_event(job_id, "log", {"step": step})
    store.checkpoint(
        job_id, step, {"step": step, "weights": [step] * 500}, event=("step_completed", {"step": step})
    )
"""


def _check_consistent(db: Path, job_id: str) -> int:
    conn = raw(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with JobStore(db) as s:
        job = s.get(job_id)
        ckpt = s.load_checkpoint(job_id)
        events = s.events(job_id, limit=10_000)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        steps = [e.data["step"] for e in events if e.type == "step_completed"]
        assert steps == list(range(1, len(steps) + 1))
        if ckpt is None:
            assert steps == [] and job.step == 0
            return 0
        assert ckpt["step"] == job.step == steps[-1]
        assert ckpt["weights"] == [ckpt["step"]] * 500
        return job.step


@pytest.mark.slow
def test_sigkill_leaves_checkpoint_and_event_consistent(db: Path) -> None:
    with JobStore(db) as s:
        job_id = s.create("train", {}).id
    rng = random.Random(20240611)
    last = 0
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(db), job_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert line.startswith("ready"), (line, proc.stderr.read().decode() if proc.stderr else "")
            assert int(line.split()[1]) == last  # it resumes from the last checkpoint
            time.sleep(rng.uniform(0.05, 0.5))
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        assert proc.returncode == -signal.SIGKILL
        step = _check_consistent(db, job_id)
        assert step >= last
        last = step
    assert last > 0
    with JobStore(db) as s:
        assert s.get(job_id).state is JobState.RUNNING
        assert s.recover() == [job_id]
        assert len([e for e in s.events(job_id, limit=10_000) if e.type == "interrupted"]) == 5
