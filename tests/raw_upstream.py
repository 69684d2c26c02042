"""A scripted upstream on a raw socket: for bytes and headers the chaos upstream does not send.

Each request gets one response, written as the script yields it, then the
connection closes (the body ends with it: no framing to get right), or, where the
script yields ``RESET``, is reset. What each request sent, and how many response
bytes went out before the gateway hung up, are recorded.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson


class Reset:
    """Yielded by a script: wait until the gateway has every byte written, then drop the
    connection with a TCP reset (SO_LINGER 0, then close) instead of closing it."""


RESET = Reset()
Script = Callable[[int, "RawRequest"], Iterable[bytes | Reset]]


@dataclass
class RawRequest:
    head: bytes
    body: bytes

    @property
    def headers(self) -> dict[str, str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        pairs = (line.partition(":") for line in lines if line)
        return {name.strip().lower(): value.strip() for name, _, value in pairs}


@dataclass
class RawUpstream:
    base_url: str
    requests: list[RawRequest] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # response bytes written, per request


def sse_head(*headers: tuple[str, str]) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return (
        f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n{extra}\r\n"
    ).encode()


def chat_chunk(
    content: str | None = None, *, role: str | None = None, finish: str | None = None
) -> bytes:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    chunk = {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "raw",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chat_answer(*parts: str) -> list[bytes]:
    """The events of a whole answer: role, ``parts`` as content deltas, stop, [DONE]."""
    return [
        chat_chunk("", role="assistant"),
        *(chat_chunk(part) for part in parts),
        chat_chunk(finish="stop"),
        b"data: [DONE]\n\n",
    ]


def _read_request(conn: socket.socket) -> RawRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return None
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(RawRequest(head, b"").headers.get("content-length", "0") or 0)
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            return None
        body += part
    return RawRequest(head, body)


def _flushed(conn: socket.socket) -> None:
    """Wait (bounded) until the peer has acknowledged every byte written: a RST drops
    what is still queued."""
    if sys.platform != "linux":
        time.sleep(0.1)
        return
    import fcntl
    import termios

    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        queued = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4)
        if struct.unpack("i", queued)[0] == 0:
            return
        time.sleep(0.002)


@contextlib.contextmanager
def running_raw_upstream(script: Script) -> Iterator[RawUpstream]:
    """Serve ``script(index, request)`` on a free loopback port, in threads."""
    listener = socket.create_server(("127.0.0.1", 0))
    upstream = RawUpstream(f"http://127.0.0.1:{listener.getsockname()[1]}/v1")
    lock = threading.Lock()

    def handle(conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            if request is None:
                return
            with lock:
                index = len(upstream.requests)
                upstream.requests.append(request)
                upstream.sent.append(0)
            try:
                for part in script(index, request):
                    if isinstance(part, Reset):
                        _flushed(conn)
                        conn.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        return
                    conn.sendall(part)
                    upstream.sent[index] += len(part)
            except OSError:
                pass  # the gateway hung up

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield upstream
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
