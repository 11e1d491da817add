"""Review a proposed library version before voting on it: fetch its content, check it against what the
proposal commits to on chain, and say what it changes.

A proposal names a Merkle root, a tree size, a CID and a parent version. Voters approve the root; nodes
then serve the CID's content only if it hashes to that root. A proposal whose CID does not match its root
can still pass a vote, after which every node refuses it and the chain's current version points at content
no node serves, so `zoo-node dao review` and `dao vote --for` run these checks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from zoo.registry.canonical import decode_library
from zoo.registry.cids import cid_problem
from zoo.registry.errors import ContentTooLarge, IntegrityError, IpfsError, ValidationError
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.merkle import library_root

__all__ = ["ContentFetcher", "LibraryDiff", "Review", "review_proposal"]


class ContentFetcher(Protocol):
    def fetch_verified(self, cid: str, *, timeout: float | None = None, max_size: int = ...) -> bytes: ...


class ProposalLike(Protocol):
    root: bytes
    tree_size: int
    cid: str
    parent_version: int


@dataclass(frozen=True)
class LibraryDiff:
    """What a library changes relative to another, by experience id. Ids derive from domain and text, so an
    edited text is a removal plus an addition; `modified` holds same-id records whose other fields changed."""

    added: tuple[Experience, ...]
    removed: tuple[Experience, ...]
    modified: tuple[tuple[Experience, Experience], ...]

    @classmethod
    def between(cls, old: Library | None, new: Library) -> LibraryDiff:
        before = {e.id: e for e in old.experiences} if old is not None else {}
        after = {e.id: e for e in new.experiences}
        return cls(
            added=tuple(after[i] for i in sorted(after.keys() - before.keys())),
            removed=tuple(before[i] for i in sorted(before.keys() - after.keys())),
            modified=tuple(
                (before[i], after[i]) for i in sorted(before.keys() & after.keys()) if before[i] != after[i]
            ),
        )

    @property
    def summary(self) -> str:
        return f"{len(self.added)} added, {len(self.removed)} removed, {len(self.modified)} modified"


@dataclass(frozen=True)
class Review:
    """The outcome of reviewing one proposal. `verified` is True only when the content was fetched and
    matches the proposal's root, size and parent; otherwise `problem` says what failed and `available`
    whether the content could be fetched at all."""

    verified: bool
    problem: str = ""
    available: bool = True
    library: Library | None = None
    diff: LibraryDiff | None = None
    parent: Library | None = None  # the parent version's library, when the review was given it

    @property
    def label(self) -> str:
        """One word for listings: verified, MISMATCH or unavailable."""
        if self.verified:
            return "verified"
        return "MISMATCH" if self.available else "unavailable"


def review_proposal(
    proposal: ProposalLike,
    ipfs: ContentFetcher,
    *,
    parent_root: bytes | None,
    parent: Library | None,
    timeout_s: float = 30.0,
    max_bytes: int = 64 * 1024 * 1024,
) -> Review:
    """Fetch `proposal`'s content and check it: the bytes hash to the CID, decode as a canonical library,
    rebuild the proposed Merkle root, hold `tree_size` experiences, and name the parent version (its number,
    and `parent_root`: the chain's root of that version, None when there is no such version). `parent`, the
    parent version's library when known, is what the diff is taken against."""
    problem = cid_problem(proposal.cid)
    if problem is not None:
        return Review(False, f"the CID is unusable: {problem}", available=False)
    try:
        data = ipfs.fetch_verified(proposal.cid, timeout=timeout_s, max_size=max_bytes)
    except ContentTooLarge as e:
        return Review(False, f"the content is too large: {e}")
    except IntegrityError as e:
        return Review(False, f"IPFS returned bytes that do not match the CID: {e}")
    except ValidationError as e:
        return Review(False, f"the CID cannot be verified: {e}", available=False)
    except IpfsError as e:
        return Review(False, f"the content could not be fetched from IPFS: {e}", available=False)
    try:
        library = decode_library(data, max_size=max_bytes)
    except (ValidationError, IntegrityError, ContentTooLarge) as e:
        return Review(False, f"the content is not a valid library: {e}")
    diff = LibraryDiff.between(parent, library)
    root = library_root(library)
    if root != bytes(proposal.root):
        return Review(
            False,
            f"the content's Merkle root is 0x{root.hex()}, not the proposed 0x{bytes(proposal.root).hex()}",
            library=library,
            diff=diff,
        )
    if len(library.experiences) != proposal.tree_size:
        return Review(
            False,
            f"the content holds {len(library.experiences)} experiences, the proposal says "
            f"{proposal.tree_size}",
            library=library,
            diff=diff,
        )
    if library.version != proposal.parent_version + 1:
        return Review(
            False,
            f"the content says version {library.version}, the proposal makes version "
            f"{proposal.parent_version + 1}",
            library=library,
            diff=diff,
        )
    if parent_root is None:
        return Review(
            False,
            f"its parent version {proposal.parent_version} does not exist on chain",
            library=library,
            diff=diff,
        )
    expected_parent = "0x" + parent_root.hex() if any(parent_root) else ""
    if library.parent_root != expected_parent:
        return Review(
            False,
            f"the content names parent root {library.parent_root or '(none)'}, but version "
            f"{proposal.parent_version} has root {expected_parent or '(none)'}",
            library=library,
            diff=diff,
        )
    return Review(True, library=library, diff=diff, parent=parent)
