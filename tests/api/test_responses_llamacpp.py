"""llama.cpp's Responses dialect end to end: its recorded events, cut mid-answer.

llama.cpp's server (``llama-server``) streams ``/v1/responses`` events without
``output_index``, ``content_index`` or ``sequence_number``. Here an upstream on loopback
replays what it was recorded sending (``tests/protocols/test_responses_splice.py``):
the first answer reset after its 15th text delta, then its continuation of the text the
client has. The gateway in front, the openai SDK as the client: one answer, the first
leg's text and then the rest, and every event that says the text says that one.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.api.test_responses import Streamed, check_contract
from tests.protocols.test_responses_splice import (
    LLAMACPP_CONTINUATION,
    LLAMACPP_CUT,
    LLAMACPP_REST,
    LLAMACPP_SENT,
)
from tests.raw_upstream import _read_request, sse_head
from tests.servers import RunningGateway, gateway_config, running_gateway

ANSWER = LLAMACPP_SENT + LLAMACPP_REST
LIFECYCLE = {"response.created", "response.in_progress", "response.completed"}
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@dataclass
class Replaying:
    base_url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)  # each /responses request's


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
def llamacpp_upstream() -> Iterator[Replaying]:
    """``POST /v1/responses``: first the recorded answer up to its cut, then a TCP reset;
    then the recorded continuation, whole. Anything else (a ``GET /models``): 404."""
    listener = socket.create_server(("127.0.0.1", 0))
    upstream = Replaying(f"http://127.0.0.1:{listener.getsockname()[1]}/v1")
    lock = threading.Lock()

    def handle(conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            if request is None:
                return
            if not request.head.startswith(b"POST /v1/responses "):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            with lock:
                first = not upstream.bodies
                upstream.bodies.append(orjson.loads(request.body))
            with contextlib.suppress(OSError):
                if first:
                    conn.sendall(sse_head() + LLAMACPP_CUT)
                    _flushed(conn)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    conn.sendall(sse_head() + LLAMACPP_CONTINUATION)

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


@contextlib.contextmanager
def gateway() -> Iterator[tuple[RunningGateway, Replaying]]:
    with llamacpp_upstream() as upstream:
        config = gateway_config(
            upstream.base_url,
            # llama.cpp goes on from a trailing assistant message, as it did recorded.
            upstream={"continuation": "prefill"},
            routes=[{"match": "*", "upstream": "chaos", "retry": {"backoff_initial": 0.01}}],
        )
        with running_gateway(config) as running:
            yield running, upstream


def continued_from_the_text_sent(upstream: Replaying) -> None:
    """The second request asked for the rest of what the client had, as llama.cpp takes
    it: a typed assistant message."""
    assert len(upstream.bodies) == 2
    first, second = upstream.bodies
    assert second["input"][:-1] == [{"role": "user", "content": first["input"]}]
    assert second["input"][-1] == {"type": "message", "role": "assistant", "content": LLAMACPP_SENT}


def test_the_sdks_stream_gets_the_first_legs_text_and_the_rest() -> None:
    with gateway() as (running, upstream):
        with OpenAI(base_url=running.base_url, api_key="k", max_retries=0) as client:
            streamed = Streamed()
            with client.responses.stream(
                model="smollm2", input="Tell me about Paris.", temperature=0
            ) as stream:
                streamed.events = list(stream)
                streamed.final = stream.get_final_response()
    continued_from_the_text_sent(upstream)
    check_contract(streamed)
    assert streamed.text() == ANSWER
    assert streamed.final.status == "completed" and streamed.final.output_text == ANSWER
    [completed] = [e for e in streamed.events if e.type == "response.completed"]
    assert completed.response.output_text == ANSWER
    assert [e.text for e in streamed.events if e.type == "response.output_text.done"] == [ANSWER]


@pytest.mark.parametrize("client", ["sdk", "raw"])
def test_every_event_is_openais_shape_and_says_the_text_streamed(client: str) -> None:
    with gateway() as (running, upstream):
        if client == "sdk":
            with OpenAI(base_url=running.base_url, api_key="k", max_retries=0) as sdk:
                stream = sdk.responses.create(
                    model="smollm2", input="Tell me about Paris.", stream=True
                )
                sent = [event.model_dump(exclude_unset=True) for event in stream]
        else:
            import httpx2

            body = {"model": "smollm2", "input": "Tell me about Paris.", "stream": True}
            raw = httpx2.post(running.base_url + "/responses", json=body, timeout=20).content
            sent = [
                orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")
            ]
    continued_from_the_text_sent(upstream)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta") == ANSWER
    final = sent[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][0]["content"][0]["text"] == ANSWER
    for event in sent:
        if event["type"] not in LIFECYCLE:
            # Validated, not constructed: every index, part and field OpenAI's has. (The
            # response object is llama.cpp's, without the request's tools and choices.)
            STREAM_EVENT.validate_python(event)
        if "output_index" in event:
            assert event["output_index"] == 0
        if "content_index" in event:
            assert event["content_index"] == 0
