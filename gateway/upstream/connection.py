"""One HTTP/1.1 connection to an upstream, as an ``asyncio.Protocol``: httptools parses
the response as bytes arrive, the body waits in a list until read, and one timer per
connection is the read timeout (``transport.py`` has the pool these live in).

Flow control: past ``HIGH_WATER`` unread body bytes the socket stops being read, so a
client that does not read closes the upstream's TCP window instead of filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools
import httpx2

HIGH_WATER = 256 * 1024  # unread body bytes before the socket stops being read

Origin = tuple[bytes, bytes, int]  # scheme, host, port


class Pool(Protocol):
    """What a connection tells the pool it came from (``Http1Transport``)."""

    def released(self, connection: Connection, reusable: bool) -> None: ...

    def forget(self, connection: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One upstream connection: one request at a time, its response parsed as it arrives."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
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

    async def send(self, method: str, data: bytes, read_timeout: float | None) -> httpx2.Response:
        assert self._transport is not None
        self._head = self._loop.create_future()
        self._no_body = method == "HEAD"
        self._reason, self._headers, self._chunks = b"", [], []
        self._buffered, self._framed, self._complete, self._keep_alive = 0, False, False, False
        self._error = None
        self._last = self._loop.time()
        self._read_timeout = read_timeout
        self._arm()
        if self._transport.is_closing():  # the server closed it while it idled
            self.close()
            raise httpx2.ConnectError("The pooled upstream connection was closed.")
        self._transport.write(data)
        try:
            await self._head
        except BaseException:
            self.close()  # cancelled (first-byte timeout) or failed before the headers
            raise
        return httpx2.Response(
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
        self._pool.released(self, reusable)

    @property
    def reusable(self) -> bool:
        """Open: not closed, and its transport not closing (a server that closed it while
        it idled: the transport closes at once, ``connection_lost`` a loop turn later)."""
        return not self.closed and self._transport is not None and not self._transport.is_closing()

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
        self._pool.forget(self)

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass it

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        try:
            assert self._parser is not None  # dropped only once the connection is lost
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx2.RemoteProtocolError(f"Invalid HTTP response: {exc}"))
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
        self._pool.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._complete or self._head is None:
            return  # idle, or its response was already whole
        if exc is None and self._head.done() and not self._framed:
            self._complete = True  # the body of an until-close response ends here
            self._wake()
        elif isinstance(exc, OSError):
            self._fail(httpx2.ReadError(str(exc) or type(exc).__name__))
        elif not self._head.done():
            self._fail(
                httpx2.RemoteProtocolError("Server disconnected without sending a response.")
            )
        else:
            self._fail(
                httpx2.RemoteProtocolError(
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
        self._fail(httpx2.ReadTimeout("The upstream sent nothing within the read timeout."))
        self.close()


def set_read_timeout(response: httpx2.Response, seconds: float) -> bool:
    """From now on, fail ``response`` (this engine's only) once nothing arrived for
    ``seconds``; False if its engine cannot (httpx2's sets its own per request)."""
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


def whole(response: httpx2.Response) -> bool:
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


class _Body(httpx2.AsyncByteStream):
    def __init__(self, connection: Connection) -> None:
        self._connection: Connection | None = connection

    def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._connection is not None, "the response is closed"
        return self._connection.body()

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.release()
