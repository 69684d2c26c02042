"""A TCP proxy in front of a server that breaks one response after exactly N SSE events.

    with CuttingProxy(llama.port) as proxy:      # proxy.url: http://127.0.0.1:PORT
        proxy.arm(5, "reset")                    # the next response: 5 events, then a RST
        ...                                      # proxy.cuts == 1; later ones pass whole

A real server streams a real answer at its own pace, so a fault cannot be scripted
inside the answer as the chaos upstream does; it is cut from outside. The proxy
forwards bytes both ways untouched. Armed, it takes the next response that passes
(the first server-to-client bytes after ``arm``, on whichever connection), counts
the SSE events in it (each ends with ``\\n\\n``: neither an HTTP head, which ends
with ``\\r\\n\\r\\n``, nor chunked framing, nor JSON, which escapes newlines, holds
one), forwards it up to the end of the Nth event exactly, and then ends the client's
connection: ``reset`` with a RST (SO_LINGER 0, then close), ``close`` with a FIN. The
server's side is closed too, so the server sees its client gone. One cut per ``arm``.

``on_cut`` (optional) runs in a worker thread once the N events have been forwarded
and before the connection is ended: a server SIGKILLed there died after sending
exactly N events. A connection the proxy cannot open to its server (it is dead) is
reset, as soon as the client has connected.

The proxy runs on an asyncio loop of its own in a thread, so blocking callers (the
SDKs, pytest) use it as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

How = Literal["reset", "close"]
READ = 65536
TERMINATOR = b"\n\n"


@dataclass(frozen=True)
class Arm:
    after_events: int
    how: How
    on_cut: Callable[[], object] | None = None


class EventCounter:
    """Counts SSE event terminators in a byte stream read in pieces cut anywhere."""

    def __init__(self) -> None:
        self.events = 0
        self._newline = False  # the last piece ended with a newline no terminator took

    def feed(self, data: bytes, wanted: int) -> int | None:
        """Count the terminators in ``data``; the offset in ``data`` just after the one
        that makes ``wanted`` events, if it is in ``data``, else None."""
        if self.events >= wanted:
            return 0
        buf = (b"\n" if self._newline else b"") + data
        shift = len(buf) - len(data)
        start = 0
        while (found := buf.find(TERMINATOR, start)) >= 0:
            start = found + len(TERMINATOR)
            self.events += 1
            if self.events == wanted:
                return start - shift
        self._newline = buf.endswith(b"\n") and len(buf) > start
        return None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a RST: SO_LINGER 0, then close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class CuttingProxy:
    """The proxy, listening on a free loopback port, forwarding to ``127.0.0.1:target``.
    ``start()``/``stop()`` or a ``with`` block."""

    def __init__(self, target: int, host: str = "127.0.0.1") -> None:
        self.target = target  # may be changed while it runs: new connections go there
        self.host = host
        self.cuts = 0  # responses cut so far
        self.connections = 0  # client connections accepted so far
        self._arm: Arm | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._port = 0

    # -- the caller's side ----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def armed(self) -> bool:
        return self._arm is not None

    def arm(
        self, after_events: int, how: How = "reset", *, on_cut: Callable[[], object] | None = None
    ) -> None:
        """Cut the next response after ``after_events`` complete SSE events."""
        if after_events < 0:
            raise ValueError("after_events must be >= 0")
        if how not in ("reset", "close"):
            raise ValueError(f"how must be reset or close, not {how!r}")
        with self._lock:
            self._arm = Arm(after_events, how, on_cut)

    def disarm(self) -> None:
        with self._lock:
            self._arm = None

    def start(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="cutting-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(10)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> CuttingProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the loop's side ------------------------------------------------------------------

    def _claim(self) -> Arm | None:
        with self._lock:
            arm, self._arm = self._arm, None
            return arm

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self._port = self._server.sockets[0].getsockname()[1]

    async def _aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        # No buffering in the transport: once a write is drained, the kernel has it, so a
        # reset right after it cannot drop bytes the proxy meant to forward.
        writer.transport.set_write_buffer_limits(0)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()  # stop() closes every connection
        finally:
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            _reset(writer)  # the server is down: as near to a refusal as a proxy gets
            return
        pumps = [
            asyncio.create_task(self._requests(reader, up_writer)),
            asyncio.create_task(self._responses(up_reader, writer, up_writer)),
        ]
        try:
            # Either direction ending ends the exchange: a client waiting for a response
            # never half-closes, and a server's end is the response's.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            up_writer.transport.abort()
            writer.close()

    async def _requests(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(READ):
                sink.write(data)
                await sink.drain()

    async def _responses(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        server: asyncio.StreamWriter,
    ) -> None:
        arm: Arm | None = None
        counter = EventCounter()
        with contextlib.suppress(OSError):
            while data := await source.read(READ):
                arm = arm or self._claim()
                end = None if arm is None else counter.feed(data, arm.after_events)
                sink.write(data if end is None else data[:end])
                await sink.drain()
                if arm is not None and end is not None:
                    await self._cut(arm, sink, server)
                    return

    async def _cut(
        self, arm: Arm, client: asyncio.StreamWriter, server: asyncio.StreamWriter
    ) -> None:
        self.cuts += 1
        if arm.on_cut is not None:
            await asyncio.to_thread(arm.on_cut)
        server.transport.abort()
        if arm.how == "reset":
            _reset(client)
        else:
            client.close()  # a FIN, once what was written is sent
