"""Schema of experiences and libraries: field-specific errors, content-derived ids, normalisation."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from zoo.registry.errors import NotFound, ValidationError, ZooError
from zoo.registry.experience import MAX_WORDS, Experience, experience_id
from zoo.registry.expert_factors import ExpertFactors, pack_signs
from zoo.registry.library import Library
from zoo.registry.validation import Problem, clean_string

Make = Callable[..., Experience]


def _rejects(make: Make, field: str, fragment: str, **changes: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        make(0, **changes)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert fragment in str(info.value)
    return info.value


def test_valid_experience_fields(make_experience: Make) -> None:
    e = make_experience(0)
    assert e.id.startswith("exp-") and len(e.id) == 20
    assert e.id == experience_id(e.domain, e.text)
    assert e.provenance.created_at == datetime(2025, 10, 17, 12, tzinfo=UTC)
    assert e.provenance.author == "0x" + "ab" * 20


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"text": "When " + " ".join(["word"] * 41)}, "text", "has 42 words"),
        ({"text": "Always check the bounds of every answer."}, "text", "must begin with its trigger"),
        ({"text": "when solving problems check bounds."}, "text", "must begin with its trigger"),
        ({"text": "When solving"}, "text", "has 2 words"),
        ({"text": "When solving \x07 problems, check."}, "text", "control character U+0007"),
        ({"text": 42}, "text", "must be a string (got int)"),
        ({"domain": "Math.Geometry"}, "domain", "dotted lower-case"),
        ({"domain": "math..geometry"}, "domain", "dotted lower-case"),
        ({"domain": "math.geometry."}, "domain", "dotted lower-case"),
        ({"domain": "a" * 65}, "domain", "at most 64"),
        ({"confidence": 1.5}, "confidence", "between 0 and 1 (got 1.5)"),
        ({"confidence": -0.1}, "confidence", "between 0 and 1 (got -0.1)"),
        ({"confidence": math.nan}, "confidence", "finite"),
        ({"confidence": math.inf}, "confidence", "finite"),
        ({"confidence": "0.5"}, "confidence", "must be a number (got str)"),
        ({"confidence": True}, "confidence", "must be a number (got bool)"),
        ({"author": "alice"}, "provenance.author", '"job:<id>"'),
        ({"author": "0x1234"}, "provenance.author", "20-byte"),
        ({"created_at": "2025-10-17T12:00:00"}, "provenance.created_at", "no time zone"),
        ({"created_at": "yesterday"}, "provenance.created_at", "ISO-8601"),
        ({"base_model": ""}, "provenance.base_model", "must have 1 to 200 characters"),
        ({"examples": ["x"] * 9}, "examples", "at most 8"),
        ({"examples": [""]}, "examples", "example 0 must have 1 to"),
    ],
)
def test_invalid_fields_are_named(
    make_experience: Make, changes: dict[str, object], field: str, fragment: str
) -> None:
    _rejects(make_experience, field, fragment, **changes)


def test_word_limit_boundary(make_experience: Make) -> None:
    text = "When " + " ".join(["word"] * (MAX_WORDS - 1))
    assert len(make_experience(0, text=text).text.split()) == MAX_WORDS
    _rejects(make_experience, "text", f"has {MAX_WORDS + 1} words", text=text + " more")


def test_unknown_field_rejected(make_experience: Make) -> None:
    data = make_experience(0).to_dict()
    data["usage_count"] = 156
    with pytest.raises(ValidationError) as info:
        Experience.parse(data)
    assert info.value.field == "usage_count"
    assert "is not a field here" in str(info.value)


def test_errors_are_domain_errors_carrying_values(make_experience: Make) -> None:
    err = _rejects(make_experience, "confidence", "between 0 and 1", confidence=1.5)
    assert isinstance(err, ZooError) and isinstance(err, ValueError)
    assert err.values["errors"][0]["input"] == 1.5


def test_several_problems_are_all_reported(make_experience: Make) -> None:
    err = _rejects(make_experience, "domain", "dotted", domain="Bad", confidence=2.0)
    assert "and 1 more: confidence:" in str(err)


def test_id_is_content_derived(make_experience: Make) -> None:
    e = make_experience(0)
    # Confidence, examples, provenance: the same lesson, the same id.
    assert e.replace(confidence=0.1).id == e.id
    assert e.replace(examples=["A worked example."]).id == e.id
    assert e.replace(author="job:step-7", base_model="other", created_at="2030-01-01T00:00:00Z").id == e.id
    # Text or domain: another lesson.
    assert e.replace(text=e.text + " Always.").id != e.id
    assert e.replace(domain="math.other").id != e.id
    # Whitespace layout does not make another lesson.
    spaced = make_experience(0, text="  " + e.text.replace(" ", "  \n\t") + "\n")
    assert spaced.text == e.text and spaced.id == e.id


def test_forged_or_renumbered_id_rejected(make_experience: Make) -> None:
    data = make_experience(0).to_dict()
    for bad, fragment in [("exp-0000000000000000", "does not match the content"), ("G23", "exp-<16 hex")]:
        with pytest.raises(ValidationError) as info:
            Experience.parse({**data, "id": bad})
        assert info.value.field == "id" and fragment in str(info.value)


def test_nfc_normalisation(make_experience: Make) -> None:
    text = "When a café menu lists prices, check totals carefully."
    nfd = unicodedata.normalize("NFD", text)
    assert nfd != text
    a, b = make_experience(0, text=text), make_experience(0, text=nfd)
    assert a.text == b.text == unicodedata.normalize("NFC", text)
    assert a.id == b.id
    assert make_experience(0, examples=[unicodedata.normalize("NFD", "naïve")]).examples == ("naïve",)


def test_lone_surrogate_rejected(make_experience: Make) -> None:
    _rejects(make_experience, "text", "lone surrogate", text="When \ud800 appears, stop now.")


def test_confidence_quantised_to_millionths(make_experience: Make) -> None:
    assert make_experience(0, confidence=0.1234567).confidence == 0.123457
    assert make_experience(0, confidence=1).confidence == 1.0


def test_created_at_normalised_to_utc_seconds(make_experience: Make) -> None:
    plus2 = timezone(timedelta(hours=2))
    e = make_experience(0, created_at=datetime(2025, 10, 17, 14, 0, 0, 999_999, tzinfo=plus2))
    assert e.provenance.created_at == datetime(2025, 10, 17, 12, tzinfo=UTC)
    with pytest.raises(ValidationError) as info:
        make_experience(0, created_at=datetime(2025, 10, 17, 12))
    assert info.value.field == "provenance.created_at"


def test_author_forms(make_experience: Make) -> None:
    mixed = "0x742d35Cc6634C0532925a3b844Bc9e7595f2bD1e"
    assert make_experience(0, author=mixed).provenance.author == mixed.lower()
    assert make_experience(0, author="job:gspo-run.7").provenance.author == "job:gspo-run.7"


def test_models_are_immutable(make_experience: Make) -> None:
    e = make_experience(0)
    with pytest.raises(AttributeError, match="immutable"):
        e.confidence = 0.1  # type: ignore[misc]


# -- expert factors ----------------------------------------------------------------------------------


def _factors(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "tokenizer": "smollm2",
        "token_ids": list(range(10, 140)),
        "signs": [1 if i % 3 else -1 for i in range(130)],
        "block_size": 64,
        "scales": [0.5, 0.25, 0.125],
    }
    base.update(changes)
    return base


def test_factors_pack_signs_and_round_scales_to_float32(make_experience: Make) -> None:
    e = make_experience(0, factors=_factors(scales=[0.1, 0.2, 0.3]))
    f = e.factors
    assert f is not None
    assert f.sign_values() == [1 if i % 3 else -1 for i in range(130)]
    assert f.signs == pack_signs(f.sign_values()) and len(f.signs) == 17
    assert f.scales[0] == 0.10000000149011612  # nearest float32 to 0.1
    # Packed bits are accepted as they are, and give the same model.
    assert ExpertFactors.parse(_factors(signs=f.signs, scales=list(f.scales))) == f


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"token_ids": [3, 2, 5]}, "factors.token_ids", "strictly increasing"),
        ({"token_ids": [1, 1, 2]}, "factors.token_ids", "strictly increasing"),
        ({"token_ids": [-1, 2]}, "factors.token_ids", "outside"),
        ({"signs": [1, 0, -1]}, "factors.signs", "not +1 or -1"),
        ({"signs": b"\x00"}, "factors.signs", "1 bytes for 130 tokens"),
        ({"signs": b"\xff" * 17}, "factors.signs", "padding bits"),
        ({"scales": [0.5, 0.25]}, "factors.scales", "need 3"),
        ({"scales": [0.5, math.nan, 0.1]}, "factors.scales", "not a finite"),
        ({"scales": [0.5, 1e39, 0.1]}, "factors.scales", "must be in [0, 100]"),
        ({"scales": [0.5, -0.1, 0.1]}, "factors.scales", "must be in [0, 100]"),
        ({"block_size": 0}, "factors.block_size", "between 1 and"),
        ({"extra": 1}, "factors.extra", "is not a field here"),
    ],
)
def test_invalid_factors(
    make_experience: Make, changes: dict[str, object], field: str, fragment: str
) -> None:
    _rejects(make_experience, field, fragment, factors=_factors(**changes))


# -- libraries -------------------------------------------------------------------------------------


def test_library_sorts_by_id_and_finds(experiences: list[Experience]) -> None:
    lib = Library.create(version=0, base_model="m", experiences=reversed(experiences))
    ids = [e.id for e in lib.experiences]
    assert ids == sorted(ids) and len(ids) == len(experiences)
    for i, e in enumerate(lib.experiences):
        assert lib.index_of(e.id) == i and lib.get(e.id) is e
    with pytest.raises(NotFound):
        lib.get("exp-ffffffffffffffff")


def test_library_rejects_duplicate_ids(make_experience: Make) -> None:
    e = make_experience(0)
    same_lesson = e.replace(confidence=0.9)
    with pytest.raises(ValidationError) as info:
        Library.create(version=0, base_model="m", experiences=[e, same_lesson])
    assert info.value.field == "experiences" and e.id in str(info.value)


@pytest.mark.parametrize(
    ("version", "parent_root", "field", "fragment"),
    [
        (0, "0x" + "ab" * 32, "parent_root", "version 0 cannot have a parent root"),
        (1, "0x1234", "parent_root", "64 hex digits"),
        (-1, "", "version", "between 0 and 2**53 - 1 (got -1)"),
        (2**53, "0x" + "ab" * 32, "version", "between 0 and 2**53 - 1"),
    ],
)
def test_library_version_rules(version: int, parent_root: str, field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        Library.create(version=version, parent_root=parent_root, base_model="m")
    assert info.value.field == field and fragment in str(info.value)


def test_genesis_at_any_version_and_children() -> None:
    assert Library.create(version=1, base_model="m").parent_root == ""
    assert Library.create(version=2, parent_root="0x" + "cd" * 32, base_model="m").version == 2


def test_library_normalises_root_case() -> None:
    lib = Library.create(version=3, parent_root="0x" + "AB" * 32, base_model="m")
    assert lib.parent_root == "0x" + "ab" * 32


def test_library_nested_error_path(make_experience: Make) -> None:
    good = make_experience(0).to_dict()
    bad = {**make_experience(1).to_dict(), "confidence": 3.0}
    with pytest.raises(ValidationError) as info:
        Library.parse({"version": 0, "base_model": "m", "experiences": [good, bad]})
    assert info.value.field == "experiences[1].confidence"


def test_clean_string_refuses_exactly_the_unicode_control_characters() -> None:
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # lone surrogates have their own error
        ch = chr(code)
        control = unicodedata.category(ch) == "Cc"
        for multiline in (False, True):
            allowed = not control or (multiline and ch in "\t\n")
            try:
                clean_string(f"a{ch}b", multiline=multiline)
            except Problem as e:
                assert not allowed, f"U+{code:04X} refused: {e}"
                assert f"control character U+{code:04X}" in str(e)
            else:
                assert allowed, f"U+{code:04X} accepted (multiline={multiline})"
