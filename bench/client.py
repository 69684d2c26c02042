"""The benchmark client: keep-alive HTTP/1.1 connections that time every content delta.

Light on purpose (raw asyncio streams on uvloop, one orjson parse per SSE data
line), so the client is not what a benchmark measures. A ``Connection`` sends one
request at a time and is reused, as an SDK client's pool would; it reconnects
when the server closed it or a request failed.

A connection to a ``/responses`` path reads the Responses API: a content delta is
a ``response.output_text.delta`` event, the end is ``response.completed``, and
an ``error`` or ``response.failed`` event is the request's error. One to a
``/messages`` path reads the Anthropic Messages API: a content delta is a
``content_block_delta`` whose delta is a non-empty ``text_delta`` (thinking and
tool-input deltas are not counted), the end is ``message_stop``, and an
``error`` event is the request's error. One to a Gemini path
(``/v1beta/models/{model}:streamGenerateContent?alt=sse``, the model filled in per
request) reads the Gemini API: a content delta is a chunk with a non-empty text part
that is not a thought, the end is the chunk with a ``finishReason``, and an ``error``
(Google's raw error object after the events, or a ``data:`` event) is the request's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

TIMEOUT = 60.0
STALE = "IncompleteReadError: 0 bytes read"  # closed before any byte of a response


@dataclass
class Result:
    """One request: when it was sent, when each content delta arrived, and what went wrong."""

    started: float
    times: list[float] = field(default_factory=list)  # perf_counter of each content delta
    done: bool = False  # [DONE] (streams) or a whole completion arrived
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.times[0] - self.started if self.times else None

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    def check(self, deltas: int) -> None:
        """Mark the result failed unless all ``deltas`` content deltas and the end arrived."""
        if self.error is None and not self.done:
            self.error = "the response ended early"
        elif self.error is None and len(self.times) != deltas:
            self.error = f"{len(self.times)} of {deltas} content deltas"


def has_content(chunk: dict[str, object]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content"))


RESPONSES_DELTA = "response.output_text.delta"
RESPONSES_DONE = "response.completed"
RESPONSES_FAILED = frozenset({"error", "response.failed", "response.incomplete"})


def responses_event(event: dict[str, object], result: Result) -> None:
    """Note one Responses event in ``result``: a text delta, the end, or a failure."""
    kind = event.get("type")
    if kind == RESPONSES_DELTA:
        if event.get("delta"):
            result.times.append(time.perf_counter())
    elif kind == RESPONSES_DONE:
        result.done = True
    elif kind in RESPONSES_FAILED and result.error is None:
        result.error = f"{kind}: {orjson.dumps(event)[:200].decode(errors='replace')}"


def responses_text(document: dict[str, Any]) -> str:
    """The output text of a whole (non-streamed) Response object."""
    text = ""
    for item in document.get("output") or ():
        for part in item.get("content") or ():
            if part.get("type") == "output_text":
                text += part.get("text") or ""
    return text


MESSAGES_DELTA = "content_block_delta"
MESSAGES_DONE = "message_stop"
MESSAGES_FAILED = "error"


def messages_event(event: dict[str, Any], result: Result) -> None:
    """Note one Messages event in ``result``: a text delta, the end, or a failure."""
    kind = event.get("type")
    if kind == MESSAGES_DELTA:
        delta = event.get("delta")
        if type(delta) is dict and delta.get("type") == "text_delta" and delta.get("text"):
            result.times.append(time.perf_counter())
    elif kind == MESSAGES_DONE:
        result.done = True
    elif kind == MESSAGES_FAILED and result.error is None:
        result.error = f"{kind}: {orjson.dumps(event)[:200].decode(errors='replace')}"


def messages_text(document: dict[str, Any]) -> str:
    """The text of a whole (non-streamed) Message object."""
    text = ""
    for block in document.get("content") or ():
        if block.get("type") == "text":
            text += block.get("text") or ""
    return text


GEMINI_METHODS = (":streamGenerateContent", ":generateContent")


def gemini_chunk(chunk: dict[str, Any], result: Result) -> None:
    """Note one Gemini chunk in ``result``: a text delta, the end, or a failure."""
    if "error" in chunk:
        if result.error is None:
            result.error = f"error: {orjson.dumps(chunk)[:200].decode(errors='replace')}"
        return
    candidates = chunk.get("candidates")
    if type(candidates) is not list or not candidates:
        return
    candidate = candidates[0]
    parts = (candidate.get("content") or {}).get("parts") or ()
    if any(p.get("text") and p.get("thought") is not True for p in parts):
        result.times.append(time.perf_counter())
    if candidate.get("finishReason"):
        result.done = True


def gemini_text(document: dict[str, Any]) -> str:
    """The text (not thoughts) of a whole (non-streamed) GenerateContentResponse."""
    candidates = document.get("candidates") or [{}]
    parts = (candidates[0].get("content") or {}).get("parts") or ()
    return "".join(p.get("text") or "" for p in parts if p.get("thought") is not True)


class Connection:
    """``path`` may hold ``{model}`` (a Gemini path): each request then names its model."""

    def __init__(self, host: str, port: int, path: str, headers: dict[str, str]) -> None:
        self._host, self._port, self._path = host, port, path
        self._responses = path.rstrip("/").endswith("/responses")
        self._messages = path.rstrip("/").endswith("/messages")
        self._gemini = any(method in path for method in GEMINI_METHODS)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._rest = (
            f"host: {host}:{port}\r\ncontent-type: application/json\r\n{extra}content-length: "
        ).encode()
        self._head = self._start(path)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def _start(self, path: str) -> bytes:
        return f"POST {path} HTTP/1.1\r\n".encode() + self._rest

    async def connect(self) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def request(self, body: bytes, *, stream: bool, model: str | None = None) -> Result:
        """Send one request; never raises (a failure is the result's ``error``).

        ``model`` fills a Gemini path's ``{model}`` (other paths ignore it).

        As an SDK's pool does, a kept-alive connection the server has closed while
        it idled (uvicorn closes them after 5 s) is replaced, and a request whose
        reused connection turns out closed before any response byte is sent again.
        """
        if self._reader is not None and self._reader.at_eof():
            await self.close()
        reused = self._writer is not None
        head = self._head
        if model is not None and "{model}" in self._path:
            head = self._start(self._path.format(model=model))
        result = await self._attempt(head, body, stream)
        if reused and result.error is not None and result.error.startswith(STALE):
            result = await self._attempt(head, body, stream)
        return result

    async def _attempt(self, head: bytes, body: bytes, stream: bool) -> Result:
        result = Result(time.perf_counter())
        try:
            async with asyncio.timeout(TIMEOUT):
                await self.connect()
                assert self._reader is not None and self._writer is not None
                result.started = time.perf_counter()
                self._writer.write(head + b"%d\r\n\r\n%b" % (len(body), body))
                keep = await self._response(self._reader, result, stream)
        except Exception as exc:  # noqa: BLE001 - a failed request is a counted error
            result.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            keep = False
        if not keep:
            await self.close()
        return result

    async def _response(self, reader: asyncio.StreamReader, result: Result, stream: bool) -> bool:
        """Read one response into ``result``; True if the connection can be reused."""
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        status = head.split(b" ", 2)[1]
        keep = b"\r\nconnection: close" not in head
        if b"\r\ntransfer-encoding: chunked" in head:
            body = _chunked(reader)
        else:
            at = head.index(b"\r\ncontent-length:") + 17
            body = _whole(reader, int(head[at : head.index(b"\r\n", at)]))
        if status != b"200":
            content = b"".join([part async for part in body])
            result.error = f"HTTP {status.decode()}: {content[:200].decode(errors='replace')}"
            return keep
        if not stream:
            document = orjson.loads(b"".join([part async for part in body]))
            if self._responses:
                text = responses_text(document) if document.get("status") == "completed" else ""
            elif self._messages:
                text = messages_text(document) if document.get("stop_reason") else ""
            elif self._gemini:
                finished = (document.get("candidates") or [{}])[0].get("finishReason")
                text = gemini_text(document) if finished else ""
            else:
                text = document["choices"][0]["message"]["content"]
            if text:
                result.times.append(time.perf_counter())
                result.done = True
            return keep
        pending, raw = b"", b""  # raw: Gemini's error object, which is not an event
        async for part in body:
            *lines, pending = (pending + part).split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    if self._gemini and line.strip() and not line.startswith(b":"):
                        raw += line.strip()
                    continue
                data = line[5:].strip()
                if self._gemini:
                    gemini_chunk(orjson.loads(data), result)
                elif self._responses:
                    responses_event(orjson.loads(data), result)
                elif self._messages:
                    messages_event(orjson.loads(data), result)
                elif data == b"[DONE]":
                    result.done = True
                elif has_content(orjson.loads(data)):
                    result.times.append(time.perf_counter())
        raw += pending.strip() if self._gemini else b""
        if raw and result.error is None:
            result.error = f"error object: {raw[:200].decode(errors='replace')}"
        return keep


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return
        yield data[:-2]


async def _whole(reader: asyncio.StreamReader, length: int) -> AsyncIterator[bytes]:
    yield await reader.readexactly(length)
