"""A client that stops reading stops its run's upstream read (limits.max_client_lag_bytes)."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterable

import httpx2
import orjson
import pytest

from tests.raw_upstream import RawRequest, chat_chunk, running_raw_upstream, sse_head
from tests.servers import gateway_config, running_gateway, wait_for

DELTA = "x" * 4000
DELTAS = 8000  # 32 MB of content, as fast as the sockets take it


def fast_large_answer(index: int, request: RawRequest) -> Iterable[bytes]:
    yield sse_head() + chat_chunk("", role="assistant")
    event = chat_chunk(DELTA)
    for _ in range(DELTAS // 16):
        yield event * 16
    yield chat_chunk(finish="stop") + b"data: [DONE]\n\n"


def stream_request(url: str) -> socket.socket:
    """A raw connection with a small receive buffer that asked ``url`` for a stream."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect((host, int(port)))
    body = orjson.dumps({"model": "m", "messages": [], "stream": True})
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: "
        b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def test_a_client_that_stops_reading_pauses_the_upstream_and_then_gets_everything() -> None:
    with running_raw_upstream(fast_large_answer) as upstream:
        config = gateway_config(upstream.base_url, limits={"max_client_lag_bytes": 256 * 1024})
        with running_gateway(config) as gateway:
            sock = stream_request(gateway.url)
            # The response has started; now the client reads nothing. Keep what it read:
            # the gateway may write the head and the first deltas together.
            received = bytearray(sock.recv(1024))
            wait_for(lambda: upstream.sent and upstream.sent[0] > 0)

            def paused() -> int:
                before = upstream.sent[0]
                time.sleep(0.5)
                return before if upstream.sent[0] == before else 0

            paused_at = wait_for(paused, timeout=15, message="the upstream was never paused")
            # The lag limit plus socket buffers, nowhere near the whole answer.
            assert paused_at < len(DELTA) * DELTAS // 2
            sock.settimeout(10)
            while not received.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
                part = sock.recv(1 << 20)
                assert part, "the gateway closed the stream"
                received += part
            sock.close()
    assert received.count(DELTA.encode()) == DELTAS  # nothing lost while paused
    assert b"data: [DONE]" in received[-64:]


def test_a_client_that_reads_nothing_for_the_send_timeout_is_disconnected_and_can_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running_raw_upstream(fast_large_answer) as upstream:
        config = gateway_config(
            upstream.base_url,
            listen={"send_timeout": 1.0},
            limits={"max_client_lag_bytes": 256 * 1024},
        )
        with running_gateway(config) as gateway:
            with stream_request(gateway.url) as sock:
                received = bytearray(sock.recv(1024))
                run_id = received.split(b"x-run-id: ")[1].split(b"\r\n")[0].decode()
                time.sleep(3)  # reads nothing: disconnected after send_timeout
                sock.settimeout(10)
                with contextlib.suppress(ConnectionResetError):
                    while part := sock.recv(1 << 20):
                        received += part
            # Cut off: what the socket buffers held, then the end of the connection,
            # not of the body.
            assert not received.endswith(b"\r\n0\r\n\r\n")
            assert received.count(DELTA.encode()) < DELTAS // 2
            # The run went on without it, to the end; its client resumes it whole.
            rest = httpx2.get(
                f"{gateway.base_url}/runs/{run_id}/events",
                headers={"last-event-id": "0"},
                timeout=30,
            )
    assert rest.status_code == 200
    assert rest.content.count(DELTA.encode()) == DELTAS
    assert rest.content.endswith(b"data: [DONE]\n\n")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
