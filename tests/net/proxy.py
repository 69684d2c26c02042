"""A forward HTTP proxy on loopback, for the tests of upstream egress through one.

It speaks the two forms an HTTP client uses with a proxy:

- ``CONNECT host:port`` (for ``https://`` upstreams): ``200``, then a byte tunnel,
  both ways, each read passed on at once;
- absolute-form ``POST http://host:port/path`` (for ``http://`` upstreams): the
  request goes on in origin-form with ``Connection: close``, and the response
  comes back as it arrives (an SSE stream is not buffered), with ``Connection:
  close`` in its head: one request per client connection.

A FIN from one side is passed on as a FIN (a half-close), a RST as a RST, so the
chaos upstream's ``close`` and ``reset`` faults reach the client through it.

With ``credentials`` it wants ``Proxy-Authorization: Basic ...`` and answers ``407``
with ``Proxy-Authenticate: Basic`` without them. ``mode`` makes it misbehave:
``refuse`` answers every request ``403``, ``drop`` closes the connection without an
answer. ``requests`` records every request head it read, answered or not, as
``(method, target, proxy-authorization or None)``. With ``ssl`` it is an
``https://`` proxy (TLS between the client and the proxy).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import struct
import urllib.parse
from ssl import SSLContext
from typing import Any, Literal, NamedTuple

logger = logging.getLogger("tests.net.proxy")

ProxyMode = Literal["forward", "refuse", "drop"]
Ending = Literal["eof", "reset"]

READ_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "upgrade"}
)


class ProxiedRequest(NamedTuple):
    method: str  # CONNECT, GET, POST, ...
    target: str  # "host:port" for CONNECT, the absolute URL otherwise
    authorization: str | None  # the Proxy-Authorization header as sent


class _Head(NamedTuple):
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]


def _response(status: int, reason: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", *headers]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def _parse_head(head: bytes) -> _Head | None:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        return None
    headers: list[tuple[str, str]] = []
    for line in lines:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                return None
            headers.append((name.strip(), value.strip()))
    return _Head(parts[0], parts[1], parts[2], headers)


def _header(head: _Head, name: str) -> str | None:
    return next((value for key, value in head.headers if key.lower() == name), None)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP RST, as the other side did."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> Ending:
    """Pass ``source``'s bytes to ``sink`` as they come, until EOF (``eof``) or an error
    on either side (``reset``)."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        return "reset"
    return "eof"


class ForwardProxy:
    """The proxy. ``start()`` binds (port 0: a free port); ``aclose()`` drops every connection."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: tuple[str, str] | None = None,
        mode: ProxyMode = "forward",
        ssl: SSLContext | None = None,
    ) -> None:
        self.host = host
        self._port = port
        self.credentials = credentials
        self.mode: ProxyMode = mode  # may be changed while it runs
        self._ssl = ssl
        self.requests: list[ProxiedRequest] = []
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], list[asyncio.StreamWriter]] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self._port, ssl=self._ssl)
        self._port = self._server.sockets[0].getsockname()[1]

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with ``ssl``), without credentials."""
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def url_with_credentials(self) -> str:
        """The URL with ``user:password@`` when the proxy wants credentials."""
        if self.credentials is None:
            return self.url
        user, password = (urllib.parse.quote(part, safe="") for part in self.credentials)
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{user}:{password}@{rest}"

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task, writers in list(self._connections.items()):
            for writer in writers:
                writer.transport.abort()
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _authorized(self, authorization: str | None) -> bool:
        if self.credentials is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        return decoded == ":".join(self.credentials)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        writers = self._connections[task] = [writer]
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                raw = await reader.readuntil(b"\r\n\r\n")
            head = _parse_head(raw[:-4])
            if head is None:
                writer.write(_response(400, "Bad Request"))
                return
            authorization = _header(head, "proxy-authorization")
            self.requests.append(ProxiedRequest(head.method, head.target, authorization))
            if self.mode == "drop":
                return
            if self.mode == "refuse":
                writer.write(_response(403, "Forbidden", body=b"refused by the test proxy\n"))
            elif not self._authorized(authorization):
                challenge = 'Proxy-Authenticate: Basic realm="test-proxy"'
                writer.write(_response(407, "Proxy Authentication Required", challenge))
            elif head.method == "CONNECT":
                await self._tunnel(head, reader, writer, writers)
            else:
                await self._forward(head, reader, writer, writers)
        except (
            ConnectionError,
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        except asyncio.CancelledError:
            pass  # only aclose() cancels, and waits; 3.11 would log it as an error
        except Exception:
            logger.exception("test proxy: unexpected error; connection closed")
        finally:
            del self._connections[task]
            for open_writer in writers:
                open_writer.close()

    async def _open(
        self, host: str, port: int, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                return await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            writer.write(_response(502, "Bad Gateway", body=b"upstream unreachable\n"))
            return None

    async def _tunnel(
        self,
        head: _Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        writers: list[asyncio.StreamWriter],
    ) -> None:
        host, _, port = head.target.rpartition(":")
        if not host or not port.isdigit():
            writer.write(_response(400, "Bad Request"))
            return
        opened = await self._open(host.strip("[]"), int(port), writer)
        if opened is None:
            return
        up_reader, up_writer = opened
        writers.append(up_writer)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _splice(reader, writer, up_reader, up_writer)

    async def _forward(
        self,
        head: _Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        writers: list[asyncio.StreamWriter],
    ) -> None:
        url = urllib.parse.urlsplit(head.target)
        if url.scheme != "http" or not url.hostname:
            writer.write(_response(400, "Bad Request", body=b"absolute http:// URL expected\n"))
            return
        opened = await self._open(url.hostname, url.port or 80, writer)
        if opened is None:
            return
        up_reader, up_writer = opened
        writers.append(up_writer)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        lines = [f"{head.method} {target} {head.version}"]
        lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in _HOP_BY_HOP]
        lines += ["Connection: close", "", ""]
        up_writer.write("\r\n".join(lines).encode("latin-1"))
        await up_writer.drain()
        # The request body goes on as it comes; the response is the one that ends the exchange.
        body = asyncio.create_task(_relay(reader, up_writer))
        try:
            ending = await _relay_response(up_reader, writer)
        finally:
            body.cancel()
            await asyncio.gather(body, return_exceptions=True)
        if ending == "reset":
            _rst(writer)


async def _relay_response(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> Ending:
    """The upstream's response: its head with ``Connection: close``, then its body as it comes."""
    try:
        raw = await source.readuntil(b"\r\n\r\n")
    except (ConnectionError, OSError):
        return "reset"
    except asyncio.IncompleteReadError as exc:
        sink.write(exc.partial)
        return "eof"
    status, *lines = raw[:-4].decode("latin-1").split("\r\n")
    kept = [line for line in lines if line.partition(":")[0].strip().lower() not in _HOP_BY_HOP]
    sink.write("\r\n".join([status, *kept, "Connection: close", "", ""]).encode("latin-1"))
    return await _relay(source, sink)


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Relay both ways until both ends are done: a FIN goes on as a FIN (the other way
    may still carry bytes), a RST (or any error) drops both ends with a RST."""
    pending = {
        asyncio.create_task(_relay(reader, up_writer)): up_writer,
        asyncio.create_task(_relay(up_reader, writer)): writer,
    }
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                sink = pending.pop(task)
                if task.result() == "reset":
                    _rst(writer)
                    _rst(up_writer)
                    return
                if sink.can_write_eof():
                    with contextlib.suppress(OSError):
                        sink.write_eof()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
