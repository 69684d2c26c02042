"""HTTP/1.1 to upstreams: an httpx transport on asyncio protocols and httptools.

httpx stays the gateway's HTTP API (requests, responses, timeouts, errors); this
replaces its default engine, httpcore, under it. At 256 concurrent streams
httpcore's read path (h11, anyio, a timeout scope per read) and its pool (which
scans every connection on each request, encode/httpcore#1035) took about 70% of
the gateway's CPU (BENCHMARKS.md, "Profile"). Here:

- a connection is an ``asyncio.Protocol``: httptools (C, the parser uvicorn uses)
  parses the response as bytes arrive, and the body waits in a list until read;
- the read timeout is one timer per connection, re-armed when it fires, not a
  scope per read: it fires only when nothing arrived for ``timeout["read"]``
  while the reader was waiting;
- the pool keeps idle connections per origin, most recent first: taking one and
  giving it back is O(1).

It speaks what the gateway sends upstream: one request at a time per
connection, with a body of known length; responses with Content-Length, chunked
or until-close bodies; directly, or through an ``http://`` forward proxy (a
``CONNECT`` tunnel, then TLS over it, for an https upstream; absolute-form
requests for an http one). Errors are httpx's: ``ConnectError``/``ConnectTimeout``,
``ProxyError`` (a tunnel refused), ``ReadError`` (reset), ``ReadTimeout``
(silence), ``RemoteProtocolError`` (a broken or incomplete response), ``PoolTimeout``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast

import httptools
import httpx

KEEPALIVE_EXPIRY = 5.0  # seconds an idle connection is kept (httpx's default)
HIGH_WATER = 256 * 1024  # unread body bytes before the socket stops being read

Origin = tuple[bytes, bytes, int]
MAX_TUNNEL_HEAD = 64 * 1024  # a proxy's answer to CONNECT, at most
_DEFAULT_PORTS = {b"http": 80, b"https": 443}


class Http1Transport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        tls: ssl.SSLContext,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        proxy: httpx.URL | None = None,
    ) -> None:
        """``proxy``: an ``http://`` forward proxy every connection goes through: a
        ``CONNECT`` tunnel for an https origin, absolute-form requests for an http one;
        its URL's credentials go as ``Proxy-Authorization``."""
        self._tls = tls
        self._proxy_auth: bytes | None = None
        if proxy is not None and proxy.username:
            userinfo = f"{proxy.username}:{proxy.password}".encode()
            self._proxy_auth = b"Basic " + base64.b64encode(userinfo)
            proxy = proxy.copy_with(username=None, password=None)  # kept only as the header
        self._proxy = proxy
        self._max_idle = max_keepalive_connections
        self._expiry = keepalive_expiry
        self._slots = asyncio.Semaphore(max_connections)  # requests in flight
        self._idle: dict[Origin, deque[_Connection]] = {}  # oldest first
        self._open: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = self._origin(url)
        # Through a proxy, an http origin is asked in absolute form, with the credentials.
        forwarded = self._proxy is not None and url.raw_scheme == b"http"
        head = _head(request, self._proxy_auth if forwarded else None, absolute=forwarded)
        body = await request.aread()
        return await self._send(
            origin, request.method, head + body, request.extensions.get("timeout", {})
        )

    def target(self, method: str, url: httpx.URL) -> Target:
        """What ``request`` needs of ``method`` and ``url``, worked out once (the gateway
        keeps one per upstream and path): the origin, the request line and ``Host``."""
        origin = self._origin(url)
        forwarded = self._proxy is not None and url.raw_scheme == b"http"
        start = [_request_line(method.encode("ascii"), url, absolute=forwarded)]
        if forwarded and self._proxy_auth is not None:
            start.append(b"Proxy-Authorization: %s\r\n" % self._proxy_auth)
        return Target(origin, method, b"".join(start), b"Host: %s\r\n" % url.netloc)

    async def request(
        self,
        target: Target,
        headers: Mapping[str, str],
        content: bytes,
        timeouts: Mapping[str, float | None],
    ) -> httpx.Response:
        """``handle_async_request`` without an ``httpx.Request``: the head goes from
        ``target`` and ``headers`` straight to bytes (building the request and its
        ``Headers`` cost a request start more than the rest of the engine)."""
        lines = [target.start]
        if "host" not in headers:  # else configured for the upstream (a virtual host)
            lines.append(target.host)
        for name, value in headers.items():
            raw = value.encode("latin-1")  # what a header can carry (a client's, unchanged)
            if b"\r" in raw or b"\n" in raw or b"\0" in raw:  # would end the line: smuggling
                raise httpx.LocalProtocolError(f"Illegal character in header {name!r}.")
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), raw))
        lines.append(b"Content-Length: %d\r\n\r\n" % len(content))
        lines.append(content)
        return await self._send(target.origin, target.method, b"".join(lines), timeouts)

    def _origin(self, url: httpx.URL) -> Origin:
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"Unsupported URL scheme {url.scheme!r}.")
        return (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])

    async def _send(
        self, origin: Origin, method: str, data: bytes, timeouts: Mapping[str, float | None]
    ) -> httpx.Response:
        if self._slots.locked():  # a wait, with its own deadline, only when there is one
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout(
                    "No upstream connection slot became free in time."
                ) from None
        else:
            await self._slots.acquire()
        try:
            connection = self._checkout(origin) or await self._connect(
                origin, timeouts.get("connect")
            )
            return await connection.send(method, data, timeouts.get("read"))
        except BaseException:
            self._slots.release()
            raise

    def _checkout(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < self._expiry:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, within: float | None) -> _Connection:
        connection = _Connection(self, origin)
        try:
            async with asyncio.timeout(within):
                # In a context of its own: the transport keeps the context it was made
                # in for the connection's life, and this one would be the request's (its
                # run, prompt and answer held as long as the connection idles in the pool).
                await asyncio.get_running_loop().create_task(
                    self._open_connection(connection, origin), context=contextvars.Context()
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("Timed out connecting to the upstream.") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS (ssl.SSLError)
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        self._open.add(connection)
        return connection

    async def _open_connection(self, connection: _Connection, origin: Origin) -> None:
        scheme, raw_host, port = origin
        host = raw_host.decode("ascii")
        loop = asyncio.get_running_loop()
        tls = self._tls if scheme == b"https" else None
        if self._proxy is None:
            await loop.create_connection(
                lambda: connection, host, port, ssl=tls, server_hostname=host if tls else None
            )
            return
        proxy_port = self._proxy.port or _DEFAULT_PORTS[self._proxy.raw_scheme]
        if tls is None:  # forwarded by the proxy: the connection is to the proxy
            await loop.create_connection(lambda: connection, self._proxy.host, proxy_port)
            return
        tunnel = _Tunnel()
        transport, _ = await loop.create_connection(lambda: tunnel, self._proxy.host, proxy_port)
        try:
            bracketed = b"[%s]" % raw_host if b":" in raw_host else raw_host  # IPv6
            authority = b"%s:%d" % (bracketed, port)
            lines = [b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (authority, authority)]
            if self._proxy_auth is not None:
                lines.append(b"Proxy-Authorization: %s\r\n" % self._proxy_auth)
            transport.write(b"".join(lines) + b"\r\n")
            status = await tunnel.established
            if not 200 <= status < 300 or tunnel.garbled:
                raise httpx.ProxyError(f"The proxy refused the tunnel ({status}).")
            secured = await loop.start_tls(transport, connection, tls, server_hostname=host)
        except BaseException:
            transport.abort()
            raise
        assert secured is not None
        connection.connection_made(secured)

    def _released(self, connection: _Connection, reusable: bool) -> None:
        """A response was closed: keep its connection for the next request, or close it."""
        self._slots.release()
        if not reusable:
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, deque())
        now = connection.idle_since = asyncio.get_running_loop().time()
        while idle and (idle[0].closed or now - idle[0].idle_since >= self._expiry):
            idle.popleft().close()
        if len(idle) >= self._max_idle:
            idle.popleft().close()
        idle.append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close(abort=True)
        self._idle.clear()


@dataclass(frozen=True, slots=True)
class Target:
    """A method and URL, for ``Http1Transport.request``: the connection's origin, and
    the head's first lines (request line, a proxy's credentials) and ``Host``."""

    origin: Origin
    method: str
    start: bytes
    host: bytes


def _request_line(method: bytes, url: httpx.URL, *, absolute: bool) -> bytes:
    target = url.raw_path
    if absolute:  # to a forward proxy: the whole URL
        target = b"%s://%s%s" % (url.raw_scheme, url.netloc, url.raw_path)
    return b"%s %s HTTP/1.1\r\n" % (method, target)


def _head(
    request: httpx.Request, proxy_authorization: bytes | None = None, *, absolute: bool = False
) -> bytes:
    lines = [_request_line(request.method.encode("ascii"), request.url, absolute=absolute)]
    if proxy_authorization is not None:
        lines.append(b"Proxy-Authorization: %s\r\n" % proxy_authorization)
    for name, value in request.headers.raw:
        # httpx checks names; a value must not end the header line (request smuggling).
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise httpx.LocalProtocolError(f"Illegal character in header {name.decode()!r}.")
        lines.append(b"%s: %s\r\n" % (name, value))
    lines.append(b"\r\n")
    return b"".join(lines)


class _Tunnel(asyncio.Protocol):
    """The proxy's answer to a ``CONNECT``: its status, once its head has arrived."""

    def __init__(self) -> None:
        self.established: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.garbled = False  # it said more than its answer: no tunnel to speak TLS through
        self._received = b""

    def data_received(self, data: bytes) -> None:
        if self.established.done():
            self.garbled = True  # bytes after its answer, before TLS began
            return
        self._received += data
        head, end, rest = self._received.partition(b"\r\n\r\n")
        if end:
            status_line = head.split(b"\r\n", 1)[0].split()
            ok = len(status_line) >= 2 and status_line[1].isdigit() and not rest
            self.established.set_result(int(status_line[1]) if ok else 0)
        elif len(self._received) > MAX_TUNNEL_HEAD:
            self.established.set_result(0)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.established.done():
            self.established.set_exception(
                httpx.ProxyError("The proxy closed the connection before the tunnel was up.")
            )


class _Connection(asyncio.Protocol):
    """One upstream connection: one request at a time, its response parsed as it arrives."""

    def __init__(self, pool: Http1Transport, origin: Origin) -> None:
        self.origin = origin
        self.closed = False
        self.idle_since = 0.0
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # The parser holds this protocol's callbacks: dropped when the connection is
        # lost, so that a closed connection is not a cycle left for the collector.
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._status = 0
        # The response in progress:
        self._head: asyncio.Future[None] | None = None
        self._no_body = False  # a response to HEAD
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._framed = False  # Content-Length or chunked; else the body ends with the connection
        self._chunks: list[bytes] = []  # body received, not yet read
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last = 0.0  # loop time of the last byte received
        self._read_timeout: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- the request ------------------------------------------------------------------

    async def send(self, method: str, data: bytes, read_timeout: float | None) -> httpx.Response:
        assert self._transport is not None
        self._head = self._loop.create_future()
        self._no_body = method == "HEAD"
        self._reason, self._headers, self._chunks = b"", [], []
        self._buffered, self._framed, self._complete, self._keep_alive = 0, False, False, False
        self._error = None
        self._last = self._loop.time()
        self._read_timeout = read_timeout
        self._arm()
        self._transport.write(data)
        try:
            await self._head
        except BaseException:
            self.close()  # cancelled (first-byte timeout) or failed before the headers
            raise
        return httpx.Response(
            self._status,
            headers=self._headers,
            stream=_Body(self),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self._reason},
        )

    async def body(self) -> AsyncIterator[bytes]:
        """The response body as it arrives: whatever piled up since the last read, joined."""
        while True:
            if self._chunks:
                chunks, self._chunks, self._buffered = self._chunks, [], 0
                if self._paused and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif self._complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None

    @property
    def complete(self) -> bool:
        return self._complete

    def discard(self) -> None:
        """Drop what arrived and was not read (the connection stays reusable)."""
        self._chunks, self._buffered = [], 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def release(self) -> None:
        """The response was closed: give the connection back if its response was whole."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reusable = self._complete and self._keep_alive and not self.closed and not self._chunks
        # Raised into body(), the error's traceback holds that frame, which holds this
        # connection: a cycle (and the run's frames with it) until the collector ran.
        self._error = None
        self._pool._released(self, reusable)

    def close(self, *, abort: bool = False) -> None:
        """Close the connection; ``abort``: at once, without TLS's closing handshake
        (which waits for the server's reply: at shutdown, the loop would close first)."""
        if not self.closed:
            self.closed = True
            if self._transport is not None:
                if abort:
                    self._transport.abort()
                else:
                    self._transport.close()
        self._pool._forget(self)

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass it

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        try:
            assert self._parser is not None  # dropped only once the connection is lost
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"Invalid HTTP response: {exc}"))
            self.close()
            return
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._parser = None
        self._pool._forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._complete or self._head is None:
            return  # idle, or its response was already whole
        if exc is None and self._head.done() and not self._framed:
            self._complete = True  # the body of an until-close response ends here
            self._wake()
        elif isinstance(exc, OSError):
            self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
        elif not self._head.done():
            self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        else:
            self._fail(
                httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            )

    # -- httptools callbacks ----------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._status = self._parser.get_status_code()
        if status in (204, 304) or 100 <= status < 200:
            self._framed = True  # no body, whatever the headers say
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        if self._no_body:
            self._complete = True  # HEAD: the parser would wait for a body; never reused
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self._keep_alive = self._parser.should_keep_alive() and not self._no_body
        self._complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    # -- waking the reader, and the read timeout --------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        self._error = error
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
            head.exception()  # retrieved: the sender may have been cancelled meanwhile
        self._wake()

    def _arm(self) -> None:
        if self._read_timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(self._last + self._read_timeout, self._expire)

    def _expire(self) -> None:
        """No byte for the read timeout: fail the response, unless it is being read."""
        self._timer = None
        if self._complete or self.closed or self._read_timeout is None:
            return
        if self._chunks or self._loop.time() - self._last < self._read_timeout:
            if self._chunks:
                self._last = self._loop.time()  # the reader is behind, not the upstream
            self._arm()
            return
        self._fail(httpx.ReadTimeout("The upstream sent nothing within the read timeout."))
        self.close()


def set_read_timeout(response: httpx.Response, seconds: float) -> bool:
    """From now on, fail ``response`` (this engine's only) once nothing arrived for
    ``seconds``; False if its engine cannot (httpx's and aiohttp's set theirs per request)."""
    body = response.stream
    if type(body) is not _Body or body._connection is None:
        return False
    connection = body._connection
    connection._read_timeout = seconds
    if connection._timer is not None:  # armed for the old wait: again for this one
        connection._timer.cancel()
        connection._timer = None
        connection._arm()
    return True


def whole(response: httpx.Response) -> bool:
    """Whether the whole of ``response``'s body has arrived (this engine's responses
    only): what is left of it can be let go without reading, nor waiting."""
    body = response.stream
    if type(body) is not _Body or body._connection is None:
        return False
    connection = body._connection
    if connection.closed or not connection.complete:
        return False
    connection.discard()
    return True


class _Body(httpx.AsyncByteStream):
    def __init__(self, connection: _Connection) -> None:
        self._connection: _Connection | None = connection

    def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._connection is not None, "the response is closed"
        return self._connection.body()

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.release()
