"""CatchUp, pure: a takeover's response read again is checked against what the client has."""

from __future__ import annotations

import pytest

from gateway.protocols.responses import RESPONSES
from gateway.runs.catchup import CatchUp, NotTheSame, Restored


def catch_up(events: list[bytes], sent: list[bytes]) -> CatchUp:
    accumulator = RESPONSES.new_accumulator()
    splicer = RESPONSES.splicer(accumulator, {"model": "m"})
    return CatchUp(events, Restored(accumulator, splicer, sent.append, "resp_1"))


def test_what_the_client_has_is_checked_and_only_the_rest_is_sent() -> None:
    sent: list[bytes] = []
    emit = catch_up([b"event one\n\n", b"event two\n\n"], sent)
    assert emit(b"event one\n\nevent t") is None  # rendered again, in other pieces
    assert not emit.caught_up
    emit(b"wo\n\nevent three\n\n")
    assert emit.caught_up
    emit(b"event four\n\n")
    assert sent == [b"event three\n\n", b"event four\n\n"]


def test_a_difference_is_raised_before_anything_of_it_is_sent() -> None:
    sent: list[bytes] = []
    emit = catch_up([b"event one\n\n"], sent)
    with pytest.raises(NotTheSame):
        emit(b"event 1\n\nevent two\n\n")
    assert sent == []


def test_a_client_with_nothing_is_caught_up_at_once() -> None:
    sent: list[bytes] = []
    emit = catch_up([], sent)
    assert emit.caught_up
    emit(b"event one\n\n")
    assert sent == [b"event one\n\n"]
