"""Client connections: bounded request heads, deadlines for heads and bodies (section 6a)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, gateway_config, running_gateway

LISTEN = {"header_timeout": 0.5, "body_timeout": 0.5}
LIMITS = {"max_header_bytes": 8192, "max_headers": 20}


@pytest.fixture(scope="module")
def strict(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(gateway_config(chaos.base_url, listen=LISTEN, limits=LIMITS)) as gw:
        yield gw


def connect(gateway: RunningGateway) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the gateway closes the connection (or 5 s pass)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def error_of(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body)["error"]["code"]


def test_a_connection_that_never_sends_is_closed(strict: RunningGateway) -> None:
    with connect(strict) as sock:
        started = time.monotonic()
        answer = read_all(sock)
    assert 0.4 < time.monotonic() - started < 3
    assert error_of(answer) == (408, "request_timeout")


def test_a_trickled_head_is_cut_off_at_the_deadline(strict: RunningGateway) -> None:
    with connect(strict) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(20):  # one header every 0.1 s, never the blank line
            time.sleep(0.1)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
        answer = read_all(sock)
    assert time.monotonic() - started < 3
    assert error_of(answer) == (408, "request_timeout")


def test_a_trickled_body_is_cut_off_at_the_deadline(strict: RunningGateway) -> None:
    with connect(strict) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 1000\r\n\r\n{"model": '
        )
        started = time.monotonic()
        answer = read_all(sock)
    assert time.monotonic() - started < 3
    assert error_of(answer) == (408, "request_timeout")


@pytest.mark.parametrize(
    "headers",
    [
        b"X-Big: " + b"a" * 1_000_000 + b"\r\n",  # one huge value
        b"".join(b"X-H%d: v\r\n" % n for n in range(25)),  # too many fields
    ],
    ids=["huge-header", "too-many-headers"],
)
def test_an_oversized_head_gets_431_and_the_gateway_stays_up(
    strict: RunningGateway, headers: bytes
) -> None:
    with connect(strict) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        except OSError:
            pass  # closed while we were still sending: the answer is already there
        answer = read_all(sock)
    assert error_of(answer) == (431, "request_header_fields_too_large")
    with connect(strict) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 200")


def test_an_unparseable_request_gets_an_openai_shaped_400(strict: RunningGateway) -> None:
    with connect(strict) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert error_of(read_all(sock)) == (400, "invalid_http_request")


def test_keep_alive_requests_within_the_limits_are_served(strict: RunningGateway) -> None:
    with connect(strict) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.3)  # idle between requests: not the head deadline's business


def test_a_slow_but_steady_body_is_not_cut_off(strict: RunningGateway) -> None:
    """The body deadline is for silence (and the body's size at 64 KiB/s): an upload that
    takes four times body_timeout, but never pauses that long, is served."""
    padding = "x" * 200_000  # 0.5 s + 200 KB at 64 KiB/s: about 3.5 s allowed in all
    body = b'{"model": "chaos:text=3", "messages": [], "user": "%s"}' % padding.encode()
    with connect(strict) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        for i in range(0, len(body), 20_000):  # about 2 s in all, 0.2 s apart
            sock.sendall(body[i : i + 20_000])
            time.sleep(0.2)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_body_trickled_a_byte_at_a_time_is_cut_off(strict: RunningGateway) -> None:
    """Never silent for body_timeout, but far slower than its size allows."""
    with connect(strict) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n"
        )
        started = time.monotonic()
        with contextlib.suppress(OSError):
            for _ in range(40):
                sock.sendall(b" ")
                time.sleep(0.1)
        answer = read_all(sock)
    assert time.monotonic() - started < 4.5
    assert error_of(answer) == (408, "request_timeout")
