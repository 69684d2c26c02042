"""Upstream SSE bodies to event payloads, as bytes.

The WHATWG event-stream rules the gateway needs: lines end with CRLF, CR or LF (a
CRLF split across two reads is one line end); ``:`` lines are comments; ``data``
fields are joined with ``\\n``; a blank line ends an event; an event cut off by the
end of the body is discarded, so a half-received JSON chunk is never parsed; a
leading byte-order mark is skipped. Other fields (``event``, ``id``, ``retry``)
mean nothing to a chat-completion stream and are ignored.

It works on bytes, not text: line ends are ASCII and never occur inside a UTF-8
sequence, so a character split across reads is whole again in its event, and the
payload goes to orjson (which checks the UTF-8) and, unchanged, to the client.
``tests/upstream/test_sse.py`` checks it against httpx2's own SSE reader (httpx-sse's,
taken into httpx2), which it replaces on the hot path: that reads through httpx2's
text decoding, a generator layer per step that cost more than the whole decoder here.

What it holds between reads is bounded: the line not ended yet and the data of the
event in progress, together at most ``max_event_bytes`` (``limits.max_event_bytes``)
plus one read. An upstream that goes past it (a line without an end, an event
without a blank line) gets ``EventTooLarge``, an ``httpx2.RemoteProtocolError``:
the run treats it as a broken stream and recovers, and the buffer is let go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import orjson

from gateway.errors import UpstreamFailure

BOM = b"\xef\xbb\xbf"
_FIELDS = (b":", b"event", b"id", b"retry")
MAX_EVENT_BYTES = 8 * 1024 * 1024  # the default of limits.max_event_bytes


class EventTooLarge(httpx2.RemoteProtocolError):
    """An upstream line or event outgrew ``max_event_bytes``: the stream is broken."""


class SSEDecoder:
    """Feed body chunks, get the ``data`` of each complete event (empty ones skipped)."""

    raw_json = False  # lines outside the event-stream grammar mean something (RawJSONDecoder)

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._held = 0  # bytes of the two below
        self._partial: list[bytes] = []  # the start of a line not ended yet
        self._data: list[bytes] = []  # data fields of the event in progress
        self._skip_lf = False  # the last chunk ended with CR: a leading LF is its CRLF
        self._started = False  # a first line was seen (the only place a BOM is skipped)

    @property
    def held(self) -> int:
        """Bytes kept between reads: the line not ended yet and the event in progress."""
        return self._held

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:  # nothing to decode; and a pending CR must still await its LF
            return []
        if self._skip_lf:
            self._skip_lf = False
            chunk = chunk[1:] if chunk[:1] == b"\n" else chunk
        if b"\r" in chunk:
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        elif b"\n" not in chunk:
            if chunk:
                self._partial.append(chunk)
                self._held += len(chunk)
                if self._held > self._max:
                    self._overflow()
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            self._partial.append(rest)
        if not self._started:
            self._started = True
            lines[0] = lines[0].removeprefix(BOM)
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    data.clear()
                    if payload:
                        out.append(payload)
            elif line.startswith(b"data"):
                if line.startswith(b"data: "):
                    data.append(line[6:])
                elif line.startswith(b"data:"):
                    data.append(line[5:])
                elif line == b"data":
                    data.append(b"")
            elif self.raw_json and not line.startswith(_FIELDS):
                self._raw_line(line, out)
        held = len(rest) + (sum(map(len, data)) if data else 0)
        if held > self._max:
            # Events completed in this read go too: the stream is broken, and the
            # recovery continues from what the client was sent.
            self._overflow()
        self._held = held
        return out

    def _raw_line(self, line: bytes, out: list[bytes]) -> None:
        """A line that is no SSE field (see ``RawJSONDecoder``)."""

    def _overflow(self) -> None:
        self._partial = []
        self._data.clear()
        self._held = 0
        raise EventTooLarge(
            f"The upstream sent an event line or event larger than {self._max} bytes."
        )


class RawJSONDecoder(SSEDecoder):
    """An event stream that may end with a JSON object outside any event: Google's APIs
    write their error that way after the events of a stream they cannot finish (an
    ``{"error": …}`` object over several lines). Such lines, which the event-stream
    grammar ignores as unknown fields, are joined until they parse as one JSON object,
    which is then returned like an event's data; what never parses is dropped at the
    event limit, as an overlong event would be."""

    raw_json = True

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self._raw: list[bytes] = []
        self._raw_bytes = 0

    def _raw_line(self, line: bytes, out: list[bytes]) -> None:
        self._raw.append(line)
        self._raw_bytes += len(line)
        if self._raw_bytes > self._max:
            self._raw, self._raw_bytes = [], 0
            self._overflow()
        if not line.rstrip().endswith((b"}", b"]")):
            return
        joined = b"\n".join(self._raw)
        try:
            obj = orjson.loads(joined)
        except orjson.JSONDecodeError:
            return
        self._raw, self._raw_bytes = [], 0
        if isinstance(obj, list) and len(obj) == 1:  # the JSON-array form of a stream
            obj = obj[0]
        if isinstance(obj, dict):
            out.append(orjson.dumps(obj))


def event_stream(
    response: httpx2.Response, media_type: str = "text/event-stream"
) -> httpx2.AsyncByteStream:
    """The body of a streaming answer, after checking that it is an event stream (or
    ``media_type``: Bedrock's AWS event stream)."""
    content_type = response.headers.get("content-type", "").partition(";")[0].strip()
    if media_type not in content_type.lower():
        raise UpstreamFailure(
            "The upstream answered a streaming request without an event stream "
            f"(Content-Type {content_type!r}).",
            code="upstream_bad_response",
        )
    body = response.stream
    assert isinstance(body, httpx2.AsyncByteStream)
    return body


async def aiter_data(
    response: httpx2.Response, max_event_bytes: int = MAX_EVENT_BYTES
) -> AsyncIterator[bytes]:
    """Yield the ``data`` of each event; events without data (pings) are skipped."""
    decoder = SSEDecoder(max_event_bytes)
    async for chunk in event_stream(response):
        for data in decoder.feed(chunk):
            yield data
