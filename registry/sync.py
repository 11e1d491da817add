"""Follow the registry's approved library versions and activate each one only after verifying it.

For a new on-chain version the syncer fetches its CID from IPFS (the bytes must hash to the CID, which
commits to the whole document: metadata and experiences), decodes and validates it, rebuilds the Merkle
root from the experiences and compares it with the on-chain root, checks the version number and parent,
and only then stores it and moves the current pointer. Anything that fails leaves the current version
as it was: the node keeps serving the last verified library.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Protocol

from zoo.registry.cids import cid_problem, shown_cid
from zoo.registry.errors import ContentTooLarge, IntegrityError, ValidationError
from zoo.registry.fsutil import write_atomic
from zoo.registry.library_store import LibraryStore, StoredVersion, root_hex
from zoo.registry.merkle import decode_library_leaves

DEFAULT_MAX_LIBRARY_BYTES = 64 * 1024 * 1024


class OnChainVersion(Protocol):
    version: int
    root: bytes
    tree_size: int
    cid: str


class RegistryView(Protocol):
    def current(self) -> OnChainVersion: ...
    def version_at(self, version: int) -> OnChainVersion: ...


class ContentSource(Protocol):
    def fetch_verified(self, cid: str, *, timeout: float | None = None, max_size: int = ...) -> bytes: ...


@dataclass(frozen=True)
class SyncResult:
    activated: StoredVersion | None  # the version activated by this pass, if any
    current: StoredVersion | None  # the current version after the pass
    onchain_version: int


class Refused(IntegrityError):
    """On-chain content that fails verification; it is never activated. `kind` names the failed check."""

    def __init__(self, message: str, kind: str, **values: object) -> None:
        super().__init__(message, **values)
        self.kind = kind


@dataclass(eq=False)
class LibrarySyncer:
    registry: RegistryView
    ipfs: ContentSource
    store: LibraryStore
    _: KW_ONLY
    fetch_timeout_s: float = 30.0
    max_bytes: int = DEFAULT_MAX_LIBRARY_BYTES
    on_refused: Callable[[int, str, str], None] | None = None
    # Versions already refused, so a bad version is not fetched again on every pass.
    refused: dict[tuple[int, str], str] = field(default_factory=dict, init=False)

    def sync_once(self) -> SyncResult:
        """Bring the store to the chain's current version (verifying it); raise on RPC/IPFS failures."""
        return self.apply(self.registry.current())

    def apply(self, onchain: OnChainVersion) -> SyncResult:
        """Verify and activate one on-chain version (from `current()` or a LibraryUpdated event)."""
        current = self.store.current()
        if onchain.version == 0:
            return SyncResult(None, current, 0)
        root = "0x" + bytes(onchain.root).hex()
        # Roots may recur (a rollback re-approves an earlier version's experiences as a new version), so
        # the version number, not the root alone, says whether the store is already there.
        if current is not None and current.root == root and current.version == onchain.version:
            return SyncResult(None, current, onchain.version)
        key = (onchain.version, root)
        if key in self.refused:
            return SyncResult(None, current, onchain.version)
        try:
            stored = self.fetch_and_verify(onchain)
        except (IntegrityError, ValidationError, ContentTooLarge) as e:
            reason = str(e)
            self.refused[(onchain.version, root)] = reason
            if self.on_refused:
                self.on_refused(onchain.version, root, reason)
            raise Refused(
                f"library version {onchain.version} (root {root}, cid {shown_cid(onchain.cid)}) refused: "
                f"{reason}",
                kind=type(e).__name__,
                version=onchain.version,
                root=root,
            ) from None
        self.store.activate(stored)
        return SyncResult(stored, stored, onchain.version)

    def fetch_and_verify(self, onchain: OnChainVersion) -> StoredVersion:
        root = "0x" + bytes(onchain.root).hex()
        try:
            stored = self.store.get(version=onchain.version, root=root)  # verified when it was stored
        except LookupError:
            stored = None
        if stored is not None:
            if len(stored.library.experiences) != onchain.tree_size:
                raise IntegrityError(
                    f"the stored copy holds {len(stored.library.experiences)} experiences, the chain's tree "
                    f"size is {onchain.tree_size}"
                )
            return stored
        problem = cid_problem(onchain.cid)
        if problem is not None:  # an old registry's history may hold any bytes: never hand them to IPFS
            raise ValidationError("cid", f"the chain's CID for this version is unusable: {problem}")
        data = self.ipfs.fetch_verified(onchain.cid, timeout=self.fetch_timeout_s, max_size=self.max_bytes)
        # The active version's experiences are reused where the new one keeps them byte for byte.
        active = self.store.current()
        known = active.known_leaves() if active else None
        library, leaves = decode_library_leaves(data, max_size=self.max_bytes, known=known)
        if library.version != onchain.version:
            raise IntegrityError(f"content says version {library.version}, the chain says {onchain.version}")
        if len(library.experiences) != onchain.tree_size:
            raise IntegrityError(
                f"content holds {len(library.experiences)} experiences, the chain's tree size is "
                f"{onchain.tree_size}"
            )
        if onchain.version > 1:
            parent = self.registry.version_at(onchain.version - 1)
            parent_root = "0x" + bytes(parent.root).hex()
            if library.parent_root != parent_root:
                raise IntegrityError(
                    f"content names parent {library.parent_root or '(none)'}, the chain's previous version "
                    f"is {parent_root}"
                )
        return self.store.put(library, onchain.cid, expected_root=root, raw=data, leaf_hashes=leaves)


__all__ = ["LibraryFollower", "LibrarySyncer", "Refused", "SyncResult", "root_hex"]


class EventSource(Protocol):
    def block_number(self) -> int: ...
    def library_updated_events(self, from_block: int, to_block: int) -> list[OnChainVersion]: ...


class LibraryFollower:
    """Follows LibraryUpdated events from a persisted cursor, `confirmations` blocks behind the head.

    The first pass after start reconciles with the chain's current version; later passes read only the
    new events. The cursor advances only past blocks whose outcome is final for this node (activated,
    already current, or refused), so an IPFS or RPC failure is retried on the next pass.
    """

    def __init__(self, syncer: LibrarySyncer, events: EventSource, cursor_file: Path, confirmations: int = 0):
        self.syncer = syncer
        self.events = events
        self.cursor_file = cursor_file
        self.confirmations = confirmations
        self.reconciled = False

    @property
    def cursor(self) -> int | None:
        try:
            return int(json.loads(self.cursor_file.read_text())["block"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _save(self, block: int) -> None:
        write_atomic(self.cursor_file, json.dumps({"block": block}).encode())

    def poll(self) -> SyncResult | None:
        head = self.events.block_number() - self.confirmations
        if head < 0:
            return None
        cursor = self.cursor
        result: SyncResult | None = None
        try:
            if not self.reconciled or cursor is None:
                result = self.syncer.sync_once()
                self.reconciled = True
            elif head > cursor:
                updates = self.events.library_updated_events(cursor + 1, head)
                if updates:
                    result = self.syncer.apply(max(updates, key=lambda u: u.version))
        except Refused:
            self._save(head)
            raise
        if cursor is None or head > cursor:
            self._save(head)
        return result
