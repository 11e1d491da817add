"""Test helper: publish a library version and push it through a devnet's governance (3 votes, warp)."""

from __future__ import annotations

from pathlib import Path

from zoo.devnet.dev_dao import DevDao
from zoo.devnet.manager import Devnet
from zoo.registry.canonical import encode_library
from zoo.registry.experience import Experience
from zoo.registry.ipfs import IpfsClient
from zoo.registry.library import Library
from zoo.registry.merkle import library_root


def approve(data_dir: Path, library: Library) -> str:
    """Publish `library` to the devnet's IPFS and get it approved on chain; returns its 0x root."""
    info = Devnet(data_dir).info()
    assert info is not None and info.ready, "the devnet of this data dir is not up"
    with IpfsClient(info.ipfs_api) as ipfs:
        cid = ipfs.add(encode_library(library))
    root = library_root(library)
    DevDao.of(info).approve(root, cid, tree_size=len(library.experiences), parent_version=library.version - 1)
    return "0x" + root.hex()


def next_version(current: Library, current_root: str, *texts: tuple[str, str]) -> Library:
    """current plus new experiences (domain, text), as the next version."""
    added = [
        Experience.create(
            text=t,
            domain=d,
            confidence=0.8,
            author="job:test",
            base_model=current.base_model,
            created_at="2026-02-01T00:00:00Z",
        )
        for d, t in texts
    ]
    return Library.create(
        version=current.version + 1,
        parent_root=current_root,
        base_model=current.base_model,
        experiences=[*current.experiences, *added],
        description=f"test version {current.version + 1}",
    )
