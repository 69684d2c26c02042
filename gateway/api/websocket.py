"""A WebSocket as the gateway speaks it: messages read a few ahead, frames sent with
the deadline HTTP responses have, errors as frames, and upgrades it refuses.

What runs on it is the caller's (``responses_ws.py``: the Responses API); this is
the wire under it:

- **reading**: one task reads the client's messages into a small queue
  (``READ_AHEAD``): uvicorn reads the socket only when asked, so a client cannot
  pile messages up while a response runs. ``next()`` is safe to cancel: a message
  taken off the queue just as its wait is cancelled is held for the next call.
- **sending**: a text frame that the client does not take within
  ``listen.send_timeout`` (a client that stopped reading, as over HTTP) or that
  finds it gone raises ``Gone``. No lock: uvicorn writes a frame whole once the
  transport takes bytes, so a frame sent from another task goes between two.
- **refusing**: an upgrade not served is answered with an HTTP status and a JSON
  body (ASGI's denial response), not Starlette's close, which uvicorn answers 403.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway.errors import error_body

# Client messages read ahead of the one being handled: beyond it, the socket is not
# read (uvicorn reads a message only when asked), so a client cannot pile them up.
READ_AHEAD = 4


class Gone(Exception):
    """The client left, or stopped reading for ``listen.send_timeout``."""


async def refuse_upgrade(scope: Scope, receive: Receive, send: Send, reason: str) -> None:
    """Answer an upgrade the gateway does not serve with 426 and a JSON body, so a
    client falls back to HTTP in one round trip (a 403, Starlette's default, makes
    Codex retry the handshake 7 times first)."""
    message = (
        "WebSocket is not served here; use HTTP."
        if reason != "full"
        else "Too many WebSocket connections are open on this gateway; use HTTP."
    )
    code = "websocket_connection_limit_reached" if reason == "full" else "upgrade_required"
    await deny(scope, receive, send, 426, error_body(message, "invalid_request_error", code))


async def deny(scope: Scope, receive: Receive, send: Send, status: int, body: Any) -> None:
    """Refuse the handshake with ``status`` and the JSON ``body``."""
    websocket = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        response = Response(
            orjson.dumps(body),
            status_code=status,
            media_type="application/json",
            headers={"upgrade": "websocket"} if status == 426 else None,
        )
        await websocket.send_denial_response(response)
    else:  # a server without the denial extension: a close, which it answers 403
        await websocket.close(code=1008)


class Channel:
    """One accepted socket's messages in, frames out."""

    def __init__(self, websocket: WebSocket, send_timeout: float) -> None:
        self.websocket = websocket
        self._send_timeout = send_timeout
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(READ_AHEAD)
        self._gone = asyncio.Event()  # the client left: nothing more will arrive
        self._held: deque[str | bytes] = deque()  # taken, not yet handled
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def hold(self, message: str | bytes) -> None:
        """Keep ``message`` for the next ``next()``, after those held already."""
        self._held.append(message)

    async def _read(self) -> None:
        """The client's messages into the inbox (a few ahead at most); then ``_gone``."""
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("text")
                await self._inbox.put(data if data is not None else message.get("bytes") or b"")
        finally:
            self._gone.set()

    async def next(self) -> str | bytes | None:
        """The client's next message; None once it has left and nothing is left to read."""
        if self._held:
            return self._held.popleft()
        if not self._inbox.empty():
            return self._inbox.get_nowait()
        if self._gone.is_set():
            return None
        incoming = asyncio.ensure_future(self._inbox.get())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({incoming, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Cancelled (the caller stopped waiting) after it was taken: held, not lost.
            if incoming.done() and not incoming.cancelled():
                self._held.appendleft(incoming.result())
            raise
        finally:
            gone.cancel()
            if not incoming.done():
                incoming.cancel()
        if incoming.done() and not incoming.cancelled():
            return incoming.result()
        return None

    async def send(self, event: dict[str, Any]) -> int:
        """Send one frame; its size."""
        frame = orjson.dumps(event).decode()
        await self.send_frame(frame)
        return len(frame)

    async def send_frame(self, frame: str) -> None:
        """One text frame; ``Gone`` if the client left, or read none of it within
        ``listen.send_timeout`` (as over HTTP: a client that stopped reading)."""
        try:
            async with asyncio.timeout(self._send_timeout):
                await self.websocket.send_text(frame)
        except (TimeoutError, WebSocketDisconnect, OSError, RuntimeError):
            raise Gone from None

    async def error(self, status: int, message: str, code: str) -> None:
        await self.send_error(status, error_body(message, "invalid_request_error", code))

    async def send_error(
        self, status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """An error before any response event: ``{"type": "error", "status": N, "error":
        {...}}``, which Codex reads as an HTTP error of that status; ``headers`` (when a
        retry would not help, or when to retry) in its ``error.headers``."""
        inner = body.get("error")
        error: dict[str, Any] = inner if isinstance(inner, dict) else body
        if headers:
            error = error | {"headers": dict(headers)}
        await self.send({"type": "error", "status": status, "error": error})

    async def close(self, code: int, reason: str) -> None:
        if self.websocket.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                await self.websocket.close(code=code, reason=reason)
