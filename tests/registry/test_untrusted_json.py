"""JSON from outside the node parses with its nesting bounded: a refusal the callers already handle, never
a RecursionError."""

from __future__ import annotations

import json

import pytest

from zoo.registry import untrusted_json


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_values_within_the_bound_parse_as_json_does() -> None:
    for text in ("1", '"x"', "{}", '{"a": [1, {"b": null}]}', nested(untrusted_json.MAX_DEPTH)):
        assert untrusted_json.loads(text) == json.loads(text)
        assert untrusted_json.loads(text.encode()) == json.loads(text)
    assert untrusted_json.depth(json.loads(nested(7))) == 7
    assert untrusted_json.depth({"a": [{"b": 1}], "c": 2}) == 3
    assert untrusted_json.depth(5) == 0


@pytest.mark.parametrize("levels", [untrusted_json.MAX_DEPTH + 1, 500, 50_000])
def test_deeper_values_are_a_decoding_error(levels: int) -> None:
    for text in (nested(levels), '{"a":' * levels + "1" + "}" * levels):
        with pytest.raises(json.JSONDecodeError, match=f"nested deeper than {untrusted_json.MAX_DEPTH}"):
            untrusted_json.loads(text)
        with pytest.raises(json.JSONDecodeError):
            untrusted_json.loads(bytearray(text.encode()))


def test_bad_json_is_still_a_decoding_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        untrusted_json.loads("{not json")
