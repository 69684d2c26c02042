"""Just enough HTTP/1.1 for a server whose bytes on the wire must be exact.

The chaos upstream does not sit on uvicorn on purpose: it closes chunked bodies
without their last chunk, resets sockets mid-body and splits UTF-8 characters
across writes, none of which a conforming server lets an application do.

Supported: request line, headers, a Content-Length or chunked request body,
keep-alive (HTTP/1.1 default, ``Connection: close`` honoured). Not supported:
``Expect: 100-continue``, request trailers, upgrades.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEADERS = 100
MAX_BODY = 64 << 20
LAST_CHUNK = b"0\r\n\r\n"


class BadRequest(Exception):
    """The client sent something that is not an HTTP/1.1 request we can read."""


@dataclass
class Request:
    method: str
    path: str  # the target without its query
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    query: str = ""
    dialect: str = ""  # a cloud's door (clouds.py): bedrock, vertex, azure

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("line too long") from None
    return line.rstrip(b"\r\n")


async def read_request(
    reader: asyncio.StreamReader, idle_timeout: float, read_timeout: float
) -> Request | None:
    """The next request on a connection, or None if the client closed it (or idled out)."""
    try:
        async with asyncio.timeout(idle_timeout):
            line = await _read_line(reader)
            for _ in range(4):  # RFC 9112 2.2: skip stray empty lines before a request
                if line:
                    break
                line = await _read_line(reader)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("incomplete request line") from None
        return None
    except TimeoutError:
        return None
    async with asyncio.timeout(read_timeout):
        return await _read_rest(reader, line)


async def _read_rest(reader: asyncio.StreamReader, request_line: bytes) -> Request:
    parts = request_line.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(f"malformed request line {request_line[:100]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = await _read_line(reader)
        if not line:
            break
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"malformed header line {line[:100]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    else:
        raise BadRequest("too many headers")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise BadRequest("invalid content-length") from None
        if not 0 <= length <= MAX_BODY:
            raise BadRequest("content-length out of range")
        body = await reader.readexactly(length)
    path, _, query = target.partition("?")
    return Request(method, path, version, headers, body, query)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await _read_line(reader)
        try:
            size = int(size_line.partition(b";")[0].strip(), 16)
        except ValueError:
            raise BadRequest("invalid chunk size") from None
        if size == 0:
            break
        total += size
        if size < 0 or total > MAX_BODY:
            raise BadRequest("chunked body too large")
        parts.append(await reader.readexactly(size))
        if await _read_line(reader):
            raise BadRequest("chunk not followed by CRLF")
    for _ in range(MAX_HEADERS):  # trailers, ignored
        if not await _read_line(reader):
            return b"".join(parts)
    raise BadRequest("too many trailers")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Site Overloaded" if status == 529 else "Unknown"


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_reason(status)}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_response(
    status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), close: bool = False
) -> bytes:
    fields = [("content-type", "application/json"), ("content-length", str(len(body)))]
    fields += headers
    if close:
        fields.append(("connection", "close"))
    return response_head(status, fields) + body


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: an empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


SSE_HEAD = response_head(
    200,
    [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("transfer-encoding", "chunked"),
    ],
)
