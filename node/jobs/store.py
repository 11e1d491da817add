"""Persistent store of the learning jobs the daemon runs: their state, events and checkpoints.

One SQLite file (DATA_DIR/jobs.sqlite) holds a `jobs` table (one row per job, with its latest
checkpoint) and an `events` table (an append-only log per job, numbered 1, 2, ... by `seq`).

The daemon may be killed at any moment, so every change is one transaction (BEGIN IMMEDIATE ...
COMMIT) in WAL mode with synchronous=FULL: a checkpoint and the event announcing it are written
together or not at all, and a committed change survives a power cut. Several JobStore objects, in one
process or several (the daemon and a CLI reading), may share the file; each waits up to 5 s for
another's write lock. Within one object a lock serialises the threads sharing its connection.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from zoo.registry.errors import NotFound, ValidationError, ZooError

DEFAULT_FILENAME = "jobs.sqlite"
SCHEMA_VERSION = 1
MAX_LIST_LIMIT = 1000
MAX_EVENTS_LIMIT = 10_000
_BUSY_TIMEOUT_MS = 5000
_ID_RE = re.compile(r"^job-[0-9a-f]{12}$")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jobs ("
    " id TEXT PRIMARY KEY,"
    " kind TEXT NOT NULL,"
    " state TEXT NOT NULL,"
    " spec TEXT NOT NULL,"
    " created_at REAL NOT NULL,"
    " updated_at REAL NOT NULL,"
    " error TEXT NOT NULL DEFAULT '',"
    " step INTEGER NOT NULL DEFAULT 0,"
    " cancel_requested INTEGER NOT NULL DEFAULT 0,"
    " result TEXT,"
    " checkpoint TEXT)",
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at, id)",
    "CREATE INDEX IF NOT EXISTS jobs_state_created ON jobs (state, created_at, id)",
    "CREATE TABLE IF NOT EXISTS events ("
    " job_id TEXT NOT NULL REFERENCES jobs (id),"
    " seq INTEGER NOT NULL,"
    " type TEXT NOT NULL,"
    " data TEXT NOT NULL,"
    " at REAL NOT NULL,"
    " PRIMARY KEY (job_id, seq)) WITHOUT ROWID",
)

_JOB_COLUMNS = "id, kind, state, spec, created_at, updated_at, error, step, cancel_requested, result"


class JobStateError(ZooError):
    """The job's state does not allow the operation (the gRPC layer maps it to FAILED_PRECONDITION)."""


class JobStoreVersionError(ZooError):
    """The jobs file was written by a newer zoo-node (its schema version is higher than this code's)."""


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class JobRecord:
    id: str
    kind: str
    state: JobState
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    error: str
    step: int
    cancel_requested: bool
    result: dict[str, Any] | None


@dataclass(frozen=True)
class JobEvent:
    job_id: str
    seq: int
    type: str
    data: dict[str, Any]
    at: float


def _now() -> float:
    """The clock of every timestamp in the store (a seam for tests)."""
    return time.time()


def _dumps(field: str, value: Any) -> str:
    if not isinstance(value, dict):
        raise ValidationError(field, f"must be a JSON object (dict), got {type(value).__name__}")
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except ValueError as e:  # NaN / Infinity, or a circular reference
        raise ValidationError(field, f"cannot be stored as JSON: {e}") from e
    except TypeError as e:  # a value (or key) json does not know
        raise ValidationError(field, f"cannot be stored as JSON: {e}") from e


def _check_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not _ID_RE.fullmatch(job_id):
        raise ValidationError("id", f"not a job id (expected job-<12 lowercase hex>): {job_id!r:.80}")
    return job_id


def _check_text(field: str, value: object, max_len: int = 200) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field, "must be a non-empty string")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters")
    return value


def _check_int(field: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ValidationError(field, f"must be {bound}, got {value}")
    return value


def _check_event(event: object) -> tuple[str, dict[str, Any]]:
    if not isinstance(event, tuple) or len(event) != 2:
        raise ValidationError("event", "must be a (type, data) tuple")
    etype, data = event
    _check_text("event.type", etype, 100)
    if not isinstance(data, dict):
        raise ValidationError("event.data", f"must be a dict, got {type(data).__name__}")
    return etype, data


def _record(row: sqlite3.Row | tuple[Any, ...]) -> JobRecord:
    jid, kind, state, spec, created_at, updated_at, error, step, cancel_requested, result = row
    return JobRecord(
        id=jid,
        kind=kind,
        state=JobState(state),
        spec=json.loads(spec),
        created_at=float(created_at),
        updated_at=float(updated_at),
        error=error,
        step=int(step),
        cancel_requested=bool(cancel_requested),
        result=json.loads(result) if result is not None else None,
    )


class JobStore:
    """Jobs, their events and checkpoints in one SQLite file. Safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # isolation_level=None: no implicit transactions; every write opens its own BEGIN IMMEDIATE,
        # which takes the write lock up front (no read-to-write upgrade that could fail midway).
        # check_same_thread=False: every use of the connection holds self._lock instead.
        conn = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._check_version(conn)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ZooError(
                    f"cannot put {self.path} in WAL mode (journal_mode is {mode})", path=str(self.path)
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Checked again under the write lock: another process may have created it meanwhile.
                if self._check_version(conn) == 0:
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> JobStore:
        return cls(Path(data_dir) / DEFAULT_FILENAME)

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JobStoreVersionError(
                f"{self.path} has job store schema version {version}, newer than the {SCHEMA_VERSION} "
                "this zoo-node understands; upgrade zoo-node (or move the file away)",
                path=str(self.path),
                version=version,
            )
        return version

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ZooError(f"job store {self.path} is closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """A transaction opened with `begin`: committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn = self._connection()
            conn.execute(begin)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # also when COMMIT itself failed (disk full, I/O error)
                    conn.execute("ROLLBACK")
                raise

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A consistent snapshot for several SELECTs (a deferred transaction takes no write lock)."""
        return self._transaction("BEGIN")

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One all-or-nothing write transaction: committed when the block ends, rolled back if it raises."""
        return self._transaction("BEGIN IMMEDIATE")

    # -- helpers run inside a transaction -------------------------------------------------------

    @staticmethod
    def _fetch(conn: sqlite3.Connection, job_id: str) -> JobRecord:
        row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"job {job_id} does not exist", id=job_id)
        return _record(row)

    @staticmethod
    def _insert_event(
        conn: sqlite3.Connection, job_id: str, etype: str, data: dict[str, Any], field: str = "data"
    ) -> JobEvent:
        text = _dumps(field, data)
        seq = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?", (job_id,)
        ).fetchone()[0]
        at = _now()
        conn.execute(
            "INSERT INTO events (job_id, seq, type, data, at) VALUES (?, ?, ?, ?, ?)",
            (job_id, seq, etype, text, at),
        )
        return JobEvent(job_id=job_id, seq=int(seq), type=etype, data=json.loads(text), at=at)

    @staticmethod
    def _set_state(conn: sqlite3.Connection, job_id: str, state: JobState, **columns: Any) -> None:
        sets = ", ".join(["state = ?", "updated_at = ?", *(f"{name} = ?" for name in columns)])
        conn.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (state.value, _now(), *columns.values(), job_id))

    # -- jobs -----------------------------------------------------------------------------------

    def create(self, kind: str, spec: dict[str, Any]) -> JobRecord:
        """A new QUEUED job (and its "submitted" event)."""
        _check_text("kind", kind, 100)
        spec_text = _dumps("spec", spec)
        with self._write() as conn:
            while True:
                job_id = "job-" + secrets.token_hex(6)
                if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                    break
            now = _now()
            conn.execute(
                "INSERT INTO jobs (id, kind, state, spec, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, kind, JobState.QUEUED.value, spec_text, now, now),
            )
            self._insert_event(conn, job_id, "submitted", {"kind": kind})
            return self._fetch(conn, job_id)

    def get(self, job_id: str) -> JobRecord:
        _check_id(job_id)
        with self._read() as conn:
            return self._fetch(conn, job_id)

    def list(self, limit: int = 50, states: Iterable[JobState] | None = None) -> builtins.list[JobRecord]:
        """Jobs newest first (created_at, then id, descending), optionally only those in `states`."""
        _check_int("limit", limit, 1, MAX_LIST_LIMIT)
        where, params = "", []
        if states is not None:
            try:
                wanted = sorted({JobState(s).value for s in states})
            except (ValueError, TypeError) as e:
                raise ValidationError("states", f"unknown job state in {states!r:.80}") from e
            if not wanted:
                return []
            where = f"WHERE state IN ({', '.join('?' * len(wanted))})"
            params = wanted
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs {where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [_record(row) for row in rows]

    def start(self, job_id: str) -> JobRecord:
        """QUEUED -> RUNNING."""
        _check_id(job_id)
        with self._write() as conn:
            job = self._fetch(conn, job_id)
            if job.state is not JobState.QUEUED:
                raise JobStateError(
                    f"job {job_id} is {job.state}, not queued", id=job_id, state=job.state.value
                )
            self._set_state(conn, job_id, JobState.RUNNING)
            return self._fetch(conn, job_id)

    def claim_next(self) -> JobRecord | None:
        """Atomically move the oldest QUEUED job to RUNNING and return it; None when none is queued."""
        with self._write() as conn:
            row = conn.execute(
                "SELECT id FROM jobs WHERE state = ? ORDER BY created_at, id LIMIT 1",
                (JobState.QUEUED.value,),
            ).fetchone()
            if row is None:
                return None
            self._set_state(conn, row[0], JobState.RUNNING)
            return self._fetch(conn, row[0])

    def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        error: str = "",
        result: dict[str, Any] | None = None,
        event: tuple[str, dict[str, Any]] | None = None,
    ) -> JobRecord:
        """QUEUED or RUNNING -> a terminal state; `event`, if given, is appended in the same transaction."""
        _check_id(job_id)
        try:
            state = JobState(state)
        except ValueError as e:
            raise ValidationError("state", f"unknown job state {state!r}") from e
        if state not in TERMINAL:
            raise ValidationError(
                "state", f"must be a terminal state (succeeded, failed, cancelled), got {state}"
            )
        if not isinstance(error, str):
            raise ValidationError("error", "must be a string")
        result_text = _dumps("result", result) if result is not None else None
        if event is not None:
            event = _check_event(event)
        with self._write() as conn:
            job = self._fetch(conn, job_id)
            if job.state in TERMINAL:
                raise JobStateError(f"job {job_id} already {job.state}", id=job_id, state=job.state.value)
            self._set_state(conn, job_id, state, error=error, result=result_text)
            if event is not None:
                self._insert_event(conn, job_id, event[0], event[1], "event.data")
            return self._fetch(conn, job_id)

    def request_cancel(self, job_id: str) -> JobRecord:
        """QUEUED: cancelled at once (event "cancelled"). RUNNING: flags cancel_requested for the runner."""
        _check_id(job_id)
        with self._write() as conn:
            job = self._fetch(conn, job_id)
            if job.state in TERMINAL:
                raise JobStateError(f"job {job_id} already {job.state}", id=job_id, state=job.state.value)
            if job.state is JobState.QUEUED:
                self._set_state(conn, job_id, JobState.CANCELLED, cancel_requested=1)
                self._insert_event(conn, job_id, "cancelled", {})
            elif not job.cancel_requested:
                conn.execute(
                    "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?", (_now(), job_id)
                )
            return self._fetch(conn, job_id)

    def recover(self) -> builtins.list[str]:
        """At daemon start: each RUNNING job back to QUEUED (event "interrupted"); their ids, oldest first."""
        with self._write() as conn:
            rows = conn.execute(
                "SELECT id, step FROM jobs WHERE state = ? ORDER BY created_at, id", (JobState.RUNNING.value,)
            ).fetchall()
            for job_id, step in rows:
                self._set_state(conn, job_id, JobState.QUEUED)
                self._insert_event(conn, job_id, "interrupted", {"step": int(step)})
        return [job_id for job_id, _ in rows]

    # -- events and checkpoints -----------------------------------------------------------------

    def append_event(self, job_id: str, type: str, data: dict[str, Any]) -> JobEvent:
        _check_id(job_id)
        _check_text("type", type, 100)
        with self._write() as conn:
            self._fetch(conn, job_id)
            return self._insert_event(conn, job_id, type, data)

    def checkpoint(
        self, job_id: str, step: int, state: dict[str, Any], event: tuple[str, dict[str, Any]] | None = None
    ) -> JobEvent | None:
        """Store the job's checkpoint at `step` and append `event`, all in one transaction.

        Returns the appended event (None without one). A step lower than the stored one is refused, and so
        is a checkpoint of a finished job.
        """
        _check_id(job_id)
        _check_int("step", step, 0)
        state_text = _dumps("state", state)
        if event is not None:
            event = _check_event(event)
        with self._write() as conn:
            job = self._fetch(conn, job_id)
            if job.state in TERMINAL:
                raise JobStateError(f"job {job_id} already {job.state}", id=job_id, state=job.state.value)
            if step < job.step:
                raise ValidationError("step", f"goes backwards: {step} < stored step {job.step}", id=job_id)
            conn.execute(
                "UPDATE jobs SET checkpoint = ?, step = ?, updated_at = ? WHERE id = ?",
                (state_text, step, _now(), job_id),
            )
            if event is None:
                return None
            return self._insert_event(conn, job_id, event[0], event[1], "event.data")

    def load_checkpoint(self, job_id: str) -> dict[str, Any] | None:
        _check_id(job_id)
        with self._read() as conn:
            row = conn.execute("SELECT checkpoint FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"job {job_id} does not exist", id=job_id)
        return json.loads(row[0]) if row[0] is not None else None

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> builtins.list[JobEvent]:
        """The job's events with seq > after_seq, in seq order, at most `limit` of them."""
        _check_id(job_id)
        _check_int("after_seq", after_seq, 0)
        _check_int("limit", limit, 1, MAX_EVENTS_LIMIT)
        with self._read() as conn:
            self._fetch(conn, job_id)
            rows = conn.execute(
                "SELECT seq, type, data, at FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (job_id, after_seq, limit),
            ).fetchall()
        return [
            JobEvent(job_id=job_id, seq=int(s), type=t, data=json.loads(d), at=float(a))
            for s, t, d, a in rows
        ]

    def last_seq(self, job_id: str) -> int:
        """The seq of the job's newest event (0 when it has none)."""
        _check_id(job_id)
        with self._read() as conn:
            self._fetch(conn, job_id)
            return int(
                conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
                ).fetchone()[0]
            )


__all__ = [
    "DEFAULT_FILENAME",
    "SCHEMA_VERSION",
    "TERMINAL",
    "JobEvent",
    "JobRecord",
    "JobState",
    "JobStateError",
    "JobStore",
    "JobStoreVersionError",
]
