"""What the abuse suite's raw upstream answers: bytes the chaos upstream cannot send.

The model name picks the answer (the gateway routes ``raw-*`` here):

- ``raw-hugeline-N``: a role chunk, ``Hello``, then one line of ``huge_line``
  bytes with no line end; a continuation (a request that carries an assistant
  message) gets `` world``, a finish and ``[DONE]``;
- ``raw-flood-N``: content deltas of ``FLOOD_DELTA`` bytes, as fast as the socket
  takes them, ``flood_bytes`` in all, then a finish and ``[DONE]``;
- ``raw-utf8``: content deltas holding invalid UTF-8 (``UTF8_DELTAS``);
- ``raw-401``: a 401 whose body and ``www-authenticate`` header quote the
  ``Authorization`` the gateway sent (the upstream key);
- ``raw-inband-key``: ``Hi``, then an in-band error event that quotes the key.

Any other request (a pass-through path) gets a 200 JSON document naming the path
it arrived on, so a relayed request is visible as relayed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from probes.abuse.net import RawRequest

FLOOD_DELTA = 32 * 1024
MB = 1024 * 1024
UTF8_DELTAS = (
    b"caf\xc3\xa9 fine",  # valid: unchanged
    b"lone \xff byte",
    b"cut \xe2\x82 sequence",
    b"surrogate \xed\xa0\x80 half",
    b"overlong \xc0\xaf slash",
    b"tail \xf0\x9f",
)


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def chunk_bytes(delta: bytes, finish: str | None = None) -> bytes:
    """A chat.completion.chunk event whose delta is the raw JSON object ``delta``."""
    reason = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (
        b'data: {"id":"chatcmpl-raw","object":"chat.completion.chunk","created":1,'
        b'"model":"raw","choices":[{"index":0,"delta":'
        + delta
        + b',"finish_reason":'
        + reason
        + b"}]}\n\n"
    )


def content(text: bytes) -> bytes:
    """A content delta with ``text`` put into the JSON string as is (no re-encoding)."""
    return chunk_bytes(b'{"content":"' + text + b'"}')


ROLE = chunk_bytes(b'{"role":"assistant","content":""}')
STOP = chunk_bytes(b"{}", "stop")
DONE = b"data: [DONE]\n\n"


def json_response(status: int, body: Any, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    data = orjson.dumps(body)
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
        f"\r\nconnection: close\r\n{extra}\r\n"
    ).encode("latin-1") + data


@dataclass(frozen=True)
class RawAnswers:
    huge_line: int  # bytes of the line without an end (probe 2)
    flood_bytes: int  # bytes of content in a flood stream (probe 3)

    def __call__(self, request: RawRequest) -> Iterator[bytes]:
        payload = request.json
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str) or not model.startswith("raw-"):
            yield json_response(200, {"object": "raw", "path": request.path})
            return
        key = request.headers.get("authorization", "")
        if model == "raw-401":
            message = f"Incorrect API key provided: {key}. You can find your key elsewhere."
            error = {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}
            yield json_response(401, {"error": error}, (("www-authenticate", f'Bearer "{key}"'),))
            return
        if request.path.endswith("/chat/completions"):
            yield from self._chat(model, payload, key)
            return
        yield json_response(404, {"error": {"message": "unknown", "type": "invalid_request_error"}})

    def _chat(self, model: str, payload: Any, key: str) -> Iterator[bytes]:
        messages = payload.get("messages") if isinstance(payload, dict) else None
        continuation = isinstance(messages, list) and any(
            isinstance(m, dict) and m.get("role") == "assistant" for m in messages
        )
        yield sse_head()
        yield ROLE
        if model.startswith("raw-hugeline"):
            if continuation:
                yield content(b" world")
            else:
                yield content(b"Hello")
                yield b"data: " + b'{"choices":[{"delta":{"content":"'
                piece = b"x" * MB
                left = self.huge_line
                while left > 0:
                    yield piece[: min(left, MB)]
                    left -= MB
                return  # the gateway should have hung up long before
        elif model.startswith("raw-flood"):
            delta = content(b"a" * FLOOD_DELTA)
            for _ in range(max(1, self.flood_bytes // FLOOD_DELTA)):
                yield delta
        elif model == "raw-utf8":
            for text in UTF8_DELTAS:
                yield content(text)
        elif model == "raw-inband-key":
            yield content(b"Hi")
            message = f"Your key {key} was revoked; contact support."
            error = {"message": message, "type": "invalid_request_error", "code": "revoked_key"}
            yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
            return
        else:
            yield content(b"unknown raw model")
        yield STOP
        yield DONE
