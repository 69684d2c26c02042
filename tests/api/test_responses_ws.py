"""The Responses API over a WebSocket (``GET /v1/responses`` upgraded), end to end.

Real sockets: the ``websockets`` client for raw frames (every one validated against the
openai SDK's ``ResponsesServerEvent`` types), the openai SDK's
``client.responses.connect()``, the chaos upstream behind the gateway over HTTP. Each
``response.create`` is a run: its faults are recovered before the socket sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket as stdlib_socket
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx2
import orjson
import pytest
from openai import OpenAI
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter
from starlette.websockets import WebSocket
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from gateway.api.websocket import Channel
from gateway.chaos import ChaosUpstream, expected_answer
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
AGENT = {"store": False, "include": ["reasoning.encrypted_content"]}


def config(chaos: ChaosUpstream, **overrides: Any) -> Any:
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY}
    upstream = {"timeouts": {"connect": 2, "first_byte": 3, "idle": 0.5}}
    return gateway_config(chaos.base_url, upstream=upstream, routes=[route], **overrides)


@pytest.fixture(scope="module")
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(config(chaos)) as running:
        yield running


def ws_url(gateway: RunningGateway, path: str = "/v1/responses") -> str:
    return gateway.url.replace("http://", "ws://") + path


@pytest.fixture
def socket(gateway: RunningGateway) -> Iterator[ClientConnection]:
    with connect(ws_url(gateway), additional_headers={"authorization": "Bearer k"}) as ws:
        yield ws


def turn(ws: ClientConnection, **create: Any) -> list[dict[str, Any]]:
    """Send one response.create; every frame until its terminal one, each validated."""
    create.setdefault("input", "Tell me.")
    ws.send(json.dumps({"type": "response.create", **create}))
    frames = []
    while True:
        frame = json.loads(ws.recv(timeout=20))
        SERVER_EVENT.validate_python(frame)  # the newest SDK's own types, strictly
        frames.append(frame)
        if frame["type"] in TERMINAL:
            return frames


def text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")


def calls(frames: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    done = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    return [(i["call_id"], i["name"], i["arguments"]) for i in done if i["type"] == "function_call"]


def check_contract(frames: list[dict[str, Any]]) -> None:
    """Section 2a, frame by frame: numbered 0, 1, 2…, one response, one terminal event."""
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    types = [f["type"] for f in frames]
    assert types.count("response.created") == 1 and types[-1] == "response.completed"
    assert sum(t in TERMINAL for t in types) == 1
    assert len({f["response"]["id"] for f in frames if "response" in f}) == 1


def http_frames(gateway: RunningGateway, model: str) -> list[dict[str, Any]]:
    body = {"model": model, "input": "Tell me.", "stream": True}
    raw = httpx2.post(gateway.base_url + "/responses", json=body, timeout=20).content
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(line) for line in lines]


# -- the transport ----------------------------------------------------------------------


def test_a_turn_is_the_http_streams_events_one_frame_each_and_the_socket_stays_open(
    gateway: RunningGateway, socket: ClientConnection
) -> None:
    model = "chaos:text=20,reasoning=4,tools=1,seed=50"
    frames = turn(socket, model=model)
    check_contract(frames)
    over_http = http_frames(gateway, model)
    assert [f["type"] for f in frames] == [f["type"] for f in over_http]
    assert text(frames) == text(over_http) == expected_answer(model).text
    # The socket is open after the terminal event: the next turn goes on it.
    assert text(turn(socket, model=model)) == expected_answer(model).text


# openai 3.57's sync connect() opens its websockets 17 connection without a context
# manager, which websockets deprecated in 17.1: the SDK's warning, not the gateway's.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager")
def test_the_openai_sdks_connect_works_end_to_end(gateway: RunningGateway) -> None:
    model = "chaos:text=30,seed=51,fault=reset,at=12,times=1"
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
        with client.responses.connect() as connection:
            connection.response.create(model=model, input="Tell me.")
            deltas, final = [], None
            for event in connection:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                if event.type == "response.completed":
                    final = event.response
                    break
    assert "".join(deltas) == expected_answer(model).text
    assert final is not None and final.output_text == expected_answer(model).text


@pytest.mark.parametrize("fault", ["reset", "stall", "error", "no_finish"])
@pytest.mark.parametrize(
    "at",
    [0, 1, 2, 8, 20, 27],
    ids=[
        "before-anything",
        "first-delta",
        "mid-reasoning",
        "mid-text",
        "mid-arguments",
        "after-call",
    ],
)
def test_an_upstream_fault_never_reaches_the_socket(
    socket: ClientConnection, fault: str, at: int
) -> None:
    """Reasoning (4 deltas), text (10), one call (4 argument deltas): at every position a
    reset, stall, in-band error or truncated stream is recovered; the client gets whole
    items and one terminal event, as over HTTP."""
    model = f"chaos:text=10,reasoning=4,tools=1,arg_deltas=4,seed=52,fault={fault},at={at},times=1"
    frames = turn(socket, model=model, **AGENT)
    check_contract(frames)
    answer = expected_answer(model)
    assert text(frames) == answer.text
    assert calls(frames) == [(c.id, c.name, c.arguments) for c in answer.tool_calls]
    added = [f["item"]["type"] for f in frames if f["type"] == "response.output_item.added"]
    assert added.count("reasoning") == 1


def test_a_multi_turn_exchange_with_a_function_call_over_one_socket(
    chaos: ChaosUpstream, socket: ClientConnection
) -> None:
    """As Codex: the next turn names the last response and sends only the tool's output;
    the gateway sends the upstream the whole context (store: false, encrypted reasoning
    back), which the chaos upstream checks as OpenAI does."""
    model = "chaos:text=8,reasoning=3,tools=1,seed=53,fault=reset,at=14,times=1"
    first = turn(socket, model=model, **AGENT)
    response = first[-1]["response"]
    [(call_id, _, _)] = calls(first)
    output = {"type": "function_call_output", "call_id": call_id, "output": "42"}
    follow_up = "chaos:text=6,seed=54"
    second = turn(
        socket, model=follow_up, input=[output], previous_response_id=response["id"], **AGENT
    )
    check_contract(second)
    assert text(second) == expected_answer(follow_up).text
    [request] = chaos.requests_for(follow_up)
    sent = request.body["input"]
    assert "previous_response_id" not in request.body
    assert sent[0] == {"role": "user", "content": "Tell me."}
    assert sent[1:-1] == response["output"]  # whole, encrypted reasoning included
    assert sent[-1] == output


def test_the_handshakes_headers_go_upstream_as_an_http_requests_do(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    """Codex's ``originator``, ``session_id`` and the client's key go with every turn;
    the WebSocket's own headers and its beta flag do not (the upstream speaks HTTP)."""
    headers = {
        "authorization": "Bearer sk-client",
        "originator": "codex_exec",
        "session_id": "s-123",
        "openai-beta": "responses_websockets=2026-02-06, assistants=v2",
    }
    model = "chaos:text=3,seed=61"
    url = ws_url(gateway) + "?api-version=2025-04-01"
    with connect(url, additional_headers=headers) as ws:
        assert text(turn(ws, model=model)) == expected_answer(model).text
    [request] = chaos.requests_for(model)
    sent = request.headers
    assert sent["authorization"] == "Bearer sk-client"
    assert sent["originator"] == "codex_exec" and sent["session_id"] == "s-123"
    assert not [name for name in sent if name.startswith("sec-websocket")]
    assert sent["openai-beta"] == "assistants=v2" and "upgrade" not in sent
    assert request.query == "api-version=2025-04-01"  # as a POST's query goes upstream


def test_a_warm_up_makes_no_model_call_and_its_id_chains(
    chaos: ChaosUpstream, socket: ClientConnection
) -> None:
    """Codex's first frame: ``generate: false`` with instructions and tools."""
    model = "chaos:text=5,seed=55"
    warm = turn(socket, model=model, generate=False, instructions="Be brief.", input=[], **AGENT)
    assert [f["type"] for f in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert warm[-1]["response"]["output"] == [] and not chaos.requests_for(model)
    question = {"role": "user", "content": "Tell me."}
    frames = turn(
        socket, model=model, input=[question], previous_response_id=warm[-1]["response"]["id"]
    )
    assert text(frames) == expected_answer(model).text
    [request] = chaos.requests_for(model)
    assert request.body["input"] == [question]


def test_a_response_the_upstream_stores_stays_named_when_a_later_turn_chains_it(
    chaos: ChaosUpstream, socket: ClientConnection
) -> None:
    """A chain begun elsewhere (store on): the socket does not know its first id, which
    goes upstream; the next turn, expanded from this socket, still names it."""
    first_model, second_model = "chaos:text=3,seed=62", "chaos:text=3,seed=63"
    first = turn(socket, model=first_model, previous_response_id="resp_stored_upstream")
    [request] = chaos.requests_for(first_model)
    assert request.body["previous_response_id"] == "resp_stored_upstream"
    new = {"role": "user", "content": "And then?"}
    turn(socket, model=second_model, input=[new], previous_response_id=first[-1]["response"]["id"])
    [request] = chaos.requests_for(second_model)
    assert request.body["previous_response_id"] == "resp_stored_upstream"
    assert request.body["input"] == [
        {"role": "user", "content": "Tell me."},
        *first[-1]["response"]["output"],
        new,
    ]


def test_an_unknown_previous_response_is_not_found_under_store_false(
    socket: ClientConnection,
) -> None:
    [error] = turn(socket, model="chaos", previous_response_id="resp_elsewhere", store=False)
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    # The socket goes on.
    assert (
        text(turn(socket, model="chaos:text=3,seed=56"))
        == expected_answer("chaos:text=3,seed=56").text
    )


def test_turns_sent_the_moment_the_last_one_ended_are_all_answered(
    socket: ClientConnection,
) -> None:
    """The next create arrives while the last run's relay is still winding down (its
    terminal event sent, its log not yet closed): it waits its turn, never lost, never
    refused. Thirty in a row, chained as Codex chains them."""
    previous = None
    for number in range(30):
        model = f"chaos:text=16,seed={7000 + number}"
        chained: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        frames = turn(socket, model=model, **chained)
        assert [f["type"] for f in frames if f["type"] == "error"] == []
        assert text(frames) == expected_answer(model).text
        previous = frames[-1]["response"]["id"]


def test_a_message_taken_as_its_reader_is_cancelled_is_kept() -> None:
    """The race behind the test above, made certain (a pure unit: the socket's own
    queue, no connection): the wait for the next message is cancelled (the relay ended
    first) just after it took a message off the queue; the message is held, not lost."""

    async def race() -> str | bytes | None:
        channel = Channel(cast(WebSocket, None), send_timeout=1.0)  # its queue only
        waiting = asyncio.ensure_future(channel.next())
        await asyncio.sleep(0)  # it waits on the queue
        channel._inbox.put_nowait("next turn")
        await asyncio.sleep(0)  # the queue's reader took it; next() has not resumed yet
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return await channel.next()

    assert asyncio.run(race()) == "next turn"


def test_a_second_create_while_one_runs_gets_an_error_frame(socket: ClientConnection) -> None:
    model = "chaos:text=10,seed=57,pace_ms=40"
    socket.send(json.dumps({"type": "response.create", "model": model, "input": "Tell me."}))
    first = json.loads(socket.recv(timeout=10))
    assert first["type"] == "response.created"
    socket.send(json.dumps({"type": "response.create", "model": "chaos", "input": "Again."}))
    frames = [first]
    while frames[-1]["type"] != "response.completed":
        frames.append(json.loads(socket.recv(timeout=10)))
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["response_in_progress"]
    assert text(frames) == expected_answer(model).text


def test_bad_messages_get_error_frames_and_the_socket_stays_open(
    socket: ClientConnection,
) -> None:
    socket.send("{not json")
    assert json.loads(socket.recv(timeout=5))["error"]["code"] == "invalid_json"
    socket.send(json.dumps({"type": "response.cancel"}))
    assert json.loads(socket.recv(timeout=5))["error"]["code"] == "unsupported_event"
    [error] = turn(socket, model="chaos:no_such_key=1")  # the upstream answers 400
    assert error["type"] == "error" and error["status"] == 400
    assert "no_such_key" in error["error"]["message"]
    model = "chaos:text=3,seed=58"
    assert text(turn(socket, model=model)) == expected_answer(model).text


def test_an_upstream_error_before_the_stream_is_one_frame_with_its_status(
    socket: ClientConnection,
) -> None:
    [error] = turn(socket, model="chaos:fault=http_401")
    assert error["type"] == "error" and error["status"] == 401
    assert "headers" not in error["error"]  # not retried here: the client may
    # A 429 the gateway already retried says so, as x-should-retry does over HTTP.
    [error] = turn(socket, model="chaos:fault=http_429_retry")
    assert error["status"] == 429
    assert error["error"]["headers"]["x-should-retry"] == "false"
    assert "retry-after" in error["error"]["headers"]


# -- refused upgrades and bounds --------------------------------------------------------


def upgrade(url: str, **headers: str) -> httpx2.Response:
    return httpx2.get(
        url,
        headers={
            "upgrade": "websocket",
            "connection": "Upgrade",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            "sec-websocket-version": "13",
            **headers,
        },
    )


def test_an_upgrade_not_served_is_answered_426_so_clients_fall_back_at_once(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    refused = upgrade(gateway.url + "/v1/chat/completions")
    assert refused.status_code == 426
    assert refused.json()["error"]["code"] == "upgrade_required"
    with running_gateway(config(chaos, websocket={"enabled": False})) as off:
        refused = upgrade(off.url + "/v1/responses")
        assert refused.status_code == 426
        with pytest.raises(InvalidStatus) as raised:
            connect(ws_url(off)).close()
        assert raised.value.response.status_code == 426


def test_sockets_past_the_limit_are_refused_426_and_a_wrong_key_401(chaos: ChaosUpstream) -> None:
    settings = config(chaos, websocket={"max_connections": 1}, auth={"keys": ["gk-right"]})
    with running_gateway(settings) as running:
        with pytest.raises(InvalidStatus) as raised:
            connect(ws_url(running), additional_headers={"authorization": "Bearer gk-wrong"})
        assert raised.value.response.status_code == 401
        good = {"authorization": "Bearer gk-right"}
        with connect(ws_url(running), additional_headers=good):
            with pytest.raises(InvalidStatus) as raised:
                connect(ws_url(running), additional_headers=good)
            assert raised.value.response.status_code == 426
        # Closed: the next one is served.
        with connect(ws_url(running), additional_headers=good) as ws:
            assert text(turn(ws, model="chaos:text=2,seed=59"))


def test_a_socket_past_its_lifetime_says_so_then_closes(chaos: ChaosUpstream) -> None:
    with running_gateway(config(chaos, websocket={"max_lifetime": 0.2})) as running:
        with connect(ws_url(running)) as ws:
            time.sleep(0.3)
            [error] = turn(ws, model="chaos")
            assert error["error"]["code"] == "websocket_connection_limit_reached"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=5)


def test_an_idle_socket_is_closed(chaos: ChaosUpstream) -> None:
    with running_gateway(config(chaos, websocket={"idle_timeout": 0.2})) as running:
        with connect(ws_url(running)) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


def masked_text_frame(text: str) -> bytes:
    """One client text frame (RFC 6455: a client masks what it sends)."""
    payload, mask = text.encode(), os.urandom(4)
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2)
    return head + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))


def test_a_client_that_stops_reading_lets_go_of_its_socket(chaos: ChaosUpstream) -> None:
    """As over HTTP (``listen.send_timeout``): a socket nobody reads is given up, its
    slot, its context and its handler freed; the run goes on, detached. The client is
    raw TCP with a small receive window, which reads nothing after the handshake."""
    settings = config(chaos, listen={"send_timeout": 0.5})
    with running_gateway(settings) as running:
        registry = running.metrics.registry

        def open_sockets() -> float | None:
            return registry.get_sample_value("gateway_websockets_open")

        with stdlib_socket.socket() as sock:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(running.url.rsplit(":", 1)[1])))
            sock.sendall(
                b"GET /v1/responses HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")
            create = {"type": "response.create", "model": "chaos:text=20000,seed=64"}
            sock.sendall(masked_text_frame(json.dumps(create | {"input": "Tell me."})))
            wait_for(lambda: open_sockets() == 1, message="the socket was not counted")
            wait_for(lambda: open_sockets() == 0, timeout=20, message="still held")


def test_a_client_that_drops_mid_response_can_take_the_rest_over_http(
    gateway: RunningGateway,
) -> None:
    """The run goes on detached, as for an HTTP client that left: the rest is there at
    ``GET /v1/responses/{id}?stream=true&starting_after=N``."""
    model = "chaos:text=30,seed=60,pace_ms=20"
    with connect(ws_url(gateway), additional_headers={"authorization": "Bearer k"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": model, "input": "Tell me."}))
        frames = [json.loads(ws.recv(timeout=10)) for _ in range(8)]
    response_id = frames[0]["response"]["id"]
    last = frames[-1]["sequence_number"]
    url = f"{gateway.base_url}/responses/{response_id}"
    params = {"stream": "true", "starting_after": str(last)}
    rest = httpx2.get(url, params=params, headers={"authorization": "Bearer k"}, timeout=20)
    events = [
        orjson.loads(line[6:]) for line in rest.content.split(b"\n") if line.startswith(b"data: ")
    ]
    whole = frames + events
    assert [f["sequence_number"] for f in whole] == list(range(len(whole)))
    assert text(whole) == expected_answer(model).text
