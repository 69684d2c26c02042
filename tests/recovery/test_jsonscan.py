from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.recovery.jsonscan import JsonCompleteness

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)  # quotes, backslashes, emoji
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
OBJECTS = st.dictionaries(TEXT, JSON_VALUES, max_size=5)


def feed_all(parts: list[str]) -> list[bool]:
    scanner = JsonCompleteness()
    return [scanner.feed(part) for part in parts]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=400, deadline=None)
@given(value=OBJECTS, cuts=st.lists(st.integers(min_value=0), max_size=10), pretty=st.booleans())
def test_complete_exactly_when_the_whole_object_has_arrived(
    value: dict[str, Any], cuts: list[int], pretty: bool
) -> None:
    option = orjson.OPT_INDENT_2 if pretty else 0
    text = orjson.dumps(value, option=option).decode()
    parts = split(text, cuts)
    seen = feed_all(parts)
    # Incomplete until the last non-empty fragment, complete from then on.
    last = max(i for i, p in enumerate(parts) if p) if text else 0
    assert seen[last:] == [True] * (len(parts) - last)
    assert not any(seen[:last])


@pytest.mark.parametrize(
    "parts",
    [
        ['{"a": "}"', "}"],  # a brace inside a string
        ['{"a": "\\', '"}"', "}"],  # an escaped quote split across fragments
        ['{"a": "\\\\', '"', "}"],  # an escaped backslash, then the closing quote
        ['{"a": [1, {"b": "]"}', "]}"],
    ],
)
def test_strings_and_escapes_across_fragments(parts: list[str]) -> None:
    seen = feed_all(parts)
    assert seen == [False] * (len(parts) - 1) + [True]


def test_balanced_but_invalid_is_not_complete() -> None:
    assert feed_all(['{"a": }']) == [False]
    assert feed_all(["{}", " ", "x"]) == [True, True, False]


def test_empty_arguments_are_never_complete() -> None:
    assert feed_all(["", ""]) == [False, False]
