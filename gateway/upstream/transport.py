"""HTTP/1.1 to upstreams: an httpx2 transport on asyncio protocols and httptools.

httpx2 stays the gateway's HTTP API (requests, responses, timeouts, errors); this
replaces its default engine, httpcore2, under it. At 256 concurrent streams
httpcore 1.0's read path (h11, anyio, a timeout scope per read) and its pool (which
scans every connection on each request, encode/httpcore#1035) took about 70% of
the gateway's CPU (BENCHMARKS.md, "Profile"); httpcore2's still costs 2.2-2.4x
this engine's CPU per event ("Upstream HTTP engines on httpx2"). Here:

- a connection is an ``asyncio.Protocol`` (``connection.py``): httptools (C, the
  parser uvicorn uses) parses the response as bytes arrive, and the body waits in a
  list until read;
- the read timeout is one timer per connection, re-armed when it fires, not a
  scope per read: it fires only when nothing arrived for ``timeout["read"]``
  while the reader was waiting;
- the pool keeps idle connections per origin, most recent first: taking one and
  giving it back is O(1).

It speaks what the gateway sends upstream: one request at a time per
connection, with a body of known length; responses with Content-Length, chunked
or until-close bodies; directly, or through an ``http://`` forward proxy (a
``CONNECT`` tunnel, then TLS over it, for an https upstream; absolute-form
requests for an http one). Errors are httpx2's: ``ConnectError``/``ConnectTimeout``,
``ProxyError`` (a tunnel refused), ``ReadError`` (reset), ``ReadTimeout``
(silence), ``RemoteProtocolError`` (a broken or incomplete response), ``PoolTimeout``.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import httpx2

from gateway.upstream.connection import Connection, Origin

KEEPALIVE_EXPIRY = 5.0  # seconds an idle connection is kept (httpx2's default)

MAX_TUNNEL_HEAD = 64 * 1024  # a proxy's answer to CONNECT, at most
_DEFAULT_PORTS = {b"http": 80, b"https": 443}


class Http1Transport(httpx2.AsyncBaseTransport):
    def __init__(
        self,
        *,
        tls: ssl.SSLContext,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        proxy: httpx2.URL | None = None,
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
        self._idle: dict[Origin, deque[Connection]] = {}  # oldest first
        self._open: set[Connection] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        origin = self._origin(url)
        # Through a proxy, an http origin is asked in absolute form, with the credentials.
        forwarded = self._proxy is not None and url.raw_scheme == b"http"
        head = _head(request, self._proxy_auth if forwarded else None, absolute=forwarded)
        body = await request.aread()
        return await self._send(
            origin, request.method, head + body, request.extensions.get("timeout", {})
        )

    def target(self, method: str, url: httpx2.URL) -> Target:
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
    ) -> httpx2.Response:
        """``handle_async_request`` without an ``httpx2.Request``: the head goes from
        ``target`` and ``headers`` straight to bytes (building the request and its
        ``Headers`` cost a request start more than the rest of the engine)."""
        lines = [target.start]
        if "host" not in headers:  # else configured for the upstream (a virtual host)
            lines.append(target.host)
        for name, value in headers.items():
            raw = value.encode("latin-1")  # what a header can carry (a client's, unchanged)
            if b"\r" in raw or b"\n" in raw or b"\0" in raw:  # would end the line: smuggling
                raise httpx2.LocalProtocolError(f"Illegal character in header {name!r}.")
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), raw))
        lines.append(b"Content-Length: %d\r\n\r\n" % len(content))
        lines.append(content)
        return await self._send(target.origin, target.method, b"".join(lines), timeouts)

    def _origin(self, url: httpx2.URL) -> Origin:
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx2.UnsupportedProtocol(f"Unsupported URL scheme {url.scheme!r}.")
        return (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])

    async def _send(
        self, origin: Origin, method: str, data: bytes, timeouts: Mapping[str, float | None]
    ) -> httpx2.Response:
        if self._slots.locked():  # a wait, with its own deadline, only when there is one
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx2.PoolTimeout(
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

    def _checkout(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if connection.reusable and now - connection.idle_since < self._expiry:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, within: float | None) -> Connection:
        connection = Connection(self, origin)
        try:
            async with asyncio.timeout(within):
                # In a context of its own: the transport keeps the context it was made
                # in for the connection's life, and this one would be the request's (its
                # run, prompt and answer held as long as the connection idles in the pool).
                await asyncio.get_running_loop().create_task(
                    self._open_connection(connection, origin), context=contextvars.Context()
                )
        except TimeoutError:
            raise httpx2.ConnectTimeout("Timed out connecting to the upstream.") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS (ssl.SSLError)
            raise httpx2.ConnectError(str(exc) or type(exc).__name__) from None
        self._open.add(connection)
        return connection

    async def _open_connection(self, connection: Connection, origin: Origin) -> None:
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
                raise httpx2.ProxyError(f"The proxy refused the tunnel ({status}).")
            secured = await loop.start_tls(transport, connection, tls, server_hostname=host)
        except BaseException:
            transport.abort()
            raise
        assert secured is not None
        connection.connection_made(secured)

    def released(self, connection: Connection, reusable: bool) -> None:
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

    def forget(self, connection: Connection) -> None:
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


def _request_line(method: bytes, url: httpx2.URL, *, absolute: bool) -> bytes:
    target = url.raw_path
    if absolute:  # to a forward proxy: the whole URL
        target = b"%s://%s%s" % (url.raw_scheme, url.netloc, url.raw_path)
    return b"%s %s HTTP/1.1\r\n" % (method, target)


def _head(
    request: httpx2.Request, proxy_authorization: bytes | None = None, *, absolute: bool = False
) -> bytes:
    lines = [_request_line(request.method.encode("ascii"), request.url, absolute=absolute)]
    if proxy_authorization is not None:
        lines.append(b"Proxy-Authorization: %s\r\n" % proxy_authorization)
    for name, value in request.headers.raw:
        # httpx2 checks names; a value must not end the header line (request smuggling).
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise httpx2.LocalProtocolError(f"Illegal character in header {name.decode()!r}.")
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
                httpx2.ProxyError("The proxy closed the connection before the tunnel was up.")
            )
