"""The canonical encoding: deterministic, independent of order and normalisation, exact, strictly decoded."""

from __future__ import annotations

import json
import random
import unicodedata
from collections.abc import Callable
from datetime import UTC
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zoo.registry.canonical import (
    SCHEMA_V1,
    SCHEMA_V4,
    canonical_json,
    decode_experience,
    decode_library,
    encode_experience,
    encode_library,
    experience_document,
    library_document,
)
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.expert_factors import MAX_SCALE
from zoo.registry.library import Library
from zoo.registry.merkle import decode_library_leaves, library_root, library_tree

Make = Callable[..., Experience]


def test_layout_is_compact_sorted_utf8(make_experience: Make) -> None:
    e = make_experience(0, text="When a café bill arrives, check the total.", confidence=0.87)
    data = encode_experience(e)
    assert b" " not in data.replace(e.text.encode(), b"")  # no whitespace outside strings
    assert "café".encode() in data  # UTF-8, not \u escapes
    assert b'"confidence":"0.870000"' in data
    assert b'"created_at":"2025-10-17T12:00:00Z"' in data
    assert b'"factors":null' in data and b'"examples":[]' in data
    doc = json.loads(data)
    assert list(doc) == sorted(doc) and list(doc["provenance"]) == sorted(doc["provenance"])


def test_same_library_same_bytes_and_root(experiences: list[Experience]) -> None:
    a = Library.create(version=0, base_model="m", experiences=experiences)
    b = Library.create(version=0, base_model="m", experiences=list(experiences))
    assert encode_library(a) == encode_library(b)
    assert library_root(a) == library_root(b)


def test_insertion_order_does_not_matter(experiences: list[Experience]) -> None:
    shuffled = list(experiences)
    random.Random(7).shuffle(shuffled)
    assert shuffled != experiences
    a = Library.create(version=0, base_model="m", experiences=experiences)
    b = Library.create(version=0, base_model="m", experiences=shuffled)
    assert encode_library(a) == encode_library(b)
    assert library_root(a) == library_root(b)


def test_nfc_and_nfd_inputs_encode_identically(make_experience: Make) -> None:
    text = "When Ångström-scale data appear, convert units before comparing."
    examples = ["Résumé: über-naïve"]
    nfc = make_experience(0, text=text, examples=examples, base_model="modèle")
    nfd = make_experience(
        0,
        text=unicodedata.normalize("NFD", text),
        examples=[unicodedata.normalize("NFD", x) for x in examples],
        base_model=unicodedata.normalize("NFD", "modèle"),
    )
    assert encode_experience(nfc) == encode_experience(nfd)
    lib_a = Library.create(version=0, base_model="modèle", experiences=[nfc])
    lib_b = Library.create(version=0, base_model=unicodedata.normalize("NFD", "modèle"), experiences=[nfd])
    assert encode_library(lib_a) == encode_library(lib_b)


def test_library_round_trip(library: Library) -> None:
    data = encode_library(library)
    back = decode_library(data)
    assert back == library
    assert encode_library(back) == data
    assert json.loads(data)["schema"] == SCHEMA_V1


def test_leaves_are_embedded_verbatim(library: Library) -> None:
    data = encode_library(library)
    for e in library.experiences:
        assert encode_experience(e) in data


def test_experience_round_trip_with_factors(make_experience: Make) -> None:
    e = make_experience(
        2,
        examples=["line one\nline two"],
        factors={
            "tokenizer": "smollm2",
            "token_ids": [5, 9, 1000, 49151],
            "signs": [1, -1, -1, 1],
            "block_size": 2,
            "scales": [0.1, 3.5e-7],
        },
    )
    data = encode_experience(e)
    assert b"line one\\nline two" in data
    assert decode_experience(data) == e


# -- hypothesis: exact round trips ---------------------------------------------------------------------

_words = st.text(alphabet=st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=12)
_strings = st.text(alphabet=st.characters(exclude_categories=["Cc", "Cs"]), min_size=1, max_size=30)


@st.composite
def experiences(draw: st.DrawFn) -> Experience:
    n_tokens = draw(st.integers(0, 20))
    factors = None
    if n_tokens:
        block = draw(st.integers(1, 8))
        factors = {
            "tokenizer": "tok",
            "token_ids": sorted(
                draw(st.sets(st.integers(0, 2**32 - 1), min_size=n_tokens, max_size=n_tokens))
            ),
            "signs": draw(st.lists(st.sampled_from([1, -1]), min_size=n_tokens, max_size=n_tokens)),
            "block_size": block,
            "scales": draw(
                st.lists(
                    # The schema bounds scales (a mean |log-boost|) to [0, MAX_SCALE].
                    st.floats(0.0, MAX_SCALE, allow_nan=False),
                    min_size=-(-n_tokens // block),
                    max_size=-(-n_tokens // block),
                )
            ),
        }
    return Experience.create(
        text=" ".join(
            [draw(st.sampled_from(["When", "If", "For"])), *draw(st.lists(_words, min_size=2, max_size=20))]
        ),
        domain=draw(st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,3}", fullmatch=True)),
        confidence=draw(st.floats(0.0, 1.0)),
        author=draw(st.sampled_from(["0x" + "0f" * 20, "job:abc"])),
        base_model=draw(_strings),
        created_at=draw(st.datetimes(timezones=st.just(UTC))),
        examples=draw(st.lists(_strings, max_size=3)),
        factors=factors,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiences())
def test_experience_round_trip_is_exact(e: Experience) -> None:
    data = encode_experience(e)
    back = decode_experience(data)
    assert back == e  # floats (confidence, float32 scales) come back bit for bit
    assert encode_experience(back) == data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(experiences(), max_size=6, unique_by=lambda e: e.id), st.randoms(use_true_random=False))
def test_library_bytes_independent_of_order(exps: list[Experience], rnd: random.Random) -> None:
    shuffled = list(exps)
    rnd.shuffle(shuffled)
    a = Library.create(version=4, parent_root="0x" + "12" * 32, base_model="m", experiences=exps)
    b = Library.create(version=4, parent_root="0x" + "12" * 32, base_model="m", experiences=shuffled)
    assert encode_library(a) == encode_library(b)
    assert decode_library(encode_library(a)) == a


# -- strict decoding ---------------------------------------------------------------------------------


def _doc(library: Library) -> dict:
    return json.loads(encode_library(library))


def _rejected(data: bytes, field: str, fragment: str, **kwargs: object) -> None:
    with pytest.raises(ValidationError) as info:
        decode_library(data, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)


def test_decode_refuses_oversized(library: Library) -> None:
    data = encode_library(library)
    assert decode_library(data, max_size=len(data)) == library
    _rejected(data, "library", f"is {len(data)} bytes; the limit is {len(data) - 1}", max_size=len(data) - 1)


def test_decode_refuses_malformed_bytes(library: Library) -> None:
    _rejected(b"\xff\xfe{}", "library", "not valid UTF-8")
    _rejected(b'{"schema": ', "library", "not valid JSON")
    _rejected(b"[1, 2]", "library", "must be a JSON object")
    _rejected(b"[" * 100_000 + b"]" * 100_000, "library", "nested too deeply")
    _rejected(b'{"schema":"zoo.experience-library/1","schema":"x"}', "library", "duplicate key 'schema'")
    _rejected(b'{"version":NaN}', "library", "NaN")
    _rejected(b'{"version":1.0}', "library", "JSON number 1.0")


def test_brackets_inside_strings_do_not_count_as_nesting(library: Library) -> None:
    # 100 brackets deep inside a string (after an escaped quote, too) is text, not structure.
    deep = Library.create(
        version=0,
        base_model=library.base_model,
        experiences=library.experiences,
        description='say "[[[[' + "[" * 100 + "{" * 100 + '" and \\ then ' + "]" * 50,
    )
    data = encode_library(deep)
    assert decode_library(data) == deep
    # Real structure beyond the limit is still refused, with bracket-laden strings around it.
    hostile = b'{"a":"[[[[","b":' + b"[" * 40 + b'"]]]]"' + b"]" * 40 + b"}"
    _rejected(hostile, "library", "nested too deeply")


def test_decode_names_the_bad_field(library: Library) -> None:
    doc = _doc(library)
    doc["schema"] = "other/9"
    _rejected(json.dumps(doc).encode(), "schema", "zoo.experience-library/1")

    doc = _doc(library)
    doc["experiences"][2]["confidence"] = "0.87"
    _rejected(json.dumps(doc).encode(), "experiences[2].confidence", "six digits")

    doc = _doc(library)
    doc["experiences"][1]["domain"] = "Bad Domain"
    _rejected(json.dumps(doc).encode(), "experiences[1].domain", "dotted lower-case")

    doc = _doc(library)
    doc["experiences"][0]["provenance"]["votes"] = 3
    _rejected(json.dumps(doc).encode(), "experiences[0].provenance.votes", "is not a field here")

    doc = _doc(library)
    doc["experiences"][0]["factors"] = {"scales": "AAA=", "signs": "AA=="}
    _rejected(json.dumps(doc).encode(), "experiences[0].factors.scales", "not a whole number of float32")

    doc = _doc(library)
    doc["experiences"][0]["factors"] = {"signs": "AB=="}  # nonzero unused bits: two spellings of one byte
    _rejected(json.dumps(doc).encode(), "experiences[0].factors.signs", "not canonical base64")


def test_decode_requires_canonical_bytes(library: Library) -> None:
    pretty = json.dumps(_doc(library), indent=2).encode()
    _rejected(pretty, "library", "not in canonical form")
    assert decode_library(pretty, require_canonical=False) == library

    doc = _doc(library)
    doc["experiences"].reverse()
    unsorted = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    _rejected(unsorted, "experiences", "must be sorted by id")
    assert decode_library(unsorted, require_canonical=False) == library

    doc = _doc(library)
    doc["description"] = "naïve"
    escaped = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    _rejected(escaped, "library", "not in canonical form")


def test_decode_refuses_non_nfc_text(library: Library) -> None:
    doc = library_document(library)
    doc["description"] = unicodedata.normalize("NFD", "café")
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    _rejected(data, "description", "not in Unicode normal form NFC")
    assert decode_library(data, require_canonical=False).description == "café"


def test_decode_experience_refuses_oversized_leaf(make_experience: Make) -> None:
    data = encode_experience(make_experience(0))
    with pytest.raises(ValidationError, match="the limit is 10"):
        decode_experience(data, max_size=10)


# -- golden bytes and the encoder's equivalence with the json module ------------------------------------

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", ["library-v1", "library-v2", "library-empty"])
def test_golden_libraries_decode_re_encode_and_root_unchanged(name: str) -> None:
    # Written by the json-module encoder before the codec moved to msgspec; they must never change: a
    # changed byte is a changed CID and root for every library ever published.
    data = (GOLDEN / f"{name}.json").read_bytes()
    root = (GOLDEN / f"{name}.root").read_text().strip()
    lib = decode_library(data)
    assert encode_library(lib) == data
    assert "0x" + library_root(lib).hex() == root
    fresh = Library.create(
        version=lib.version,
        parent_root=lib.parent_root,
        base_model=lib.base_model,
        description=lib.description,
        experiences=[e.replace() for e in lib.experiences],  # new instances: nothing cached
    )
    assert encode_library(fresh) == data
    assert "0x" + library_root(fresh).hex() == root
    for e in lib.experiences:
        assert encode_experience(e) == json_module_bytes(experience_document(e))


def json_module_bytes(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_json_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _json_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_json_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_canonical_json_writes_the_json_modules_bytes(doc: object) -> None:
    assert canonical_json(doc) == json_module_bytes(doc)


def test_fast_and_careful_decoding_agree_on_refusals(library: Library) -> None:
    # The fast path hands anything it cannot accept to the careful one, which names the problem.
    data = encode_library(library)
    _rejected(data.replace(b'"version":0', b'"version":0.0'), "library", "JSON number 0.0")
    _rejected(data[:-1] + b',"schema":"x"}', "library", "duplicate key 'schema'")
    _rejected(data.replace(b'"description":"test library"', b'"description":"test\\u0020library"'),
              "library", "not in canonical form")  # fmt: skip


def test_known_experiences_are_taken_as_they_are(library: Library, make_experience: Make) -> None:
    new = make_experience(7, text="When a reused library changes one lesson, only that lesson is checked.")
    kept = library.experiences[1:]
    nxt = Library.create(version=1, parent_root="0x" + library_root(library).hex(), base_model="m",
                         experiences=[*kept, new])  # fmt: skip
    data = encode_library(nxt)
    known = dict(zip(library_tree(library).leaf_level, library.experiences, strict=True))
    decoded, _ = decode_library_leaves(data, known=known)
    assert decoded == nxt and encode_library(decoded) == data
    by_id = {e.id: e for e in decoded.experiences}
    assert all(by_id[e.id] is e for e in kept)  # the very objects, not validated copies
    assert by_id[new.id] is not new and by_id[new.id] == new

    # Reuse never lets anything through that a cold decode refuses: a tampered copy of a known
    # experience is a different byte string, so it is validated, and refused with the careful error.
    doc = _doc(nxt)
    target = next(i for i, x in enumerate(doc["experiences"]) if x["id"] == kept[0].id)
    doc["experiences"][target]["domain"] = "Bad Domain"
    with pytest.raises(ValidationError) as info:
        decode_library_leaves(json_module_bytes(doc), known=known)
    assert info.value.field == f"experiences[{target}].domain"
    doc = _doc(nxt)
    doc["experiences"][target]["text"] = unicodedata.normalize("NFD", "When café ünïcode is in the text.")
    _rejected(json_module_bytes(doc), f"experiences[{target}].text", "not in Unicode normal form NFC")
    doc["experiences"][target]["text"] = "When the text changes, the id no longer matches it."
    _rejected(json_module_bytes(doc), f"experiences[{target}].id", "does not match the content")


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["library-v1", "library-v2"]), st.data())
def test_whatever_decodes_re_encodes_to_the_same_bytes(name: str, data: st.DataObject) -> None:
    """One library, one encoding: bytes mutated anywhere (digits, quotes, escapes, separators, spaces,
    multi-byte characters) either are refused or are themselves the canonical encoding of what they hold."""
    raw = bytearray((GOLDEN / f"{name}.json").read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        piece = data.draw(st.sampled_from([b"0", b"7", b" ", b'"', b"\\", b",", b"}", b"]", b"a", b"\xc3\xa9",
                                           b"\\u00e9", b"\x00", b"-", b".", b"null", b""]))  # fmt: skip
        raw[at : at + data.draw(st.integers(0, 2))] = piece
    original = decode_library((GOLDEN / f"{name}.json").read_bytes())
    tree = library_tree(original)
    known = dict(zip(tree.leaf_level, original.experiences, strict=True))
    decoders = [
        lambda: decode_library(bytes(raw)),
        lambda: decode_library_leaves(bytes(raw))[0],  # the sync's path: one typed decode of the whole
        lambda: decode_library_leaves(bytes(raw), known=known)[0],  # ... or only the experiences not known
    ]
    outcomes = []
    for decode in decoders:
        try:
            lib = decode()
        except ValidationError:
            outcomes.append(("refused", None))  # which of several problems is named first may differ
            continue
        assert encode_library(lib) == bytes(raw)
        outcomes.append(("accepted", lib))
    assert all(outcome == outcomes[0] for outcome in outcomes)


MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_a_library_that_names_its_models_hash_is_format_4(library: Library) -> None:
    bound = Library.create(version=library.version, base_model=library.base_model, description="bound",
                           experiences=library.experiences, base_model_sha256=MODEL_SHA256)  # fmt: skip
    assert bound.schema == SCHEMA_V4 and bound.base_model_sha256 == MODEL_SHA256
    data = encode_library(bound)
    doc = json.loads(data)
    assert list(doc) == sorted(doc) and doc["base_model_sha256"] == MODEL_SHA256
    assert decode_library(data) == bound
    assert decode_library_leaves(data)[0] == bound  # the experience-by-experience path agrees
    # The hash names no experience: the Merkle root over them is the same, the bytes (and CID) are not.
    unbound = Library.create(version=library.version, base_model=library.base_model, description="bound",
                             experiences=library.experiences)  # fmt: skip
    assert library_root(unbound) == library_root(bound) and encode_library(unbound) != data
    # A library without it is written as it always was: no such key, and its older format.
    assert b"base_model_sha256" not in encode_library(unbound) and unbound.schema != SCHEMA_V4


def test_a_model_hash_is_refused_outside_format_4_and_when_malformed(library: Library) -> None:
    bound = Library.create(version=library.version, base_model=library.base_model,
                           experiences=library.experiences, base_model_sha256=MODEL_SHA256)  # fmt: skip
    doc = json.loads(encode_library(bound))
    cases = [
        ({**doc, "schema": library.schema}, "schema", "must be 'zoo.experience-library/4'"),
        ({k: v for k, v in doc.items() if k != "base_model_sha256"}, "schema", f"must be {library.schema!r}"),
        ({**doc, "base_model_sha256": MODEL_SHA256.upper()}, "base_model_sha256", "lower-case hex"),
        ({**doc, "base_model_sha256": MODEL_SHA256[:-2]}, "base_model_sha256", "64 lower-case hex"),
        ({**doc, "base_model_sha256": 7}, "base_model_sha256", ""),
    ]
    for bad, field, words in cases:
        data = canonical_json(bad)
        with pytest.raises(ValidationError) as e:
            decode_library(data)
        assert e.value.field == field and words in str(e.value), (bad.get("schema"), str(e.value))
        with pytest.raises(ValidationError):
            decode_library_leaves(data)
    with pytest.raises(ValidationError, match="base_model_sha256"):
        Library.create(version=1, base_model="m", base_model_sha256="sha256:" + MODEL_SHA256)
