"""Durable metering: the usage each answered request gives the authors of the experiences it used.

A request is worth the tokens it was answered with (prompt + completion), shared equally by the
experiences it credits: those its answer cited, or every experience it was served when it cited none.
Each share goes to the experience's author (provenance.author) in the request's epoch (epoch_s seconds
of Unix time, one day by default); the remainder of the integer division goes to the first by id, so a
request's shares always add up to its tokens. Experiences are counted too (served, cited), for GetStatus.
A client's spend is kept with the largest spend authorization it signed for the epoch (what proves the
spend on chain; zoo.registry.spend): the credit book never charges more than that in an epoch.

Usage lives in DATA_DIR/usage.sqlite (WAL, synchronous=FULL). A request's usage is committed before its
answer is sent, so what a client was answered is on disk: a `kill -9` at any moment loses no
acknowledged usage and leaves the database consistent (SQLite's journal). Signed clients' usage is
kept per epoch too (what their credits will pay for). Commits are grouped: one
writer thread commits whatever requests arrived meanwhile in one transaction and one fsync, so many
concurrent answers wait for one disk flush, not one each. Each answer's metered receipt (its signed receipt
and what it credited: credits/receipt_log.py) is committed in the same transaction as its usage, so the
receipts of an epoch are exactly the answers its usage counts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from zoo.node.logs import get_logger
from zoo.registry.spend import SpendAuthorization

log = get_logger(__name__)

DEFAULT_EPOCH_S = 86_400
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    epoch INTEGER NOT NULL, author TEXT NOT NULL, units INTEGER NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (epoch, author)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS experiences (
    epoch INTEGER NOT NULL, id TEXT NOT NULL, served INTEGER NOT NULL, cited INTEGER NOT NULL,
    PRIMARY KEY (epoch, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    epoch INTEGER PRIMARY KEY, answered INTEGER NOT NULL, units INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    epoch INTEGER NOT NULL, client TEXT NOT NULL, units INTEGER NOT NULL, requests INTEGER NOT NULL,
    spent INTEGER NOT NULL, PRIMARY KEY (epoch, client)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settled (epoch INTEGER PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    epoch INTEGER NOT NULL, seq INTEGER NOT NULL, leaf BLOB NOT NULL, PRIMARY KEY (epoch, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS authorizations (
    epoch INTEGER NOT NULL, client TEXT NOT NULL, units TEXT NOT NULL, signature BLOB NOT NULL,
    PRIMARY KEY (epoch, client)) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class Served:
    """One experience an answer used: its id, author, and whether the answer cited it."""

    id: str
    author: str
    cited: bool


@dataclass(frozen=True)
class Usage:
    """What one answered request is metered as."""

    epoch: int
    units: int  # tokens of the answer, prompt and completion
    shares: dict[str, int]  # author -> units; sums to `units` when any experience is credited
    served: tuple[Served, ...]
    client: str = ""  # the signer of the request; "" when anonymous
    spent: int = 0  # credits the answer cost the client (a credit holder; see book.py)
    spend: SpendAuthorization | None = None  # the client's consent for `spent` (this node, this epoch)
    receipt: bytes = b""  # the answer's metered receipt, as its leaf (credits/receipt_log.py); b"": none


@dataclass(frozen=True)
class AuthorUsage:
    """An author's units and requests in one epoch."""

    author: str
    units: int
    requests: int


@dataclass(frozen=True)
class ClientUsage:
    """A signed client's units (tokens answered), requests and credits spent in one epoch."""

    client: str
    units: int
    requests: int
    spent: int


def credited_of(served: Sequence[Served]) -> list[Served]:
    """The experiences one answer credits, by id: those it cited, or every one it was served."""
    cited = {s.id: s for s in served if s.cited}
    by_id = cited or {s.id: s for s in served}
    return [by_id[i] for i in sorted(by_id)]


def shares_of(units: int, served: Sequence[Served]) -> dict[str, int]:
    """The units each author earns from one answer (see the module docstring)."""
    credited = credited_of(served)
    if not credited or units <= 0:
        return {}
    each, rest = divmod(units, len(credited))
    shares: Counter[str] = Counter()
    for i, s in enumerate(credited):
        shares[s.author] += each + (rest if i == 0 else 0)
    return {a: u for a, u in shares.items() if u}


def _settle(done: concurrent.futures.Future[None], error: Exception | None) -> None:
    """Tell a waiter; one that went away (its client hung up, cancelling it) was committed all the same."""
    try:
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass


class UsageMeter:
    """Per-epoch usage by author, committed before each answer goes out (thread-safe; async record)."""

    def __init__(
        self,
        path: Path,
        epoch_s: int = DEFAULT_EPOCH_S,
        clock: Callable[[], float] = time.time,
        *,
        read_only: bool = False,
    ) -> None:
        """read_only: only read (the CLI, beside a running node); FileNotFoundError if nothing is metered."""
        if epoch_s < 1:
            raise ValueError(f"epoch_s must be at least 1, got {epoch_s}")
        self.path = Path(path)
        self.epoch_s = epoch_s
        self._clock = clock
        self._db = self._open_read_only() if read_only else self._connect()
        self._db_lock = threading.Lock()  # one connection: the writer's commits, reads, mark_settled
        # Served counts of all epochs, kept in memory (GetStatus asks often; summing the table each time
        # scanned every epoch's rows): read once here, then added to as each batch commits.
        self._served_totals: Counter[str] = Counter(
            dict(self._db.execute("SELECT id, SUM(served) FROM experiences GROUP BY id").fetchall())
        )
        self._queue: queue.SimpleQueue[tuple[Usage, concurrent.futures.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._writer: threading.Thread | None = None
        if not read_only:
            self._writer = threading.Thread(target=self._write_forever, name="usage-meter", daemon=True)
            self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns: acknowledged is kept
        db.executescript(_SCHEMA)
        return db

    def _open_read_only(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise FileNotFoundError(f"no usage metered yet: {self.path} does not exist")
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)

    def now(self) -> float:
        """The time by the clock this meter counts epochs with."""
        return self._clock()

    def epoch_of(self, t: float | None = None) -> int:
        return int((self._clock() if t is None else t) // self.epoch_s)

    def usage_of(
        self,
        units: int,
        served: Sequence[Served],
        client: str = "",
        spent: int = 0,
        spend: SpendAuthorization | None = None,
        epoch: int | None = None,
        receipt: bytes = b"",
    ) -> Usage:
        """One answer's usage in `epoch` (now's by default); `spent` credits need the client's `spend`
        authorization of that epoch (the credit book charges no more than it allows)."""
        epoch = self.epoch_of() if epoch is None else epoch
        if spent and (spend is None or spend.client != client or spend.epoch != epoch or spend.units < spent):
            raise ValueError(f"a spend of {spent} credits needs the client's authorization for epoch {epoch}")
        shares = shares_of(units, served)
        return Usage(epoch, max(units, 0), shares, tuple(served), client, spent, spend, receipt)

    def submit(self, usage: Usage) -> concurrent.futures.Future[None]:
        """Queue one request's usage; the future resolves once it is committed (or fails with the error)."""
        if self._writer is None:
            raise RuntimeError("this UsageMeter was opened read-only")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put((usage, done))
        return done

    async def record(self, usage: Usage) -> None:
        """Commit one request's usage; returns once it is on disk."""
        await asyncio.wrap_future(self.submit(usage))

    def _write_forever(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while True:  # group commit: everything that arrived meanwhile goes in the same transaction
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(more)
            try:
                with self._db_lock:
                    self._commit([u for u, _ in batch])
                    self._served_totals.update(s.id for u, _ in batch for s in u.served)
            except sqlite3.Error as e:
                log.error("usage not recorded", error=str(e), requests=len(batch))
                for _, done in batch:
                    _settle(done, e)
            else:
                for _, done in batch:
                    _settle(done, None)

    def _commit(self, batch: list[Usage]) -> None:
        authors: Counter[tuple[int, str]] = Counter()
        author_requests: Counter[tuple[int, str]] = Counter()
        served: Counter[tuple[int, str]] = Counter()
        cited: Counter[tuple[int, str]] = Counter()
        answered: Counter[int] = Counter()
        units: Counter[int] = Counter()
        client_units: Counter[tuple[int, str]] = Counter()
        client_requests: Counter[tuple[int, str]] = Counter()
        client_spent: Counter[tuple[int, str]] = Counter()
        consents: dict[tuple[int, str], SpendAuthorization] = {}
        receipts: dict[int, list[bytes]] = {}
        for u in batch:
            if u.receipt:
                receipts.setdefault(u.epoch, []).append(u.receipt)
            answered[u.epoch] += 1
            units[u.epoch] += u.units
            if u.client:
                client_units[u.epoch, u.client] += u.units
                client_requests[u.epoch, u.client] += 1
                client_spent[u.epoch, u.client] += u.spent
            if u.spent and u.spend is not None:
                kept = consents.get((u.epoch, u.client))
                if kept is None or u.spend.units > kept.units:
                    consents[u.epoch, u.client] = u.spend
            for author, n in u.shares.items():
                authors[u.epoch, author] += n
                author_requests[u.epoch, author] += 1
            for s in u.served:
                served[u.epoch, s.id] += 1
                cited[u.epoch, s.id] += s.cited
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?) ON CONFLICT (epoch, author) DO UPDATE SET "
                "units = units + excluded.units, requests = requests + excluded.requests",
                [(e, a, n, author_requests[e, a]) for (e, a), n in authors.items()],
            )
            db.executemany(
                "INSERT INTO experiences VALUES (?, ?, ?, ?) ON CONFLICT (epoch, id) DO UPDATE SET "
                "served = served + excluded.served, cited = cited + excluded.cited",
                [(e, i, n, cited[e, i]) for (e, i), n in served.items()],
            )
            db.executemany(
                "INSERT INTO requests VALUES (?, ?, ?) ON CONFLICT (epoch) DO UPDATE SET "
                "answered = answered + excluded.answered, units = units + excluded.units",
                [(e, n, units[e]) for e, n in answered.items()],
            )
            db.executemany(
                "INSERT INTO clients VALUES (?, ?, ?, ?, ?) ON CONFLICT (epoch, client) DO UPDATE SET "
                "units = units + excluded.units, requests = requests + excluded.requests, "
                "spent = spent + excluded.spent",
                [(e, c, n, client_requests[e, c], client_spent[e, c]) for (e, c), n in client_units.items()],
            )
            for e, leaves in receipts.items():
                (first,) = db.execute(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM receipts WHERE epoch = ?", (e,)
                ).fetchone()
                db.executemany(
                    "INSERT INTO receipts VALUES (?, ?, ?)",
                    [(e, first + i, leaf) for i, leaf in enumerate(leaves)],
                )
            # The largest authorization of each client and epoch (units as text: they may exceed int64).
            for (e, c), a in consents.items():
                row = db.execute(
                    "SELECT units FROM authorizations WHERE epoch = ? AND client = ?", (e, c)
                ).fetchone()
                if row is None or int(row[0]) < a.units:
                    db.execute(
                        "INSERT OR REPLACE INTO authorizations VALUES (?, ?, ?, ?)",
                        (e, c, str(a.units), a.signature),
                    )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- reading

    def by_author(self, epoch: int) -> list[AuthorUsage]:
        """Each author's units and requests in one epoch, most units first."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT author, units, requests FROM usage WHERE epoch = ? ORDER BY units DESC, author",
                (epoch,),
            ).fetchall()
        return [AuthorUsage(*r) for r in rows]

    def by_client(self, epoch: int) -> list[ClientUsage]:
        """Each signed client's units (tokens answered), requests and credits spent in one epoch."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT client, units, requests, spent FROM clients WHERE epoch = ? "
                "ORDER BY units DESC, client",
                (epoch,),
            ).fetchall()
        return [ClientUsage(*r) for r in rows]

    def spent_by_client(self, epoch: int) -> dict[str, int]:
        """Credits each client spent in one epoch (those that spent any)."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT client, spent FROM clients WHERE epoch = ? AND spent > 0", (epoch,)
            ).fetchall()
        return dict(rows)

    def spent_in(self, client: str, epoch: int) -> int:
        """Credits `client` spent here in `epoch`, as committed."""
        with self._db_lock:
            row = self._db.execute(
                "SELECT spent FROM clients WHERE epoch = ? AND client = ?", (epoch, client)
            ).fetchone()
        return int(row[0]) if row else 0

    def authorizations(self, epoch: int, node: str) -> dict[str, SpendAuthorization]:
        """The largest spend authorization each client that spent in `epoch` signed for this node."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT client, units, signature FROM authorizations WHERE epoch = ?", (epoch,)
            ).fetchall()
        return {c: SpendAuthorization(c, node, epoch, int(u), bytes(sig)) for c, u, sig in rows}

    def receipt_leaves(self, epoch: int) -> list[bytes]:
        """The metered receipts of one epoch, as their leaves, in the order they were committed."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT leaf FROM receipts WHERE epoch = ? ORDER BY seq", (epoch,)
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def spent_unsettled(self, client: str) -> int:
        """Credits `client` spent here in epochs whose report the ledger has not applied yet."""
        with self._db_lock:
            (total,) = self._db.execute(
                "SELECT COALESCE(SUM(spent), 0) FROM clients WHERE client = ? "
                "AND epoch NOT IN (SELECT epoch FROM settled)",
                (client,),
            ).fetchone()
        return int(total)

    def mark_settled(self, epoch: int) -> None:
        """Record that the ledger applied this epoch's spends (settlement calls it)."""
        with self._db_lock:
            self._db.execute("INSERT OR IGNORE INTO settled VALUES (?, ?)", (epoch, self._clock()))

    def settled_epochs(self) -> set[int]:
        """Epochs settlement is done with (reported and spends applied, or nothing to report)."""
        with self._db_lock:
            return {r[0] for r in self._db.execute("SELECT epoch FROM settled")}

    def answered(self, epoch: int) -> tuple[int, int]:
        """Requests answered and their units in one epoch."""
        with self._db_lock:
            row = self._db.execute(
                "SELECT answered, units FROM requests WHERE epoch = ?", (epoch,)
            ).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def epoch_bounds(self, epoch: int) -> tuple[int, int]:
        """The Unix seconds an epoch starts at and ends before."""
        return epoch * self.epoch_s, (epoch + 1) * self.epoch_s

    def epochs(self) -> list[int]:
        with self._db_lock:
            return [r[0] for r in self._db.execute("SELECT epoch FROM requests ORDER BY epoch")]

    def experience_counts(self) -> dict[str, int]:
        """How often each experience was served, all epochs together."""
        with self._db_lock:
            return dict(self._served_totals)

    def close(self) -> None:
        """Commit what is queued, then stop the writer and close the database."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
        with self._db_lock:
            self._db.close()
