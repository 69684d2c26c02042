"""The upstream SSE layer, fed raw bytes split at every kind of boundary (no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import UpstreamFailure
from gateway.upstream.sse import aiter_data


class ChunkedBody(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def decode(parts: list[bytes], content_type: str = "text/event-stream") -> list[str]:
    async def collect() -> list[str]:
        response = httpx.Response(
            200, headers={"content-type": content_type}, stream=ChunkedBody(parts)
        )
        return [data async for data in aiter_data(response)]

    return asyncio.run(collect())


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


def test_a_character_split_byte_by_byte_is_joined() -> None:
    body = 'data: {"content": "你好 🌍 👩‍💻"}\n\n'.encode()
    assert decode([body[i : i + 1] for i in range(len(body))]) == ['{"content": "你好 🌍 👩‍💻"}']


def test_a_very_long_line_is_one_event() -> None:
    text = "x" * 1_000_000
    body = f'data: {{"content": "{text}"}}\n\n'.encode()
    [data] = decode(split_at(body, list(range(0, len(body), 4096))))
    assert orjson.loads(data)["content"] == text


def test_multi_line_data_fields_are_joined_with_newlines() -> None:
    assert decode([b"data: {\ndata: }\n\n"]) == ["{\n}"]


def test_event_cut_off_by_end_of_body_is_not_emitted() -> None:
    assert decode([b'data: {"a": 1}\n\ndata: {"b":']) == ['{"a": 1}']


def test_ping_events_without_data_are_skipped() -> None:
    assert decode([b"event: ping\n\n: comment\n\ndata: [DONE]\n\n"]) == ["[DONE]"]


def test_non_event_stream_response_is_an_upstream_failure() -> None:
    with pytest.raises(UpstreamFailure, match="without an event stream"):
        decode([b'{"id": 1}'], content_type="application/json")
