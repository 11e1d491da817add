"""Test helper: publish a library version and push it through a devnet's governance (3 votes, warp)."""

from __future__ import annotations

from pathlib import Path

from web3 import Web3

from zoo.devnet.manager import Devnet, warp
from zoo.registry.canonical import encode_library
from zoo.registry.chain import RegistryClient
from zoo.registry.experience import Experience, Library
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.merkle import library_root


def approve(data_dir: Path, library: Library) -> str:
    """Publish `library` to the devnet's IPFS and get it approved on chain; returns its 0x root."""
    info = Devnet(data_dir).info()
    assert info is not None and info.ready, "the devnet of this data dir is not up"
    w3 = Web3(Web3.HTTPProvider(info.rpc_url))
    with IpfsClient(info.ipfs_api) as ipfs:
        cid = ipfs.add(encode_library(library))
    root = library_root(library)
    registry = RegistryClient(w3, info.registry_address, dev_account(0))
    proposed = registry.propose(
        root, cid, tree_size=len(library.experiences), parent_version=library.version - 1
    )
    warp(w3, 1)
    for i in (0, 1, 2):
        RegistryClient(w3, info.registry_address, dev_account(i)).vote(proposed.proposal_id, True)
    s = info.settings
    warp(w3, s["voting_period_s"] + s["execution_delay_s"] + 1)
    registry.execute(proposed.proposal_id)
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
