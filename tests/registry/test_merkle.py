"""Merkle roots and inclusion proofs: RFC 9162 definitions, tamper detection, agreement with pymerkle."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymerkle import InclusionProof as PymerkleProof
from pymerkle import InmemoryTree, InvalidProof
from pymerkle import verify_inclusion as pymerkle_verify

from zoo.registry.canonical import encode_experience, encode_library
from zoo.registry.errors import NotFound, ValidationError
from zoo.registry.experience import Experience
from zoo.registry.library import Library
from zoo.registry.merkle import (
    EMPTY_ROOT,
    InclusionProof,
    MerkleTree,
    decode_library_leaves,
    leaf_hash,
    leaf_hashes,
    library_root,
    library_tree,
    prove_experience,
    verify_inclusion,
    verify_inclusion_hash,
)

# -- RFC 9162 §2.1.1 and §2.1.3.1, transcribed literally as the independent reference ---------------


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k  # largest power of two smaller than n


def rfc_mth(leaves: list[bytes]) -> bytes:
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = _split(len(leaves))
    return hashlib.sha256(b"\x01" + rfc_mth(leaves[:k]) + rfc_mth(leaves[k:])).digest()


def rfc_path(m: int, leaves: list[bytes]) -> list[bytes]:
    if len(leaves) == 1:
        return []
    k = _split(len(leaves))
    if m < k:
        return [*rfc_path(m, leaves[:k]), rfc_mth(leaves[k:])]
    return [*rfc_path(m - k, leaves[k:]), rfc_mth(leaves[:k])]


def _leaves(n: int) -> list[bytes]:
    return [f"leaf {i}".encode() for i in range(n)]


def test_empty_and_single_leaf_roots() -> None:
    assert MerkleTree.from_leaves([]).root == EMPTY_ROOT == hashlib.sha256(b"").digest()
    assert MerkleTree.from_leaves([]).size == 0
    tree = MerkleTree.from_leaves([b"only"])
    assert tree.root == leaf_hash(b"only") == hashlib.sha256(b"\x00only").digest()
    proof = tree.prove(0)
    assert proof.path == [] and verify_inclusion(b"only", proof, tree.root)


def test_roots_and_paths_match_rfc_9162_for_every_size_and_index() -> None:
    for n in range(1, 71):
        leaves = _leaves(n)
        tree = MerkleTree.from_leaves(leaves)
        assert tree.size == n
        assert tree.root == rfc_mth(leaves)
        for i in range(n):
            proof = tree.prove(i)
            assert proof.path == rfc_path(i, leaves), (n, i)
            assert verify_inclusion(leaves[i], proof, tree.root)


def test_known_vector() -> None:
    # Computed by hand from the RFC 9162 definitions: three leaves a, b, c.
    ha, hb, hc = (hashlib.sha256(b"\x00" + x).digest() for x in (b"a", b"b", b"c"))
    root = hashlib.sha256(b"\x01" + hashlib.sha256(b"\x01" + ha + hb).digest() + hc).digest()
    tree = MerkleTree.from_leaves([b"a", b"b", b"c"])
    assert tree.root == root
    assert tree.prove(2).path == [hashlib.sha256(b"\x01" + ha + hb).digest()]
    assert tree.prove(0).path == [hb, hc]


def test_prove_out_of_range() -> None:
    tree = MerkleTree.from_leaves(_leaves(3))
    for bad in (-1, 3):
        with pytest.raises(ValidationError) as info:
            tree.prove(bad)
        assert info.value.field == "index"


# -- properties over random trees -----------------------------------------------------------------


@st.composite
def tree_and_index(draw: st.DrawFn) -> tuple[list[bytes], int]:
    # Unique leaves, as in a library (unique ids): with repeated leaves another index can legitimately verify.
    leaves = draw(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=70, unique=True))
    return leaves, draw(st.integers(0, len(leaves) - 1))


def _flip(data: bytes, byte: int, bit: int) -> bytes:
    buf = bytearray(data)
    buf[byte % len(buf)] ^= 1 << bit
    return bytes(buf)


@settings(max_examples=300, deadline=None)
@given(tree_and_index(), st.integers(0, 10_000), st.integers(0, 7))
def test_proofs_verify_and_any_flipped_byte_fails(case: tuple[list[bytes], int], byte: int, bit: int) -> None:
    leaves, i = case
    tree = MerkleTree.from_leaves(leaves)
    root, proof = tree.root, tree.prove(i)
    assert verify_inclusion(leaves[i], proof, root)
    assert verify_inclusion_hash(leaf_hash(leaves[i]), proof, root)

    if leaves[i]:
        assert not verify_inclusion(_flip(leaves[i], byte, bit), proof, root)
    assert not verify_inclusion(leaves[i] + b"x", proof, root)
    assert not verify_inclusion(leaves[i], proof, _flip(root, byte, bit))
    assert not verify_inclusion_hash(_flip(leaf_hash(leaves[i]), byte, bit), proof, root)
    for k in range(len(proof.path)):
        path = list(proof.path)
        path[k] = _flip(path[k], byte, bit)
        assert not verify_inclusion(leaves[i], InclusionProof(i, len(leaves), path), root)
    if proof.path:
        assert not verify_inclusion(leaves[i], InclusionProof(i, len(leaves), proof.path[:-1]), root)
    assert not verify_inclusion(leaves[i], InclusionProof(i, len(leaves), [*proof.path, root]), root)


@settings(max_examples=300, deadline=None)
@given(tree_and_index(), st.integers(0, 70))
def test_wrong_index_fails(case: tuple[list[bytes], int], other: int) -> None:
    leaves, i = case
    tree = MerkleTree.from_leaves(leaves)
    proof = tree.prove(i)
    if other != i:
        assert not verify_inclusion(leaves[i], InclusionProof(other, proof.tree_size, proof.path), tree.root)


def _pymerkle_accepts(leaf: bytes, proof: InclusionProof, root: bytes, rule: list[int]) -> bool:
    theirs = PymerkleProof("sha256", True, proof.tree_size, proof.leaf_index + 1, rule, [leaf, *proof.path])
    try:
        pymerkle_verify(leaf, root, theirs)
    except InvalidProof:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(tree_and_index(), st.integers(1, 80))
def test_agrees_with_pymerkle_including_wrong_sizes(case: tuple[list[bytes], int], claimed: int) -> None:
    leaves, i = case
    n = len(leaves)
    tree = MerkleTree.from_leaves(leaves)
    theirs = InmemoryTree.init_from_entries(leaves, algorithm="sha256").prove_inclusion(i + 1)
    pymerkle_verify(leaf_hash(leaves[i]), tree.root, theirs)  # pymerkle accepts its own proof...
    proof = tree.prove(i)
    assert proof.path == theirs.path[1:]  # ...which is ours behind the leaf hash
    # A size claim is bound only as far as it changes the proof's shape (true of RFC 9162 and pymerkle
    # alike), so both must accept or refuse the same claims; verifiers take the size from the commitment.
    lying = InclusionProof(i, claimed, proof.path)
    ours = verify_inclusion(leaves[i], lying, tree.root)
    assert ours == _pymerkle_accepts(leaf_hash(leaves[i]), lying, tree.root, theirs.rule)
    if claimed != n and claimed >= i + 1:
        # Never valid against the root of a tree of the claimed size.
        other_root = MerkleTree.from_leaves([*leaves, *_leaves(80)][:claimed]).root
        assert not verify_inclusion(leaves[i], lying, other_root)


_EDGE_SIZES = sorted({n for k in range(13) for n in (2**k - 1, 2**k, 2**k + 1)} - {0})


@pytest.mark.parametrize("n", [0, *_EDGE_SIZES, 5_000])
def test_roots_and_proofs_agree_with_pymerkle_at_powers_of_two_and_beyond(n: int) -> None:
    leaves = _leaves(n)
    ours = MerkleTree.from_leaves(leaves)
    if n == 0:
        assert ours.root == EMPTY_ROOT
        return
    theirs = InmemoryTree.init_from_entries(leaves, algorithm="sha256")
    assert ours.root == bytes(theirs.get_root())
    for i in {0, 1 % n, n // 2, n - 2 if n > 1 else 0, n - 1}:
        assert ours.prove(i).path == list(theirs.prove_inclusion(i + 1).path[1:]), (n, i)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5_000), st.data())
def test_random_sizes_agree_with_pymerkle(n: int, data: st.DataObject) -> None:
    leaves = _leaves(n)
    ours = MerkleTree.from_leaves(leaves)
    assert ours.size == n
    if n == 0:
        assert ours.root == EMPTY_ROOT
        return
    theirs = InmemoryTree.init_from_entries(leaves, algorithm="sha256")
    assert ours.root == bytes(theirs.get_root())
    i = data.draw(st.integers(0, n - 1))
    proof = ours.prove(i)
    assert proof.path == list(theirs.prove_inclusion(i + 1).path[1:])
    assert verify_inclusion(leaves[i], proof, ours.root)


def test_wrong_size_refused_where_the_shape_differs() -> None:
    leaves = _leaves(5)
    tree = MerkleTree.from_leaves(leaves)
    proof = tree.prove(4)  # the lone right-hand leaf: path [root of the first four]
    assert verify_inclusion(leaves[4], proof, tree.root)
    for size in (6, 7, 8, 9):
        assert not verify_inclusion(leaves[4], InclusionProof(4, size, proof.path), tree.root)
    assert not verify_inclusion(leaves[4], InclusionProof(4, 4, proof.path), tree.root)  # index out of range


def test_malformed_proofs_return_false() -> None:
    leaves = _leaves(4)
    tree = MerkleTree.from_leaves(leaves)
    proof = tree.prove(1)
    assert not verify_inclusion(leaves[1], InclusionProof(1, 0, proof.path), tree.root)
    assert not verify_inclusion(leaves[1], InclusionProof(-1, 4, proof.path), tree.root)
    assert not verify_inclusion(
        leaves[1], InclusionProof(1, 4, [proof.path[0][:31], proof.path[1]]), tree.root
    )
    assert not verify_inclusion(leaves[1], proof, tree.root[:31])


def test_proof_dict_round_trip() -> None:
    tree = MerkleTree.from_leaves(_leaves(11))
    proof = tree.prove(7)
    d = proof.to_dict()
    assert d["leaf_index"] == 7 and d["tree_size"] == 11
    assert all(h.startswith("0x") and len(h) == 66 for h in d["path"])
    assert InclusionProof.from_dict(d) == proof
    assert InclusionProof.from_dict({**d, "path": [h[2:] for h in d["path"]]}) == proof
    for bad, field in [
        ({**d, "path": ["0x1234"]}, "proof.path[0]"),
        ({**d, "path": ["zz" * 32]}, "proof.path[0]"),
        ({**d, "leaf_index": -1}, "proof.leaf_index"),
        ({**d, "tree_size": True}, "proof.tree_size"),
        ({**d, "extra": 1}, "proof"),
    ]:
        with pytest.raises(ValidationError) as info:
            InclusionProof.from_dict(bad)
        assert info.value.field == field


# -- libraries ---------------------------------------------------------------------------------------


def test_library_root_over_canonical_leaves(library: Library) -> None:
    leaves = [encode_experience(e) for e in library.experiences]
    assert library_root(library) == rfc_mth(leaves)
    assert library_root(Library.create(version=0, base_model="m")) == EMPTY_ROOT


def test_prove_experience(library: Library, make_experience: Callable[..., Experience]) -> None:
    root = library_root(library)
    for e in library.experiences:
        proof, leaf = prove_experience(library, e.id)
        assert leaf == encode_experience(e)
        assert proof.leaf_index == library.index_of(e.id) and proof.tree_size == len(library.experiences)
        assert verify_inclusion(leaf, proof, root)
    changed = library.experiences[0].replace(confidence=0.01)
    proof, _ = prove_experience(library, changed.id)
    assert not verify_inclusion(encode_experience(changed), proof, root)  # same id, other content
    with pytest.raises(NotFound):
        prove_experience(library, make_experience(0, domain="x.y").id)


def test_root_changes_with_any_field(library: Library) -> None:
    root = library_root(library)
    e = library.experiences[0]
    others = [e.replace(confidence=0.01), e.replace(examples=["new"]), e.replace(author="job:other")]
    for other in others:
        changed = Library.create(version=0, base_model="m", experiences=[other, *library.experiences[1:]])
        assert library_root(changed) != root


def test_leaf_hashes_is_leaf_hash_of_each() -> None:
    leaves = [b"", b"a", bytes(range(256)) * 3]
    assert leaf_hashes(leaves) == [leaf_hash(x) for x in leaves]
    assert MerkleTree.from_leaves(leaves).root == rfc_mth(leaves)


def test_decode_library_leaves_hashes_the_bytes_as_they_stand(
    library: Library, make_experience: Callable[..., Experience]
) -> None:
    data = encode_library(library)
    decoded, hashes = decode_library_leaves(data)
    assert decoded == library
    assert hashes == library_tree(library).leaf_level

    # The next version: one experience changed, the rest known by leaf hash and taken as those objects.
    new = make_experience(9, text="When only one experience changes, only it is decoded.")
    nxt = Library.create(
        version=library.version + 1,
        parent_root="0x" + library_root(library).hex(),
        base_model=library.base_model,
        experiences=[*library.experiences[1:], new],
    )
    known = dict(zip(hashes, decoded.experiences, strict=True))
    got, got_hashes = decode_library_leaves(encode_library(nxt), known=known)
    assert got == nxt and got_hashes == library_tree(nxt).leaf_level
    kept = {e.id: e for e in decoded.experiences}
    assert all(e is kept[e.id] for e in got.experiences if e.id != new.id)

    # Known experiences are not checked again, but the bytes around them are: a space between two
    # experiences, or after the document, is refused like any non-canonical layout.
    raw = encode_library(nxt)
    for bad in (
        raw.replace(b'},{"', b'}, {"', 1),
        raw + b" ",
        raw.replace(b'"experiences":[', b'"experiences": ['),
    ):
        assert bad != raw
        with pytest.raises(ValidationError, match=r"not in canonical form"):
            decode_library_leaves(bad, known=known)
