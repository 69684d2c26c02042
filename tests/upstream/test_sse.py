"""The upstream SSE layer, fed raw bytes split at every kind of boundary (no sockets).

httpx2's SSE reader (httpx-sse's, taken into httpx2) is the reference: on any body
it accepts, the gateway's decoder must yield the same data payloads, however the
body is cut into reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import UpstreamFailure
from gateway.upstream.sse import MAX_EVENT_BYTES, EventTooLarge, SSEDecoder, aiter_data


class ChunkedBody(httpx2.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def decode(
    parts: list[bytes],
    content_type: str = "text/event-stream",
    max_event_bytes: int = MAX_EVENT_BYTES,
) -> list[bytes]:
    async def collect() -> list[bytes]:
        response = httpx2.Response(
            200, headers={"content-type": content_type}, stream=ChunkedBody(parts)
        )
        return [data async for data in aiter_data(response, max_event_bytes)]

    return asyncio.run(collect())


def reference(body: bytes) -> list[bytes]:
    """httpx2's SSE reading of a whole body: the data of each event that has some.

    One difference is the reader's, not the gateway's: a body that ends with a lone CR
    ends its last line there, and an event without its blank line is discarded
    (WHATWG, and httpx-sse); httpx2 2.16 reads that CR, at the very end only, as two
    line ends and dispatches the event. The same line end as CRLF is read alike by both.
    """
    if body.endswith(b"\r"):
        body += b"\n"
    response = httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=body,
        request=httpx2.Request("GET", "http://upstream/events"),  # it names its request
    )
    events = httpx2.EventSource(response, max_event_size=None)
    return [event.data.encode() for event in events if event.data]


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]


PAYLOADS = st.lists(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
        max_size=3,
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    payloads=PAYLOADS,
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    comments=st.booleans(),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
def test_events_survive_any_chunking_line_ending_and_utf8_split(
    payloads: list[dict[str, str]], newline: str, comments: bool, cuts: list[int]
) -> None:
    lines: list[str] = []
    for payload in payloads:
        if comments:
            lines += [": keepalive", "event: message"]
        lines += ["data: " + orjson.dumps(payload).decode(), ""]
    body = (newline.join(lines) + newline).encode()
    data = decode(split_at(body, cuts))
    assert [orjson.loads(d) for d in data] == payloads


LINES = st.lists(
    st.one_of(
        st.sampled_from(["", ":", ": ping", "data", "data:", "data: ", "data:  x", "datum: x"]),
        st.sampled_from(["event: error", "id: 7", "retry: 10", "data:[DONE]", "event"]),
        st.builds("data: {}".format, st.text(alphabet=st.characters(codec="utf-8"), max_size=12)),
        st.builds("data:{}".format, st.text(alphabet="ab :\t", max_size=6)),
    ),
    max_size=16,
)


@settings(max_examples=500, deadline=None)
@given(
    lines=LINES,
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
def test_any_field_mix_decodes_as_httpx2_does(
    lines: list[str], newline: str, cuts: list[int]
) -> None:
    body = newline.join(lines).encode()
    assert decode(split_at(body, cuts)) == reference(body)


def test_a_character_split_byte_by_byte_is_joined() -> None:
    body = 'data: {"content": "你好 🌍 👩‍💻"}\n\n'.encode()
    assert decode([body[i : i + 1] for i in range(len(body))]) == [body[6:-2]]


def test_a_very_long_line_is_one_event() -> None:
    text = "x" * 1_000_000
    body = f'data: {{"content": "{text}"}}\n\n'.encode()
    [data] = decode(split_at(body, list(range(0, len(body), 4096))))
    assert orjson.loads(data)["content"] == text


def test_multi_line_data_fields_are_joined_with_newlines() -> None:
    assert decode([b"data: {\ndata: }\n\n"]) == [b"{\n}"]


def test_event_cut_off_by_end_of_body_is_not_emitted() -> None:
    assert decode([b'data: {"a": 1}\n\ndata: {"b":']) == [b'{"a": 1}']


def test_ping_events_without_data_are_skipped() -> None:
    assert decode([b"event: ping\n\n: comment\n\ndata: [DONE]\n\n"]) == [b"[DONE]"]


def test_a_leading_byte_order_mark_is_skipped() -> None:
    assert decode([b"\xef\xbb", b"\xbfdata: 1\n\n"]) == [b"1"]
    assert decode([b"\xef\xbb\xbfdata: 1\n\n"]) == [b"1"]


def test_a_crlf_split_between_reads_is_one_line_end() -> None:
    assert decode([b"data: 1\r", b"\n\r", b"\ndata: 2\r\r"]) == [b"1", b"2"]


def test_non_event_stream_response_is_an_upstream_failure() -> None:
    with pytest.raises(UpstreamFailure, match="without an event stream"):
        decode([b'{"id": 1}'], content_type="application/json")


# -- the bound on what is held between reads (limits.max_event_bytes) ------------------


def test_a_line_over_the_limit_raises_a_protocol_error_and_is_let_go() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    assert decoder.feed(b'data: {"a": 1}\n\ndata: ') == [b'{"a": 1}']
    assert decoder.feed(b"x" * 900) == []
    assert decoder.held == 906
    with pytest.raises(EventTooLarge) as raised:
        decoder.feed(b"x" * 200)  # no line end yet: 1106 bytes
    assert isinstance(raised.value, httpx2.RemoteProtocolError)  # a broken stream to the run
    assert decoder.held == 0


def test_a_line_that_ends_past_the_limit_in_a_later_read_raises_too() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    decoder.feed(b"data: " + b"x" * 600)
    with pytest.raises(EventTooLarge):
        decoder.feed(b"x" * 600 + b"\ndata: y")  # ended, but its event goes on
    assert decoder.held == 0


def test_an_event_of_many_data_lines_over_the_limit_raises() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    for _ in range(10):  # no blank line: one event, 1000 bytes of data
        assert decoder.feed(b"data: " + b"x" * 100 + b"\n") == []
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: " + b"x" * 100 + b"\n")
    assert decoder.held == 0


def test_a_huge_line_is_refused_without_being_buffered_whole() -> None:
    limit = 64 * 1024
    parts = [b'data: {"content": "a"}\n\ndata: '] + [b"x" * 4096] * 10_000  # 40 MB
    fed = 0

    async def collect() -> list[bytes]:
        nonlocal fed

        class Counting(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                nonlocal fed
                for part in parts:
                    fed += len(part)
                    yield part

        response = httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Counting()
        )
        return [data async for data in aiter_data(response, limit)]

    with pytest.raises(EventTooLarge):
        asyncio.run(collect())
    assert fed < 2 * limit  # it stopped reading at the limit


@settings(max_examples=200, deadline=None)
@given(
    payloads=PAYLOADS,
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0), max_size=40),
)
def test_events_up_to_the_limit_decode_however_they_are_split(
    payloads: list[dict[str, str]], newline: str, cuts: list[int]
) -> None:
    lines = ["data: " + orjson.dumps(payload).decode() for payload in payloads]
    body = "".join(line + newline + newline for line in lines).encode()
    limit = max(len(line.encode()) for line in lines)  # the longest line, exactly
    data = decode(split_at(body, cuts), max_event_bytes=limit)
    assert [orjson.loads(d) for d in data] == payloads
