"""The abuse suite's instruments: raw sockets on both sides of the gateway, and /proc readings.

- ``RawUpstream``: a scripted upstream on a raw socket, in threads (like
  ``tests/raw_upstream.py``), for bytes the chaos upstream cannot send: a line
  of hundreds of megabytes, invalid UTF-8, a 401 that echoes the key. It records
  each request, the response bytes it managed to write, and whether the gateway
  hung up before the script ended.
- ``Victim``: a listener nobody configured; any connection to it is an SSRF.
- ``exchange``: one request as exact bytes (no client library normalises the
  path or refuses a 100 MB header), sent by a thread while the answer is read,
  so a server that answers before reading everything is seen as it is.
- ``Meter``: the gateway's RSS (sampled every 50 ms) and open descriptors.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Generic, Self, TypeVar

import orjson

from tests import raw_upstream

SAMPLE_S = 0.05

# -- /proc --------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """VmRSS of a process in KB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def socket_inodes(pid: int) -> set[str]:
    """The socket inodes a process holds open (``socket:[N]`` links in /proc/PID/fd)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{name}")
                if target.startswith("socket:"):
                    found.add(target)
    return found


class Meter:
    """RSS before / peak during / after, and descriptors before / after, of one process.

    ``with Meter(pid) as meter:`` samples VmRSS every 50 ms in a thread while the
    block runs; ``meter.settle()`` then waits and takes the "after" readings.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_before = self.rss_peak = self.rss_after = 0
        self.fds_before = self.fds_after = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Meter:
        self.rss_before = self.rss_peak = rss_kb(self.pid)
        self.fds_before = fd_count(self.pid)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak(rss_kb(self.pid))
            self._stop.wait(SAMPLE_S)

    def peak(self, value: int) -> None:
        self.samples += 1
        self.rss_peak = max(self.rss_peak, value)

    def settle(self, seconds: float, fds_at_most: int | None = None) -> None:
        """Wait ``seconds`` (sampling on), or less once the descriptors are back to
        ``fds_at_most``; then read RSS and descriptors "after"."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.peak(rss_kb(self.pid))
            if fds_at_most is not None and 0 <= fd_count(self.pid) <= fds_at_most:
                break
            time.sleep(SAMPLE_S)
        self.rss_after = rss_kb(self.pid)
        self.peak(self.rss_after)
        self.fds_after = fd_count(self.pid)

    @property
    def growth_mb(self) -> float:
        return (self.rss_peak - self.rss_before) / 1024

    @property
    def left_mb(self) -> float:
        return (self.rss_after - self.rss_before) / 1024


# -- the scripted upstream ----------------------------------------------------------------


@dataclass
class RawRequest(raw_upstream.RawRequest):
    """A request as the tests' raw upstream records it (``head``, ``body``, ``headers``),
    and what became of its response."""

    started: float  # time.monotonic() when the request was read
    sent: int = 0  # response bytes written
    ended: float | None = None  # when the script ended or the gateway hung up
    hung_up: bool = False  # the gateway closed the connection before the script ended

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    @property
    def path(self) -> str:
        parts = self.request_line.split(" ")
        return parts[1] if len(parts) > 1 else ""

    @property
    def json(self) -> object:
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None


Script = Callable[[RawRequest], Iterable[bytes]]


def _read_request(conn: socket.socket) -> RawRequest | None:
    read = raw_upstream._read_request(conn)
    return None if read is None else RawRequest(read.head, read.body, time.monotonic())


Record = TypeVar("Record")


class _Listener(Generic[Record]):
    """A loopback listener with a thread per connection (``_handle``), and the records
    its connections left, in arrival order."""

    def __init__(self, backlog: int) -> None:
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)

    def mark(self) -> int:
        """How many records so far: ``since(mark)`` gives those that came later."""
        with self._lock:
            return len(self.records)

    def since(self, mark: int) -> list[Record]:
        with self._lock:
            return self.records[mark:]

    def _record(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        raise NotImplementedError


class RawUpstream(_Listener[RawRequest]):
    """Serve ``script(request)`` on a free loopback port; one response per connection."""

    def __init__(self, script: Script, *, send_buffer: int | None = None) -> None:
        super().__init__(backlog=512)
        self.script = script
        self.send_buffer = send_buffer  # SO_SNDBUF for responses (small: back-pressure shows)

    @property
    def requests(self) -> list[RawRequest]:
        return self.records

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if self.send_buffer is not None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
            try:
                request = _read_request(conn)
            except OSError:
                return
            if request is None:
                return
            self._record(request)
            try:
                for part in self.script(request):
                    conn.sendall(part)
                    request.sent += len(part)
            except OSError:
                request.hung_up = True
            request.ended = time.monotonic()


# -- the victim ---------------------------------------------------------------------------


@dataclass
class Contact:
    data: bytes
    at: float


class Victim(_Listener[Contact]):
    """A loopback listener that no config names: it records whatever reaches it."""

    def __init__(self) -> None:
        super().__init__(backlog=128)

    @property
    def contacts(self) -> list[Contact]:
        return self.records

    def _handle(self, conn: socket.socket) -> None:
        contact = Contact(b"", time.monotonic())
        self._record(contact)
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in contact.data and len(contact.data) < 1 << 20:
                    part = conn.recv(65536)
                    if not part:
                        break
                    contact.data += part
                # Answer like an internal service would: the leak must be visible.
                body = b'{"victim": "internal metadata"}'
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
                )


# -- a raw HTTP/1.1 client ----------------------------------------------------------------


@dataclass
class RawResponse:
    status: int | None = None  # None: no status line arrived
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw: bytes = b""
    error: str | None = None  # how the exchange failed, if it did
    sent: int = 0  # request bytes the client managed to write
    send_error: str | None = None
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        if self.status is not None:
            return str(self.status)
        return self.error or "no answer"

    def json(self) -> object:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


def parse_response(raw: bytes, response: RawResponse) -> None:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return
    response.status = int(parts[1])
    for line in lines[1:]:
        name, _, value = line.partition(":")
        response.headers[name.strip().lower()] = value.strip()
    if response.headers.get("transfer-encoding", "").lower() == "chunked":
        response.body = dechunk(rest)
    elif "content-length" in response.headers:
        response.body = rest[: int(response.headers["content-length"])]
    else:
        response.body = rest


def dechunk(data: bytes) -> bytes:
    """A chunked body's content, as far as it arrived whole."""
    out = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        if not sep:
            break
        try:
            size = int(size_line.split(b";", 1)[0], 16)
        except ValueError:
            break
        if size == 0 or len(data) < size:
            out += data[:size]
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)


def _complete(raw: bytes) -> bool:
    """Whether a response with a length (or a whole chunked body) has fully arrived."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        return rest.endswith(b"0\r\n\r\n")
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":", 1)[1])
    return False


def exchange(
    port: int,
    head: bytes,
    body: Iterable[bytes] = (),
    *,
    timeout: float = 10.0,
    read_limit: int = 4 << 20,
    keep_sending: bool = False,
) -> RawResponse:
    """Send ``head`` then ``body`` (from a thread) and read the answer until it is
    complete, the connection closes, or ``timeout``. Never raises for the network.

    ``keep_sending``: after the answer, go on sending the body (as a hostile client
    would) until it is all sent or the server cuts the connection."""
    response = RawResponse()
    started = time.monotonic()
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError as exc:
        response.error = f"connect: {type(exc).__name__}"
        return response

    def send() -> None:
        try:
            sock.sendall(head)
            response.sent += len(head)
            for part in body:
                sock.sendall(part)
                response.sent += len(part)
        except OSError as exc:
            response.send_error = type(exc).__name__

    sender = threading.Thread(target=send, daemon=True)
    raw = bytearray()
    with sock:
        sender.start()
        deadline = started + timeout
        try:
            while len(raw) < read_limit:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                part = sock.recv(65536)
                if not part:
                    break
                raw += part
                if _complete(bytes(raw)):
                    break
        except TimeoutError:
            response.error = "timeout"
        except OSError as exc:
            response.error = type(exc).__name__
        if keep_sending:
            sender.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    sender.join(timeout)
    response.raw = bytes(raw)
    response.seconds = time.monotonic() - started
    parse_response(response.raw, response)
    if response.status is None and response.error is None:
        response.error = "closed without an answer" if not raw else "unparseable answer"
    return response


def request_head(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]] = (),
    *,
    body: bytes | None = None,
    host: str = "127.0.0.1",
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"host: {host}", "connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b"")


def sse_payloads(body: bytes) -> list[bytes]:
    """The ``data`` of each event of a client stream (the gateway writes LF line ends)."""
    out = []
    for event in body.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[6:])
    return out


@contextlib.contextmanager
def raised_fd_limit() -> Iterator[int]:
    """The soft RLIMIT_NOFILE raised to the hard one (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
