"""LibraryService: the node's verified library versions, experiences with Merkle proofs, and checks of
those proofs against the root the registry contract holds."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import grpc

from zoo.node.components.library import LibraryComponent
from zoo.registry.canonical import encode_experience
from zoo.registry.errors import NotFound, ValidationError
from zoo.registry.experience import ID_RE, Experience
from zoo.registry.library_store import StoredVersion
from zoo.registry.merkle import InclusionProof, MerkleTree, leaf_hash, library_tree, verify_inclusion
from zoo.v1 import library_pb2, library_pb2_grpc

MAX_PAGE = 1000
DEFAULT_PAGE = 100
_TOKEN_RE = re.compile(r"\d{1,9}")

OnchainRoot = Callable[[int], str | None]  # version -> 0x root the chain holds (None: chain unreachable)


def experience_to_proto(e: Experience) -> library_pb2.Experience:
    return library_pb2.Experience(
        id=e.id,
        text=e.text,
        domain=e.domain,
        confidence=e.confidence,
        examples=list(e.examples),
        canonical=encode_experience(e),
        kind=e.kind,
        answer=e.answer or "",
        reasoning=e.reasoning or "",
    )


def version_to_proto(v: StoredVersion) -> library_pb2.LibraryVersion:
    lib = v.library
    return library_pb2.LibraryVersion(
        version=lib.version,
        root=v.root,
        parent_root=lib.parent_root,
        cid=v.cid,
        base_model=lib.base_model,
        base_model_sha256=lib.base_model_sha256,
        description=lib.description,
        experience_count=len(lib.experiences),
    )


def proof_to_proto(proof: InclusionProof, leaf: bytes) -> library_pb2.InclusionProof:
    return library_pb2.InclusionProof(
        leaf_index=proof.leaf_index,
        tree_size=proof.tree_size,
        path=list(proof.path),
        leaf_hash=leaf_hash(leaf),
    )


class LibraryServicer(library_pb2_grpc.LibraryServiceServicer):
    def __init__(self, library: LibraryComponent, onchain_root: OnchainRoot | None = None) -> None:
        self.library = library
        self.onchain_root = onchain_root
        # Building the tree of a 100k-experience library takes about a second: keep the recent ones.
        self._trees: OrderedDict[str, MerkleTree] = OrderedDict()

    def _version(self, version: int) -> StoredVersion:
        if version == 0:
            active = self.library.active
            if active is None:
                raise NotFound("this node has no verified library version yet")
            return active
        return self.library.store.get(version=version)

    def _tree(self, v: StoredVersion) -> MerkleTree:
        tree = self._trees.get(v.root)
        if tree is None:
            tree = library_tree(v.library)
            self._trees[v.root] = tree
            while len(self._trees) > 4:
                self._trees.popitem(last=False)
        return tree

    def _prove(self, v: StoredVersion, experience_id: str) -> tuple[Experience, InclusionProof, bytes]:
        if not ID_RE.fullmatch(experience_id):
            raise ValidationError("id", f"must look like exp-<16 hex digits> (got {experience_id[:80]!r})")
        index = v.library.index_of(experience_id)
        e = v.library.experiences[index]
        return e, self._tree(v).prove(index), encode_experience(e)

    async def _onchain(self, version: int) -> str:
        if self.onchain_root is None:
            return ""
        try:
            return await asyncio.to_thread(self.onchain_root, version) or ""
        except Exception:  # an unreachable chain leaves the field empty; the proof itself still stands
            return ""

    async def GetLibrary(
        self, request: library_pb2.GetLibraryRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        if request.page_size > MAX_PAGE:
            raise ValidationError("page_size", f"must be at most {MAX_PAGE} (got {request.page_size})")
        if request.page_token and not _TOKEN_RE.fullmatch(request.page_token):
            raise ValidationError("page_token", "is not a token this node issued")
        v = await asyncio.to_thread(self._version, request.version)
        size = request.page_size or DEFAULT_PAGE
        start = int(request.page_token or 0)
        experiences = v.library.experiences[start : start + size]
        end = start + len(experiences)
        return library_pb2.GetLibraryResponse(
            library=version_to_proto(v),
            experiences=[experience_to_proto(e) for e in experiences],
            next_page_token=str(end) if end < len(v.library.experiences) else "",
        )

    async def GetExperience(
        self, request: library_pb2.GetExperienceRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        v = await asyncio.to_thread(self._version, request.version)
        e, proof, leaf = await asyncio.to_thread(self._prove, v, request.id)
        return library_pb2.GetExperienceResponse(
            experience=experience_to_proto(e),
            proof=proof_to_proto(proof, leaf),
            library=version_to_proto(v),
            onchain_root=await self._onchain(v.version),
        )

    async def VerifyExperience(
        self, request: library_pb2.VerifyExperienceRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        v = await asyncio.to_thread(self._version, request.version)
        _e, proof, leaf = await asyncio.to_thread(self._prove, v, request.id)
        root = bytes.fromhex(v.root[2:])
        valid = verify_inclusion(leaf, proof, root)
        reason = (
            "inclusion proof verifies against the library root"
            if valid
            else "inclusion proof does not verify"
        )
        onchain = await self._onchain(v.version)
        if valid and self.onchain_root is not None:
            if not onchain:
                valid, reason = False, "the chain is unreachable, so the root cannot be checked against it"
            elif onchain.lower() != v.root:
                valid, reason = False, f"the chain's root for version {v.version} is {onchain}, not {v.root}"
            else:
                reason += f" and that root is the one the registry holds for version {v.version}"
        return library_pb2.VerifyExperienceResponse(
            valid=valid, reason=reason, proof=proof_to_proto(proof, leaf), root=v.root
        )
