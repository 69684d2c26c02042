from __future__ import annotations

from gateway.protocols.chat import parse_event
from gateway.recovery.events import DONE, Chunk, InBandError, Malformed


def test_chunk_keeps_its_payload_for_pass_through() -> None:
    event = parse_event(b'{"id": "c1", "choices": []}')
    assert isinstance(event, Chunk)
    assert event.data == b'{"id": "c1", "choices": []}'
    assert event.obj == {"id": "c1", "choices": []}


def test_done_error_and_malformed_payloads() -> None:
    assert parse_event(b"[DONE]") is DONE
    error = parse_event(b'{"error": {"message": "overloaded", "code": 503}}')
    assert isinstance(error, InBandError) and error.message == "overloaded"
    assert isinstance(parse_event(b'{"error": "plain text"}'), InBandError)
    assert isinstance(parse_event(b'{"choices": ['), Malformed)
    assert isinstance(parse_event(b"[1, 2]"), Malformed)


def test_finish_reason_error_is_an_in_band_error() -> None:
    payload = b'{"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]}'
    assert isinstance(parse_event(payload), InBandError)


def test_wrong_shaped_chunks_are_malformed_not_crashes() -> None:
    assert isinstance(parse_event(b'{"choices": {"index": 0}}'), Malformed)
    assert isinstance(parse_event(b'{"choices": ["x"]}'), Malformed)
    assert isinstance(parse_event(b'{"choices": [{"delta": "text"}]}'), Malformed)


def test_invalid_utf8_is_replaced_not_dropped() -> None:
    # "caf" + a lone continuation byte + "\xc3" cut short: what a broken upstream sends.
    event = parse_event(b'{"choices": [{"index": 0, "delta": {"content": "caf\x80 \xc3"}}]}')
    assert isinstance(event, Chunk)
    assert event.obj["choices"][0]["delta"]["content"] == "caf\ufffd \ufffd"
    assert event.data.decode("utf-8")  # what is relayed is valid UTF-8
