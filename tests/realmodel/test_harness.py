"""The real-model harness itself: the proxy cuts where it is told to and nowhere else, a
killed server is gone, and the model answers the same request the same way, which is
the premise of every claim that an answer through the gateway is exact."""

from __future__ import annotations

import concurrent.futures
import socket
from typing import Any

import httpx2
import pytest

from probes.realmodel.cases import DOORS, Door, unbroken
from probes.realmodel.cut import CuttingProxy, EventCounter, How
from probes.realmodel.server import LlamaServer

PROMPT = "List five fruits, one per line."
BUDGET = 40  # tokens: a few seconds at most on one thread, and more events than any cut


def chat_body(max_tokens: int = BUDGET) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "stream": True,
    }


def raw_stream(url: str) -> tuple[bytes, httpx2.HTTPError | None]:
    """A streamed chat completion's body as received, and the error that ended it if one
    did (None: it ended whole)."""
    received = bytearray()
    try:
        with (
            httpx2.Client(timeout=30) as client,
            client.stream("POST", url + "/v1/chat/completions", json=chat_body()) as response,
        ):
            assert response.status_code == 200
            for piece in response.iter_bytes():
                received += piece
    except httpx2.HTTPError as exc:
        return bytes(received), exc
    return bytes(received), None


def test_the_event_counter_finds_terminators_split_anywhere() -> None:
    stream = b"data: 1\n\ndata: 2\n\n\ndata: 3\n\ndata: [DONE]\n\n"
    for split in range(len(stream) + 1):
        for wanted in range(5):
            counter = EventCounter()
            end = counter.feed(stream[:split], wanted)
            if end is None:
                rest = counter.feed(stream[split:], wanted)
                end = None if rest is None else split + rest
            forwarded = stream if end is None else stream[:end]
            # Exactly ``wanted`` events, the last one whole (four in all: then everything).
            assert forwarded.count(b"\n\n") == min(wanted, 4)
            assert end is None or forwarded.endswith(b"\n\n") or wanted == 0


@pytest.mark.parametrize(
    ("how", "error"), [("reset", httpx2.ReadError), ("close", httpx2.RemoteProtocolError)]
)
def test_the_proxy_cuts_after_exactly_n_events_once(
    cutting_proxy: CuttingProxy, how: How, error: type[httpx2.HTTPError]
) -> None:
    cutting_proxy.arm(5, how)
    received, raised = raw_stream(cutting_proxy.url)

    # reset: the client reads a connection reset; close: a body that stops mid-chunk.
    assert isinstance(raised, error), raised
    assert received.count(b"\n\n") == 5
    assert received.endswith(b"\n\n")
    assert cutting_proxy.cuts == 1
    assert not cutting_proxy.armed

    # One cut per arm: the next response passes whole.
    received, raised = raw_stream(cutting_proxy.url)
    assert raised is None
    assert received.endswith(b"data: [DONE]\n\n")
    assert cutting_proxy.cuts == 1


def test_an_unarmed_proxy_passes_answers_whole(
    cutting_proxy: CuttingProxy, llama_a: LlamaServer
) -> None:
    through = unbroken(cutting_proxy.url, "chat", PROMPT, BUDGET)
    direct = unbroken(llama_a.url, "chat", PROMPT, BUDGET)

    assert through == direct
    assert through.events == direct.events
    assert cutting_proxy.cuts == 0
    assert cutting_proxy.connections >= 1


def test_a_server_killed_mid_answer_is_gone(
    cutting_proxy: CuttingProxy, llama_a: LlamaServer
) -> None:
    # Killed after sending 4 events: the client has exactly those.
    cutting_proxy.arm(4, "close", on_cut=llama_a.kill)
    received, raised = raw_stream(cutting_proxy.url)
    assert isinstance(raised, httpx2.RemoteProtocolError), raised
    assert received.count(b"\n\n") == 4
    assert not llama_a.alive

    # New connections are refused by the server, and reset by the proxy in front of it.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", llama_a.port), timeout=5).close()
    received, raised = raw_stream(cutting_proxy.url)
    assert isinstance(raised, httpx2.TransportError), raised
    assert received == b""

    # Started again on the same port, it answers through the same proxy.
    llama_a.restart()
    assert unbroken(cutting_proxy.url, "chat", PROMPT, 8).text


@pytest.mark.parametrize("door", DOORS)
def test_the_same_request_gets_the_same_answer(
    door: Door, llama_a: LlamaServer, llama_b: LlamaServer
) -> None:
    """Greedy and without a prompt cache, an answer depends on its request alone: not on
    the server process, the slot, or another request decoded in the same batch."""
    first = unbroken(llama_a.url, door, PROMPT, BUDGET)
    assert first.text and first.finish
    assert first.prefix(first.events) == first.text

    assert unbroken(llama_a.url, door, PROMPT, BUDGET) == first
    assert unbroken(llama_b.url, door, PROMPT, BUDGET) == first
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both slots at once
        pair = list(pool.map(lambda _: unbroken(llama_a.url, door, PROMPT, BUDGET), range(2)))
    assert pair == [first, first]
