"""Each fault, seen from an httpx client on a real socket."""

from __future__ import annotations

import json
import time

import httpx2
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos.answer import script_for
from gateway.chaos.spec import parse_spec

from .helpers import USER, collect, first_deltas, stream


@pytest.mark.parametrize("at", [0, 1, 7, 20])
def test_reset_is_a_read_error_after_exactly_at_deltas(client: httpx2.Client, at: int) -> None:
    spec = f"chaos:fault=reset,at={at}"
    received = stream(client, spec)
    # ECONNRESET surfaces as ReadError; httpx reports a RemoteProtocolError instead
    # if it notices the closed socket between reads.
    assert isinstance(received.error, httpx2.ReadError | httpx2.RemoteProtocolError)
    collected = received.collect()
    assert collected.text == first_deltas(spec, at)
    assert collected.finish_reasons == []
    assert collected.roles == ["assistant"]


def test_reset_without_at_fires_half_way(client: httpx2.Client) -> None:
    received = stream(client, "chaos:text=10,fault=reset")
    assert received.error is not None
    assert received.collect().text == first_deltas("chaos:text=10", 5)


def test_close_is_an_incomplete_chunked_read(client: httpx2.Client) -> None:
    spec = "chaos:fault=close,at=4"
    received = stream(client, spec)
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    assert "incomplete chunked read" in str(received.error)
    assert received.collect().text == first_deltas(spec, 4)


def test_stall_is_a_read_timeout(upstream: ChaosUpstream) -> None:
    spec = "chaos:fault=stall,at=3"
    timeout = httpx2.Timeout(10, read=0.3)
    with httpx2.Client(base_url=upstream.base_url, timeout=timeout) as client:
        started = time.monotonic()
        received = stream(client, spec)
    assert isinstance(received.error, httpx2.ReadTimeout)
    assert time.monotonic() - started < 5
    assert received.collect().text == first_deltas(spec, 3)


def test_stall_ends_with_a_close_after_stall_s(client: httpx2.Client) -> None:
    started = time.monotonic()
    received = stream(client, "chaos:fault=stall,at=2,stall_s=0.3")
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize(
    ("fault", "code", "done"),
    [
        ("error", 503, False),
        ("error_done", 503, True),
        ("error_fatal", "content_policy_violation", False),
    ],
)
def test_in_band_errors_end_the_body_cleanly(
    client: httpx2.Client, fault: str, code: object, done: bool
) -> None:
    spec = f"chaos:fault={fault},at=5"
    received = stream(client, spec)
    assert received.error is None
    collected = received.collect()
    assert collected.text == first_deltas(spec, 5)
    [error] = collected.errors
    assert error["code"] == code
    assert collected.finish_reasons == []
    assert (received.data[-1] == "[DONE]") is done
    assert json.loads(received.data[-1 - done])["error"] == error


def test_finish_error(client: httpx2.Client) -> None:
    received = stream(client, "chaos:fault=finish_error,at=3")
    assert received.error is None
    assert received.collect().finish_reasons == ["error"]
    assert received.collect().text == first_deltas("chaos", 3)
    assert received.data[-1] == "[DONE]"


@pytest.mark.parametrize("done", [1, 0])
def test_no_finish_truncates_cleanly(client: httpx2.Client, done: int) -> None:
    received = stream(client, f"chaos:fault=no_finish,at=6,done={done}")
    assert received.error is None
    assert received.collect().finish_reasons == []
    assert received.collect().text == first_deltas("chaos", 6)
    assert (received.data[-1] == "[DONE]") is bool(done)


def test_malformed_event_then_the_rest_of_the_stream(client: httpx2.Client) -> None:
    received = stream(client, "chaos:fault=malformed,at=2")
    data = received.data
    assert data[3] == '{"choices": ['
    with pytest.raises(json.JSONDecodeError):
        json.loads(data[3])
    without = [item for item in data if item != '{"choices": [']
    assert collect(without).text == expected_answer("chaos").text
    assert data[-1] == "[DONE]"


def test_at_counts_reasoning_and_tool_fragments(client: httpx2.Client) -> None:
    # Content deltas: three reasoning, two text, then (after the call's header) four fragments.
    spec = "chaos:reasoning=3,text=2,tools=1,arg_deltas=4,fault=close"
    answer = expected_answer(spec)
    collected = stream(client, f"{spec},at=4").collect()
    assert (collected.reasoning, collected.text) == (answer.reasoning, first_deltas(spec, 1))
    assert collected.tool_calls == {}
    collected = stream(client, f"{spec},at=7").collect()
    assert collected.content_deltas == 7
    assert collected.text == answer.text
    fragments = [
        json.loads(b'{"d":' + body + b"}")["d"]["tool_calls"][0]["function"]["arguments"]
        for body in script_for(parse_spec(spec)).tool_bodies[1:]
    ]
    assert collected.tool_calls[0]["arguments"] == "".join(fragments[:2])
    assert collected.tool_calls[0]["id"] == answer.tool_calls[0].id


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        ("http_400", 400, None),
        ("http_400_context", 400, "context_length_exceeded"),
        ("http_401", 401, "invalid_api_key"),
        ("http_404", 404, "model_not_found"),
        ("http_429", 429, "rate_limit_exceeded"),
        ("http_500", 500, None),
        ("http_502", 502, None),
        ("http_503", 503, None),
        ("http_529", 529, None),
    ],
)
def test_http_faults_answer_an_error_status(
    client: httpx2.Client, fault: str, status: int, code: str | None
) -> None:
    for stream_flag in (True, False):
        body = {"model": f"chaos:fault={fault}", "messages": [USER], "stream": stream_flag}
        response = client.post("/chat/completions", json=body)
        assert response.status_code == status
        assert response.headers["content-type"] == "application/json"
        assert "retry-after" not in response.headers
        error = response.json()["error"]
        assert error["code"] == code
        assert error["message"] and error["type"]


def test_http_429_retry_carries_retry_after(client: httpx2.Client) -> None:
    for spec, expected in (
        ("chaos:fault=http_429_retry", "1"),
        ("chaos:fault=http_429_retry,retry_after=7", "7"),
    ):
        response = client.post("/chat/completions", json={"model": spec, "stream": True})
        assert response.status_code == 429
        assert response.headers["retry-after"] == expected


def test_reset_before_any_byte(client: httpx2.Client) -> None:
    with pytest.raises((httpx2.ReadError, httpx2.RemoteProtocolError)):
        client.post("/chat/completions", json={"model": "chaos:fault=reset_before", "stream": True})
    assert client.post("/chat/completions", json={"model": "chaos"}).status_code == 200


def test_times_faults_only_the_first_requests(client: httpx2.Client) -> None:
    spec = "chaos:text=6,fault=reset,at=2,times=2"
    assert stream(client, spec).error is not None
    assert stream(client, spec).error is not None
    clean = stream(client, spec)
    assert clean.error is None
    assert clean.collect().text == expected_answer(spec).text
    # Counted per exact spec string: another spelling is faulted afresh.
    assert stream(client, "chaos:fault=reset,text=6,at=2,times=2").error is not None


def test_times_zero_never_faults(client: httpx2.Client) -> None:
    assert stream(client, "chaos:fault=close,times=0").error is None


def test_first_byte_delay_precedes_an_http_fault(client: httpx2.Client) -> None:
    started = time.monotonic()
    response = client.post(
        "/chat/completions", json={"model": "chaos:fault=http_503,first_byte_ms=150"}
    )
    assert response.status_code == 503
    assert time.monotonic() - started >= 0.15
