"""Bedrock's answer: AWS event stream frames (``application/vnd.amazon.eventstream``), each
``chunk`` carrying one Messages event in base64, decoded into those events by botocore's
decoder; an exception frame (throttling, a model stream error, service unavailable)
becomes the Anthropic ``error`` event it means, so recovery reads it as it reads
Anthropic's (``providers.py``: the ``bedrock`` kind). botocore is imported only when a
Bedrock upstream's answer is decoded."""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

import httpx2
import orjson

from gateway.upstream.sse import MAX_EVENT_BYTES, EventTooLarge

FRAME_OVERHEAD = 4096  # a frame's prelude, headers, CRC and the JSON around its base64

# A Bedrock exception frame as the Anthropic error it means (recovery's classify reads
# the type: overloaded and API errors are transient, an invalid request is not).
BEDROCK_ERRORS = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
    "modelTimeoutException": "api_error",
    "validationException": "invalid_request_error",
}


class EventStreamDecoder:
    """AWS event stream frames to the Messages events their chunks carry (botocore's
    decoder: it checks each frame's lengths and CRCs). A frame still arriving is bounded
    as an SSE event is, by ``limits.max_event_bytes``, allowing for its event's base64
    (4/3 of it) and the frame's headers; botocore alone would wait for up to 24 MiB."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        from botocore.eventstream import EventStreamBuffer

        self._buffer = EventStreamBuffer()
        self._max = max_event_bytes * 4 // 3 + FRAME_OVERHEAD
        self._pending = 0  # bytes fed that no whole frame has consumed yet

    def feed(self, chunk: bytes) -> list[bytes]:
        from botocore.eventstream import ParserError

        self._buffer.add_data(chunk)
        self._pending += len(chunk)
        out = []
        try:
            for message in self._buffer:
                self._pending -= message.prelude.total_length
                payload = _payload(message.headers, message.payload)
                if payload is not None:
                    out.append(payload)
        except (ParserError, struct.error, KeyError, UnicodeDecodeError, ValueError) as exc:
            # A broken frame (or one botocore cannot read): the stream is broken.
            raise httpx2.RemoteProtocolError(f"bad AWS event stream frame: {exc!r}") from None
        if self._pending > self._max:
            raise EventTooLarge(
                f"an AWS event stream frame outgrew {self._max} bytes (limits.max_event_bytes)"
            )
        return out


def _payload(headers: Mapping[str, Any], payload: bytes) -> bytes | None:
    """One frame's Messages event (or the Anthropic error it means); None for a frame
    that carries no part of the answer."""
    kind = headers.get(":message-type")
    if kind == "event":
        if headers.get(":event-type") != "chunk":
            return None
        try:
            return base64.b64decode(orjson.loads(payload)["bytes"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return payload  # not a chunk as documented: malformed
    name = str(headers.get(":exception-type") or headers.get(":error-code") or "unknown")
    message = headers.get(":error-message")  # an error frame's; an exception's is its payload
    if message is None:
        try:
            message = orjson.loads(payload).get("message")
        except (orjson.JSONDecodeError, AttributeError):
            message = None
    kind_of = BEDROCK_ERRORS.get(name, "api_error")
    text = f"{message or 'Bedrock stream error'} ({name})"
    return orjson.dumps({"type": "error", "error": {"type": kind_of, "message": text}})
