"""The client side of the wire: uvicorn's httptools protocol, with limits and deadlines.

ARCHITECTURE.md section 6a. uvicorn reads a request head of any size (httptools
buffers a header value until its end: a 100 MB header was read and answered) and
waits forever for a client that connects and sends nothing, or trickles its head
or body. Here, as nginx and Envoy do:

- a request head larger than ``limits.max_header_bytes``, or with more than
  ``limits.max_headers`` fields, gets ``431`` and the connection is closed; the
  head is never held beyond the limit plus one read;
- a connection must send a whole request head within ``listen.header_timeout``
  of connecting (or of the first byte of its next request), and may not leave its
  body silent for ``listen.body_timeout``, nor take longer than that plus its
  declared length at ``MIN_BODY_RATE``; otherwise ``408`` (when no response has
  started) and the connection is closed. Idle keep-alive connections are
  closed by uvicorn's own keep-alive timeout;
- a client that accepts none of its response's bytes for ``listen.send_timeout``
  while the gateway has some waiting for it (nginx's ``send_timeout``) is
  disconnected: a stream it stopped reading goes on as a detached run, which it
  can resume, instead of holding the connection and the run's log forever.

Every refusal has OpenAI's error shape. The limits reach the protocol through the
lifespan state (``STATE_KEY``), so every worker process gets its own config's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.schema import GatewayConfig
from gateway.errors import error_body

STATE_KEY = "gateway.listen"
LINGER = 2.0  # seconds a refused connection is read (and discarded) before it is closed
# A body may take body_timeout plus its declared length at this rate, at the most: a
# 16 MiB upload gets 30 s + 256 s; a kilobyte trickled a byte a second, 30 s.
MIN_BODY_RATE = 64 * 1024


@dataclass(frozen=True, slots=True)
class ListenLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 15.0
    body_timeout: float = 30.0
    send_timeout: float = 30.0

    @classmethod
    def of(cls, config: GatewayConfig) -> ListenLimits:
        return cls(
            config.limits.max_header_bytes,
            config.limits.max_headers,
            config.listen.header_timeout,
            config.listen.body_timeout,
            config.listen.send_timeout,
        )


_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self.app_state.get(STATE_KEY)
        self._limits = limits if isinstance(limits, ListenLimits) else ListenLimits()
        self._reading_head = True  # the bytes that arrive belong to a request head
        self._head_bytes = 0
        self._fields = 0
        self._parsed = 0  # bytes of the request line's target and the fields parsed so far
        self._deadline: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str, str] | None = None
        self._lingering = False  # refused: reading only to discard, until closed
        self._body_ends = 0.0  # the whole body's deadline (loop time)
        self._stall: asyncio.TimerHandle | None = None  # while the client reads nothing
        self._stalled_at = 0  # bytes waiting for the client when the stall timer started

    # -- deadlines ------------------------------------------------------------------

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self, what: str) -> None:
        self._deadline = None
        if self.cycle is not None and self.cycle.response_started:
            if not self.cycle.response_complete:
                return  # a stray byte during a live response: the response's business
        message = f"The request's {what} did not arrive in time."
        self._reply(408, message, "request_timeout")

    # -- the protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Also a connection that never sends a byte.
        self._arm(self._limits.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        super().connection_lost(exc)

    # -- a client that reads nothing ------------------------------------------------

    def pause_writing(self) -> None:
        """The transport's buffer is full: the client has stopped reading, for now."""
        super().pause_writing()
        if self._stall is None:
            self._arm_stall()

    def _arm_stall(self) -> None:
        self._stalled_at = self.transport.get_write_buffer_size()
        self._stall = self.loop.call_later(self._limits.send_timeout, self._stalled)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        # Aborted, not closed: a close waits to flush a buffer nobody reads. The
        # response's send returns, its disconnect arrives, and a run goes on detached.
        self._stall = None
        if self.transport.get_write_buffer_size() < self._stalled_at:
            self._arm_stall()  # a slow reader, not a silent one: it took some bytes
            return
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._reading_head:
            if self._deadline is None:  # the first byte of a keep-alive connection's next request
                self._arm(self._limits.header_timeout, "headers")
            self._head_bytes += len(data)
        elif self._deadline is not None:
            # Reading a body: the deadline is for silence, so a slow but steady upload
            # (a 25 MB file on a slow link) is not cut off; but a body trickled a byte at
            # a time is, by the whole body's deadline (``_body_ends``).
            remaining = self._body_ends - self.loop.time()
            self._arm(max(0.0, min(self._limits.body_timeout, remaining)), "body")
        super().data_received(data)
        if self._reading_head and self._head_bytes > self._limits.max_header_bytes:
            # A head still incomplete past the limit (httptools holds its last value).
            self._refuse_head(f"larger than {self._limits.max_header_bytes} bytes")

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > self._limits.max_headers:
            self._refusal = self._head_refusal(f"more than {self._limits.max_headers} fields")
            raise _Refused
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        # Exact, even for a head that arrives whole in one read (which the count of
        # raw bytes in data_received cannot see before the head is complete).
        self._parsed += size
        if self._parsed > self._limits.max_header_bytes:
            self._refusal = self._head_refusal(f"larger than {self._limits.max_header_bytes} bytes")
            raise _Refused

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = self._fields = self._parsed = 0
        self._disarm()
        super().on_headers_complete()
        if not self.pipeline:  # a pipelined request's body waits for its turn, unread
            declared = next((v for k, v in self.headers if k == b"content-length"), b"0")
            length = int(declared) if declared.isdigit() else 0
            self._body_ends = self.loop.time() + self._limits.body_timeout + length / MIN_BODY_RATE
            self._arm(self._limits.body_timeout, "body")

    def handle_websocket_upgrade(self) -> None:
        """The connection becomes a WebSocket (``GET /v1/responses``): this protocol's
        deadlines end here; the WebSocket protocol keeps its own (pings, sizes)."""
        self._disarm()
        self._unstall()
        super().handle_websocket_upgrade()

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading_head = True
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request httptools cannot parse (or one refused from a
        # parser callback): OpenAI-shaped, like every other error.
        status, message, code = self._refusal or (400, msg, "invalid_http_request")
        self._reply(status, message, code)

    # -- refusals -------------------------------------------------------------------

    def _head_refusal(self, why: str) -> tuple[int, str, str]:
        return 431, f"The request head is too large: {why}.", "request_header_fields_too_large"

    def _refuse_head(self, why: str) -> None:
        self._reply(*self._head_refusal(why))

    def _reply(self, status: int, message: str, code: str) -> None:
        """Answer with an error (unless a response has started) and close the connection.

        A client still sending would get a reset, which can destroy the answer before
        it reads it: so, as nginx's lingering close does, the gateway stops writing,
        discards what still arrives for ``LINGER`` seconds at most, then closes.
        """
        self._disarm()
        self._reading_head = False
        transport = self.transport
        if transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            transport.close()
            return
        body = orjson.dumps(error_body(message, "invalid_request_error", code))
        transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, _REASONS[status], len(body), body)
        )
        if self.cycle is not None:
            self.cycle.keep_alive = False
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        self._deadline = self.loop.call_later(LINGER, transport.close)
